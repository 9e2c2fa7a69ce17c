"""CUDA graphs: explicit graphs (`Graph`, its `GraphNode`s) and their executables
(`GraphExec`), built with the same checks as eager work. See docs/graphs.md."""

from __future__ import annotations

from ._autograph import AutoGraph, autograph
from ._exec import GraphExec
from ._graph import Graph
from ._graph_node import GraphNode
from . import _capture  # noqa: F401 - installs Stream.capture and the checks of captures

__all__ = ["AutoGraph", "Graph", "GraphExec", "GraphNode", "autograph"]
