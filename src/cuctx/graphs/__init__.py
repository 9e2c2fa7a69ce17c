"""CUDA graphs: explicit graphs (`Graph`, its `GraphNode`s) and their executables
(`GraphExec`), built with the same checks as eager work. See docs/graphs.md."""

from __future__ import annotations

from ._exec import GraphExec
from ._graph import Graph, GraphNode

__all__ = ["Graph", "GraphExec", "GraphNode"]
