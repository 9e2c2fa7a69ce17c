"""cuGraphDebugDotPrint in the sim: a DOT file of a graph's structure, like the driver's (one
box per node with its type and what it runs, edges from dependency to dependent, child
graphs and conditional bodies as clusters). The layout differs from the driver's; the
flags are accepted and only CU_GRAPH_DEBUG_DOT_FLAGS_HANDLES adds something (node handles)."""

from __future__ import annotations

import os

from cuda.bindings.driver import CUgraphDebugDot_flags, CUresult

from ._cargs import unsigned
from ._common import INVALID_VALUE, OK
from ._graph_nodes import ChildWork

HANDLES = int(CUgraphDebugDot_flags.CU_GRAPH_DEBUG_DOT_FLAGS_HANDLES)
OPERATING_SYSTEM = CUresult.CUDA_ERROR_OPERATING_SYSTEM


def _describe(node, handles: bool) -> str:
    work = node.work
    text = node.type.name.removeprefix("CU_GRAPH_NODE_TYPE_")
    launch = getattr(work, "launch", None)
    if launch is not None:
        text += f"\\n{launch.kernel.name}\\ngrid {launch.grid} block {launch.block}"
    elif hasattr(work, "nbytes"):
        text += f"\\n{work.nbytes} bytes"
    elif hasattr(work, "kind"):
        text += f"\\n{work.kind.name.removeprefix('CU_GRAPH_COND_TYPE_')}"
    if handles:
        text += f"\\n{node.handle:#x}"
    return text


def _lines(graph, prefix: str, handles: bool, out: list[str]) -> None:
    names = {}
    for i, node in enumerate(graph.nodes):
        names[id(node)] = name = f"{prefix}n{i}"
        out.append(f'  {name} [shape=box, label="{_describe(node, handles)}"];')
        inner = (
            [node.work.graph]
            if isinstance(node.work, ChildWork)
            else list(getattr(node.work, "bodies", ()))
        )
        for j, body in enumerate(inner):
            out.append(f'  subgraph cluster_{name}_{j} {{ label="{name} body {j}";')
            _lines(body, f"{name}_{j}_", handles, out)
            out.append("  }")
    for node in graph.nodes:
        for dep in node.deps:
            out.append(f"  {names[id(dep)]} -> {names[id(node)]};")


class GraphDotModel:
    """cuGraphDebugDotPrint."""

    def cuGraphDebugDotPrint(self, hGraph, path, flags):
        flags = unsigned(flags, 32, "unsigned int")
        graph = self._graph(hGraph)
        if graph is None or path is None:
            return (INVALID_VALUE,)  # (an empty path is the file error below, as on driver 580)
        out = [f"digraph graph_{graph.handle:#x} {{"]
        with self._lock:
            _lines(graph, "", bool(flags & HANDLES), out)
        out.append("}")
        try:
            with open(os.fsdecode(path), "w") as file:
                file.write("\n".join(out) + "\n")
        except OSError:
            return (OPERATING_SYSTEM,)
        return (OK,)
