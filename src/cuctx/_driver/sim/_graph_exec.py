"""Executable graphs of the sim: cuGraphInstantiate, cuGraphLaunch, cuGraphUpload,
cuGraphExecDestroy, enabling nodes, and the per-node parameter updates.

An executable holds its own copy of the graph's tree (nodes keep the handles of the nodes
they were made from, so the driver's calls that name "the node in the graph it was
instantiated from" find them), sharing the works, which are never changed in place: a
set-params call gives the executable's node a new work, so launches already queued keep
theirs. A launch runs through the stream engine: it queues one operation per node on the
stream, in a dependency order of the graph (`_graphs.order`), child graphs inlined where
their node stands. The nodes of one launch therefore run one after the other on the
virtual clock, each for what its eager counterpart costs, ordered after the stream's earlier
work and before its later work, as the driver orders a launch. Event record nodes move the
event's marker to their place in the launch; event wait nodes wait for the marker the
event has when the graph is launched; a disabled node queues an empty operation (only
kernel, memset and memcpy nodes can be disabled: the driver's documented list, which the
H100 enforces with CUDA_ERROR_INVALID_VALUE). A graph with memory nodes has one executable
at a time: a second cuGraphInstantiate is CUDA_ERROR_NOT_SUPPORTED (H100). What a capture
refuses of these calls is `_capture_ops`'s: a launch or an upload onto a capturing stream,
and cuGraphInstantiate while a capture forbids the calling thread potentially unsafe calls.
"""

from __future__ import annotations

import itertools

from cuda.bindings.driver import (
    CUDA_HOST_NODE_PARAMS,
    CUgraphExec,
    CUgraphInstantiate_flags,
    CUgraphNodeType,
)

from ._cargs import unsigned
from ._common import CONTEXT_IS_DESTROYED, INVALID_VALUE, NOT_INITIALIZED, NOT_SUPPORTED, OK
from ._graph_nodes import ChildWork, copy_work, kernel_work, memset_work
from ._graphs import MEMORY_NODES, SimGraph, SimNode, host_work, inner_graphs, order
from ._timing import KERNEL, LAUNCH_NS

T = CUgraphNodeType
F = CUgraphInstantiate_flags
AUTO_FREE = int(F.CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH)
DEVICE_LAUNCH = int(F.CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH)
NODE_PRIORITY = int(F.CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY)
_DEVICE_LAUNCH_TYPES = (
    T.CU_GRAPH_NODE_TYPE_KERNEL,
    T.CU_GRAPH_NODE_TYPE_MEMCPY,
    T.CU_GRAPH_NODE_TYPE_MEMSET,
    T.CU_GRAPH_NODE_TYPE_GRAPH,
    T.CU_GRAPH_NODE_TYPE_EMPTY,
)
# The nodes cuGraphNodeSetEnabled / GetEnabled take.
_CAN_DISABLE = (
    T.CU_GRAPH_NODE_TYPE_KERNEL,
    T.CU_GRAPH_NODE_TYPE_MEMSET,
    T.CU_GRAPH_NODE_TYPE_MEMCPY,
)


class SimGraphExec:
    __slots__ = ("handle", "graph", "source", "flags", "nodes", "disabled", "last")

    def __init__(self, handle: int, graph: SimGraph, source: SimGraph, flags: int):
        self.handle = handle
        self.graph = graph  # the executable's own tree
        self.source = source  # the graph it was instantiated from (for its memory nodes)
        self.flags = flags
        self.nodes: dict[int, SimNode] = {}  # source node handle -> the executable's node
        self.disabled: set[int] = set()  # ids of disabled nodes of the executable
        self.last = None  # the last operation its latest launch queued

    def index(self, graph: SimGraph) -> None:
        """Make the nodes of ``graph`` (the executable's tree) findable by handle: the top
        level and conditional bodies, not the inside of child graphs (those have their own
        set-params calls in the driver)."""
        for node in graph.nodes:
            self.nodes[node.handle] = node
            if not isinstance(node.work, ChildWork):
                for body in inner_graphs(node):
                    self.index(body)


def copy_tree(graph: SimGraph, owner=None) -> SimGraph:
    """An unregistered copy of ``graph`` whose nodes keep their handles (an executable's)."""
    copy = SimGraph(graph.handle, owner)
    mapped = {}
    for node in graph.nodes:
        new = SimNode(node.handle, copy, node.work, [mapped[id(d)] for d in node.deps])
        if isinstance(node.work, ChildWork):
            new.work = ChildWork(copy_tree(node.work.graph, new))
        elif hasattr(node.work, "bodies"):
            new.work = node.work.with_bodies([copy_tree(b, new) for b in node.work.bodies])
        copy.nodes.append(new)
        mapped[id(node)] = new
    return copy


class GraphExecModel:
    """cuGraphInstantiate, cuGraphLaunch, cuGraphUpload, cuGraphExecDestroy,
    cuGraphNodeSetEnabled/GetEnabled, cuGraphExec{Kernel,Memcpy,Memset,Host}NodeSetParams."""

    def _init_graph_execs(self):
        self._exec_handles = itertools.count(0x6EEC_0000_0100, 0x100)
        self._graph_execs: dict[int, SimGraphExec] = {}

    def _graph_exec(self, hGraphExec) -> SimGraphExec | None:
        return self._graph_execs.get(int(hGraphExec or 0))

    def cuGraphInstantiate(self, hGraph, flags):
        if not self._initialized:
            return (NOT_INITIALIZED, None)
        flags = unsigned(flags, 64, "unsigned long long")
        with self._lock:
            graph = self._graph(hGraph)
            if (
                graph is None
                or flags & ~(AUTO_FREE | DEVICE_LAUNCH | NODE_PRIORITY)
                or (flags & AUTO_FREE and flags & DEVICE_LAUNCH)
            ):
                return (INVALID_VALUE, None)
            nodes = list(graph.walk())
            has_memory = any(n.type in MEMORY_NODES for n in nodes)
            if has_memory and graph.execs:
                return (NOT_SUPPORTED, None)  # one executable at a time for memory nodes
            if flags & DEVICE_LAUNCH and not self._device_launchable(nodes):
                return (INVALID_VALUE, None)
            err = self._check_instantiable(graph)
            if err:
                return (err, None)
            exe = SimGraphExec(next(self._exec_handles), copy_tree(graph), graph, flags)
            exe.index(exe.graph)
            graph.execs += 1
            self._graph_execs[exe.handle] = exe
            return (OK, CUgraphExec(exe.handle))

    def _check_instantiable(self, graph: SimGraph):
        """What later models refuse at instantiation (conditional handles); OK here."""
        return OK

    @staticmethod
    def _device_launchable(nodes: list[SimNode]) -> bool:
        contexts = {id(n.work.ctx) for n in nodes if n.work.ctx is not None}
        return (
            bool(nodes)
            and len(contexts) <= 1
            and all(n.type in _DEVICE_LAUNCH_TYPES for n in nodes)
            and any(n.type != T.CU_GRAPH_NODE_TYPE_EMPTY for n in nodes)
        )

    def cuGraphExecDestroy(self, hGraphExec):
        with self._lock:
            exe = self._graph_execs.pop(int(hGraphExec or 0), None)
            if exe is None:
                return (INVALID_VALUE,)
            exe.source.execs -= 1
        return (OK,)

    def cuGraphUpload(self, hGraphExec, hStream):
        with self._lock:
            return (self._exec_on(hGraphExec, hStream)[0],)

    def cuGraphLaunch(self, hGraphExec, hStream):
        with self._lock:
            err, exe, stream = self._exec_on(hGraphExec, hStream)
            return (err or self._launch_graph(exe, stream),)

    def _exec_on(self, hGraphExec, hStream):
        """(CUresult, executable, stream) for an upload or launch: the handles looked up and
        the executable checked launchable on that stream."""
        exe = self._graph_exec(hGraphExec)
        if exe is None:
            return INVALID_VALUE, None, None
        err, stream = self._stream(hStream)
        return (err or self._launchable(exe, stream)), exe, stream

    def _launchable(self, exe: SimGraphExec, stream) -> object:
        """The checks of a launch or an upload on ``stream``: every node's context alive and
        on the stream's device."""
        for node in exe.graph.walk():
            ctx = node.work.ctx
            if ctx is None:
                continue
            if ctx.destroyed or not ctx.active:
                return CONTEXT_IS_DESTROYED
            if ctx.device != stream.ctx.device:
                return INVALID_VALUE
        return OK

    def _launch_graph(self, exe: SimGraphExec, stream) -> object:
        """Queue the executable's nodes on ``stream`` (later models add the memory nodes'
        bookkeeping and capture around it). A launch is ordered behind the executable's
        earlier launches, on any stream, as cuGraphLaunch documents."""
        earlier = exe.last
        if earlier is not None and not earlier.done and earlier.stream is not stream:
            self._push(stream, None, 0, "the executable's earlier launch", (earlier,))
        self._emit(exe, exe.graph, stream)
        exe.last = stream.last
        return OK

    def _emit(self, exe: SimGraphExec, graph: SimGraph, stream) -> None:
        for node in order(graph.nodes):
            work = node.work
            if id(node) in exe.disabled:
                self._push(stream, None, 0, "disabled node")
            elif isinstance(work, ChildWork):
                self._emit(exe, work.graph, stream)
            elif work.type == T.CU_GRAPH_NODE_TYPE_CONDITIONAL:
                self._push(
                    stream,
                    self._conditional_op(exe, work, stream),
                    LAUNCH_NS,
                    work.label(),
                    kind=KERNEL,
                )  # its body runs inline, as one kernel
            elif work.type == T.CU_GRAPH_NODE_TYPE_EVENT_RECORD:
                work.event.marker = self._push(stream, None, 0, "event record node")
            elif work.type == T.CU_GRAPH_NODE_TYPE_WAIT_EVENT:
                marker = work.event.marker
                self._push(
                    stream,
                    None,
                    0,
                    "event wait node",
                    [marker] if marker is not None and not marker.done else [],
                )
            else:
                kind = getattr(work, "activity", None)
                width = self._width(work.ctx, work.launch.grid) if kind == KERNEL else 1.0
                self._push(
                    stream,
                    work.op(self),
                    work.cost(),
                    work.label(),
                    kind=kind,
                    nbytes=getattr(work, "nbytes", 0),
                    width=width,
                )

    # -- per node -------------------------------------------------------------------------

    def _exec_node(self, hGraphExec, hNode, kind=None):
        """(executable, its node named by the graph's ``hNode``) or (None, None)."""
        exe = self._graph_exec(hGraphExec)
        node = exe.nodes.get(int(hNode or 0)) if exe is not None else None
        if node is None or (kind is not None and node.type != kind):
            return None, None
        return exe, node

    def cuGraphNodeSetEnabled(self, hGraphExec, hNode, isEnabled):
        enabled = unsigned(isEnabled, 32, "unsigned int")
        with self._lock:
            exe, node = self._exec_node(hGraphExec, hNode)
            if node is None or node.type not in _CAN_DISABLE:
                return (INVALID_VALUE,)
            if enabled:
                exe.disabled.discard(id(node))
            else:
                exe.disabled.add(id(node))
        return (OK,)

    def cuGraphNodeGetEnabled(self, hGraphExec, hNode):
        exe, node = self._exec_node(hGraphExec, hNode)
        if node is None or node.type not in _CAN_DISABLE:
            return (INVALID_VALUE, None)
        return (OK, int(id(node) not in exe.disabled))

    def _set_exec_work(self, hGraphExec, hNode, kind, make, allowed):
        """Give the executable's node the work ``make()`` returns when ``allowed(old,
        new)`` (the driver's rules for changing that node in place); else
        CUDA_ERROR_INVALID_VALUE."""
        with self._lock:
            exe, node = self._exec_node(hGraphExec, hNode, kind)
            if node is None:
                return (INVALID_VALUE,)
            err, work = make()
            if err:
                return (err,)
            if not allowed(node.work, work):
                return (INVALID_VALUE,)
            node.work = work
        return (OK,)

    def cuGraphExecKernelNodeSetParams(self, hGraphExec, hNode, nodeParams):
        return self._set_exec_work(
            hGraphExec,
            hNode,
            T.CU_GRAPH_NODE_TYPE_KERNEL,
            lambda: kernel_work(self, nodeParams),
            kernel_update_ok,
        )

    def cuGraphExecMemcpyNodeSetParams(self, hGraphExec, hNode, copyParams, ctx):
        return self._set_exec_work(
            hGraphExec,
            hNode,
            T.CU_GRAPH_NODE_TYPE_MEMCPY,
            lambda: copy_work(self, copyParams, ctx),
            copy_set_ok,
        )

    def cuGraphExecMemsetNodeSetParams(self, hGraphExec, hNode, memsetParams, ctx):
        return self._set_exec_work(
            hGraphExec,
            hNode,
            T.CU_GRAPH_NODE_TYPE_MEMSET,
            lambda: memset_work(self, memsetParams, ctx),
            memset_update_ok,
        )

    def cuGraphExecHostNodeSetParams(self, hGraphExec, hNode, nodeParams: CUDA_HOST_NODE_PARAMS):
        return self._set_exec_work(
            hGraphExec,
            hNode,
            T.CU_GRAPH_NODE_TYPE_HOST,
            lambda: host_work(nodeParams),
            lambda old, new: True,
        )


# -- the driver's rules for changing a node of an executable in place ----------------------
# (cuGraphExec*NodeSetParams and cuGraphExecUpdate share them.)


def kernel_update_ok(old, new) -> bool:
    """ "The owning context of the function cannot change"."""
    return old.launch.ctx is new.launch.ctx


def _one_d(work) -> bool:
    return work.copy.Height == 1 and work.copy.Depth == 1


def copy_update_ok(old, new) -> bool:
    """cuGraphExecUpdate's memcpy rules: memory types and the operands' devices stay, and
    a 1D copy stays 1D (the H100 refuses a 1D copy updated to a 2D one)."""
    return old.kinds == new.kinds and old.devices == new.devices and _one_d(old) == _one_d(new)


def copy_set_ok(old, new) -> bool:
    """cuGraphExecMemcpyNodeSetParams: as an update, and both copies one-dimensional."""
    return _one_d(old) and _one_d(new) and copy_update_ok(old, new)


def memset_update_ok(old, new) -> bool:
    """Address and value may change, and the device stays. A 2D memset keeps its shape; a
    1D memset stays 1D and may change its width and element size (the H100 accepts a
    wider one: "opportunistically allowed if the resulting work maps onto the work
    resources already allocated")."""
    if old.device != new.device or old.height != new.height:
        return False
    if old.height > 1:
        return (old.width, old.size, old.pitch) == (new.width, new.size, new.pitch)
    return True
