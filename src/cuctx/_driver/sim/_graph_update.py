"""cuGraphExecUpdate in the sim: the documented rules, node by node.

Nodes are paired in creation order (a graph captured or built by the same code twice pairs
node for node), level by level: a child graph node's graph and a conditional node's bodies
are paired the same way inside. The first difference found refuses the whole update
(nothing changes; CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE and the result info), in this order
for each pair, as the driver documents its results:

- another count of nodes: TOPOLOGY_CHANGED, no error node (at the top level; inside a child
  graph or a body, the node holding it);
- another number of dependencies, or a dependency paired with another node:
  TOPOLOGY_CHANGED, the node (and, for the second, the dependency as errorFromNode);
- another node type: NODE_TYPE_CHANGED;
- kernel: the function's context changed: UNSUPPORTED_FUNCTION_CHANGE (function,
  configuration and arguments may change);
- memcpy: a memory type or an operand's device changed: PARAMETERS_CHANGED;
- memset: the device changed, a 2D memset's shape changed, a 1D memset's height changed or
  its bytes grew beyond the node's when instantiated: PARAMETERS_CHANGED (the sim's
  reading of "may fail if the resulting operation doesn't map onto the work resources
  already allocated");
- memory alloc and free nodes: another allocation: NOT_SUPPORTED;
- conditional: another type or body count: PARAMETERS_CHANGED;
- host, empty, event record and wait nodes: anything may change.

Error nodes are nodes of the graph passed in. After a successful update each of the
executable's nodes takes its partner's work (inside child graphs and bodies too; a
conditional node takes its partner's handle), keeps whether it is enabled, and is also found
by its partner's handle.
"""

from __future__ import annotations

from cuda.bindings.driver import (CUgraphExecUpdateResult, CUgraphExecUpdateResultInfo,
                                  CUgraphNode)

from ._common import GRAPH_EXEC_UPDATE_FAILURE, INVALID_VALUE, OK
from ._graph_exec import copy_update_ok, kernel_update_ok, memset_update_ok
from ._graph_memory import AllocWork, FreeWork
from ._graph_nodes import ChildWork, CopyWork, KernelWork, MemsetWork

U = CUgraphExecUpdateResult


class _Refused(Exception):
    def __init__(self, result, node=None, source=None):
        self.result = result
        self.node = node
        self.source = source


def _pairs(old_graph, new_graph, holder, origin):
    """[(old node, new node)] for the whole tree, or _Refused at the first difference."""
    if len(old_graph.nodes) != len(new_graph.nodes):
        raise _Refused(U.CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED, holder)
    where = {id(n): i for i, n in enumerate(new_graph.nodes)}
    where_old = {id(n): i for i, n in enumerate(old_graph.nodes)}
    pairs = []
    for old, new in zip(old_graph.nodes, new_graph.nodes):
        if len(old.deps) != len(new.deps):
            raise _Refused(U.CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED, new)
        for old_dep, new_dep in zip(old.deps, new.deps):
            if where_old[id(old_dep)] != where[id(new_dep)]:
                raise _Refused(U.CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED, new, new_dep)
        if old.type != new.type:
            raise _Refused(U.CU_GRAPH_EXEC_UPDATE_ERROR_NODE_TYPE_CHANGED, new)
        result = _node_refusal(origin.get(id(old), old.work), new.work)
        if result is not None:
            raise _Refused(result, new)
        pairs.append((old, new))
        old_inner, new_inner = _inner(old), _inner(new)
        if len(old_inner) != len(new_inner):
            raise _Refused(U.CU_GRAPH_EXEC_UPDATE_ERROR_PARAMETERS_CHANGED, new)
        for a, b in zip(old_inner, new_inner):
            pairs += _pairs(a, b, new, origin)
    return pairs


def _inner(node):
    if isinstance(node.work, ChildWork):
        return [node.work.graph]
    return list(getattr(node.work, "bodies", ()))


def _node_refusal(old, new):
    if isinstance(old, KernelWork):
        return None if kernel_update_ok(old, new) \
            else U.CU_GRAPH_EXEC_UPDATE_ERROR_UNSUPPORTED_FUNCTION_CHANGE
    if isinstance(old, CopyWork):
        return None if copy_update_ok(old, new) else U.CU_GRAPH_EXEC_UPDATE_ERROR_PARAMETERS_CHANGED
    if isinstance(old, MemsetWork):
        return None if memset_update_ok(old, new) \
            else U.CU_GRAPH_EXEC_UPDATE_ERROR_PARAMETERS_CHANGED
    if isinstance(old, (AllocWork, FreeWork)):
        return None if old.block is new.block else U.CU_GRAPH_EXEC_UPDATE_ERROR_NOT_SUPPORTED
    if hasattr(old, "bodies"):
        return None if old.kind == new.kind \
            else U.CU_GRAPH_EXEC_UPDATE_ERROR_PARAMETERS_CHANGED
    return None


def _info(result, node=None, source=None) -> CUgraphExecUpdateResultInfo:
    info = CUgraphExecUpdateResultInfo()
    info.result = result
    info.errorNode = CUgraphNode(node.handle if node is not None else 0)
    info.errorFromNode = CUgraphNode(source.handle if source is not None else 0)
    return info


class GraphUpdateModel:
    """cuGraphExecUpdate."""

    def cuGraphExecUpdate(self, hGraphExec, hGraph):
        with self._lock:
            exe, graph = self._graph_exec(hGraphExec), self._graph(hGraph)
            if exe is None or graph is None:
                return (INVALID_VALUE, _info(U.CU_GRAPH_EXEC_UPDATE_ERROR))
            try:
                pairs = _pairs(exe.graph, graph, None, exe.origin)
            except _Refused as refusal:
                return (GRAPH_EXEC_UPDATE_FAILURE,
                        _info(refusal.result, refusal.node, refusal.source))
            for old, new in pairs:  # child graphs and bodies are updated node by node
                if hasattr(new.work, "bodies"):
                    old.work = new.work.with_bodies(old.work.bodies)
                elif not isinstance(new.work, ChildWork):
                    old.work = new.work
                if exe.nodes.get(old.handle) is old:
                    exe.nodes.setdefault(new.handle, old)
            return (OK, _info(U.CU_GRAPH_EXEC_UPDATE_SUCCESS))
