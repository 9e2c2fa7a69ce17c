"""Graph executables: `GraphExec` (work in progress)."""

from __future__ import annotations


class GraphExec:
    """An instantiated `Graph`."""

    __slots__ = ("_backend", "_ctx", "_handle", "_key", "__weakref__")
