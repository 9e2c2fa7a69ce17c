"""cuGraphExecUpdate in the sim: the documented rules, node by node.

Nodes are paired in creation order (a graph captured or built by the same code twice pairs
node for node), level by level: a child graph node's graph and a conditional node's bodies
are paired the same way inside. Any of these differences refuses the whole update (nothing
changes):

- another count of nodes, another number of dependencies, a dependency paired with another
  node, another node type;
- kernel: the function's context changed (function, configuration and arguments may change);
- memcpy: a memory type or an operand's device changed, or a 1D copy became 2D (H100);
- memset: the device changed, or its shape (1D to 2D, or a 2D memset's width, element size
  or pitch); a 1D memset may change its width and element size (H100);
- memory alloc and free nodes: another allocation;
- conditional: another type or body count;
- host, empty, event record and wait nodes: anything may change.

A refusal is CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE with no result info, and a bad handle
CUDA_ERROR_INVALID_VALUE with none: cuda.bindings returns the CUgraphExecUpdateResultInfo
only on success (measured on an H100), so which node and why are never visible through it
(cuctx names them itself, graphs/_update.py). After a successful update each of the
executable's nodes takes its partner's work (inside child graphs and bodies too; a
conditional node takes its partner's handle), keeps whether it is enabled, and is also found
by its partner's handle.
"""

from __future__ import annotations

from cuda.bindings.driver import CUgraphExecUpdateResult, CUgraphExecUpdateResultInfo, CUgraphNode

from ._common import GRAPH_EXEC_UPDATE_FAILURE, INVALID_VALUE, OK
from ._graph_exec import copy_update_ok, kernel_update_ok, memset_update_ok
from ._graph_memory import AllocWork, FreeWork
from ._graph_nodes import ChildWork, CopyWork, KernelWork, MemsetWork


class _Refused(Exception):
    pass


def _pairs(old_graph, new_graph):
    """[(old node, new node)] for the whole tree, or _Refused at the first difference."""
    if len(old_graph.nodes) != len(new_graph.nodes):
        raise _Refused
    where = {id(n): i for i, n in enumerate(new_graph.nodes)}
    where_old = {id(n): i for i, n in enumerate(old_graph.nodes)}
    pairs = []
    for old, new in zip(old_graph.nodes, new_graph.nodes):
        if (
            len(old.deps) != len(new.deps)
            or old.type != new.type
            or any(where_old[id(a)] != where[id(b)] for a, b in zip(old.deps, new.deps))
            or not _node_ok(old.work, new.work)
        ):
            raise _Refused
        pairs.append((old, new))
        old_inner, new_inner = _inner(old), _inner(new)
        if len(old_inner) != len(new_inner):
            raise _Refused
        for a, b in zip(old_inner, new_inner):
            pairs += _pairs(a, b)
    return pairs


def _inner(node):
    if isinstance(node.work, ChildWork):
        return [node.work.graph]
    return list(getattr(node.work, "bodies", ()))


def _node_ok(old, new) -> bool:
    if isinstance(old, KernelWork):
        return kernel_update_ok(old, new)
    if isinstance(old, CopyWork):
        return copy_update_ok(old, new)
    if isinstance(old, MemsetWork):
        return memset_update_ok(old, new)
    if isinstance(old, (AllocWork, FreeWork)):
        return old.block is new.block
    if hasattr(old, "bodies"):
        return old.kind == new.kind
    return True


def _success() -> CUgraphExecUpdateResultInfo:
    info = CUgraphExecUpdateResultInfo()
    info.result = CUgraphExecUpdateResult.CU_GRAPH_EXEC_UPDATE_SUCCESS
    info.errorNode = info.errorFromNode = CUgraphNode(0)
    return info


class GraphUpdateModel:
    """cuGraphExecUpdate."""

    def cuGraphExecUpdate(self, hGraphExec, hGraph):
        with self._lock:
            exe, graph = self._graph_exec(hGraphExec), self._graph(hGraph)
            if exe is None or graph is None:
                return (INVALID_VALUE, None)
            try:
                pairs = _pairs(exe.graph, graph)
            except _Refused:
                return (GRAPH_EXEC_UPDATE_FAILURE, None)
            for old, new in pairs:  # child graphs and bodies are updated node by node
                if hasattr(new.work, "bodies"):
                    old.work = new.work.with_bodies(old.work.bodies)
                elif not isinstance(new.work, ChildWork):
                    old.work = new.work
                if exe.nodes.get(old.handle) is old:
                    exe.nodes.setdefault(new.handle, old)
            return (OK, _success())
