"""Graph definitions: `Graph` and its `GraphNode`s (work in progress)."""

from __future__ import annotations


class GraphNode:
    """One node of a `Graph`."""

    __slots__ = ("graph", "kind", "_handle", "__weakref__")


class Graph:
    """An explicit CUDA graph in the current context."""

    __slots__ = ("_backend", "_ctx", "_handle", "_key", "__weakref__")
