"""Why an executable refused an update, in words, with the node to blame.

cuGraphExecUpdate says which node and why (CUgraphExecUpdateResultInfo), but cuda.bindings
returns that record only on success (measured on an H100: a refusal comes back as ``(910,
None)``). So where the driver's answer is missing, cuctx finds the node itself by comparing
the executable's graph with the new one the way the driver pairs them (docs of
cuGraphExecUpdate): the node count, each node's kind by position, each node's dependencies,
then the per-kind rules cuctx can see (a kernel of another context, copy or fill memory of
another kind or context, inside child graphs too).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cuda.bindings.driver import CUgraphExecUpdateResult

from ..memory._alloc import in_host_pool
from ..memory._array import DeviceArray

if TYPE_CHECKING:
    from ._graph import Graph
    from ._graph_node import GraphNode

_R = CUgraphExecUpdateResult
ERROR = int(_R.CU_GRAPH_EXEC_UPDATE_ERROR)
TOPOLOGY = int(_R.CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED)
NODE_TYPE = int(_R.CU_GRAPH_EXEC_UPDATE_ERROR_NODE_TYPE_CHANGED)
PARAMETERS = int(_R.CU_GRAPH_EXEC_UPDATE_ERROR_PARAMETERS_CHANGED)
FUNCTION = int(_R.CU_GRAPH_EXEC_UPDATE_ERROR_UNSUPPORTED_FUNCTION_CHANGE)

# The driver's reasons for refusing an update (CUgraphExecUpdateResult), in words.
UPDATE_REASONS = {
    ERROR: "the driver gave no reason cuctx can name (an invalid value, or a change it found "
    "unsupported); instantiate the new graph instead",
    TOPOLOGY: "the structure changed: the graphs differ in their nodes or in the dependencies "
    "between them, so the update has nothing to pair; instantiate the new graph instead",
    NODE_TYPE: "the node is of another kind than the executable's node at its place (a copy where "
    "a kernel was, say)",
    int(
        _R.CU_GRAPH_EXEC_UPDATE_ERROR_FUNCTION_CHANGED
    ): "the kernel node runs another kernel, which this driver cannot change",
    PARAMETERS: "its parameters changed in a way an update cannot make (memory of another kind, "
    "context or device, another copy shape, ...)",
    int(
        _R.CU_GRAPH_EXEC_UPDATE_ERROR_NOT_SUPPORTED
    ): "this kind of node, or this change to it, cannot be updated (memory nodes, "
    "conditional nodes' parameters, ...)",
    FUNCTION: "the kernel changed to one the executable cannot run in its place (one of another "
    "context, or one using dynamic parallelism or device-side graph calls the first did "
    "not)",
    int(
        _R.CU_GRAPH_EXEC_UPDATE_ERROR_ATTRIBUTES_CHANGED
    ): "the node's attributes changed in a way an update cannot make (its priority, with "
    "instantiate(priority=True), or its cluster shape)",
}


def refusal(old: Graph, new: Graph, info) -> tuple[int, GraphNode | None, GraphNode | None]:
    """(CUgraphExecUpdateResult, the node of ``new`` to blame, its mismatched dependency)
    for a refused update of an executable of ``old`` with ``new``: the driver's own answer
    where cuda.bindings gives it, else cuctx's diagnosis."""
    if info is not None and int(info.result) not in (0, ERROR):
        return int(info.result), new._node(info.errorNode), new._node(info.errorFromNode)
    return diagnose(old, new)


def diagnose(old: Graph, new: Graph) -> tuple[int, GraphNode | None, GraphNode | None]:
    """What the driver's pairing of ``new`` with ``old`` finds first (ERROR: nothing)."""
    a, b = old._nodes, new._nodes
    if len(a) != len(b):
        return TOPOLOGY, None, None
    for x, y in zip(a, b):
        if x.kind != y.kind:
            return NODE_TYPE, y, None
    before, after = _dependencies(old), _dependencies(new)
    for j, y in enumerate(b):
        was, now = before.get(j, set()), after.get(j, set())
        if was != now:
            added = sorted(now - was)
            return TOPOLOGY, y, b[added[0]] if added else None
    for x, y in zip(a, b):
        result = _changed(x, y)
        if result != ERROR:
            return result, y, None
    return ERROR, None, None


def _dependencies(graph: Graph) -> dict[int, set[int]]:
    """Each node's dependencies, by position in the graph's node order."""
    position = {node: i for i, node in enumerate(graph._nodes)}
    deps: dict[int, set[int]] = {}
    for a, b in graph.edges:
        deps.setdefault(position[b], set()).add(position[a])
    return deps


def _changed(x: GraphNode, y: GraphNode) -> int:
    """The per-kind rule a change from ``x`` to ``y`` breaks, as far as cuctx can see."""
    if x.kind == "kernel" and x._kernel is not None and y._kernel is not None:
        if x._kernel._ctx is not y._kernel._ctx:  # a module's kernel: another context
            return FUNCTION
    elif x.kind in ("copy", "fill"):
        for p, q in zip(x._keep, y._keep):
            on_device = isinstance(p, DeviceArray)
            if on_device != isinstance(q, DeviceArray):
                return PARAMETERS  # a host side became a device side, or back
            if on_device and p._ctx is not q._ctx:
                return PARAMETERS
            if on_device and x.kind == "copy" and in_host_pool(p) != in_host_pool(q):
                return PARAMETERS  # a host pool's side is another memory type (unified)
    elif x.kind == "child" and x._extra is not None and y._extra is not None:
        return diagnose(x._extra, y._extra)[0]
    return ERROR
