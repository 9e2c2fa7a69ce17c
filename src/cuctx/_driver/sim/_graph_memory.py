"""Memory nodes of the sim's graphs: allocation and free nodes (cuGraphAddMemAllocNode,
cuGraphAddMemFreeNode, and what capture makes of cuMemAllocAsync / cuMemFreeAsync).

An allocation node gets its block of device memory when it is made, with an address fixed
for the graph's lifetime (the driver's contract), and the allocation is live from then on,
so later nodes and captured work are checked against it as usual. When a launch runs the
node, the allocation is made live again if it was freed; a free node (in this graph or
another) ends it when it runs, and work that touches it afterwards is an illegal address.
The blocks are not given back when the graph goes (the driver keeps graph memory reserved
until cuDeviceGraphMemTrim, which the sim does not model).

The driver's rules: one executable at a time for a graph with memory nodes (`_graph_exec`:
a second cuGraphInstantiate is CUDA_ERROR_NOT_SUPPORTED, as is a child graph node holding
memory nodes, `_graphs`; both measured on an H100);
a relaunch while an allocation of the previous launch is unfreed is CUDA_ERROR_INVALID_VALUE
unless the executable was instantiated with AUTO_FREE_ON_LAUNCH, which frees it first; an
allocation is freed once: by a free node of its own graph, of one other graph, by
cuMemFreeAsync or cuMemFree; a free node for an address no allocation node returned is
CUDA_ERROR_INVALID_VALUE.
"""

from __future__ import annotations

from cuda.bindings.driver import (
    CUDA_MEM_ALLOC_NODE_PARAMS,
    CUdeviceptr,
    CUgraphNodeType,
    CUmemAllocationType,
    CUmemLocationType,
)

from ._cargs import size_t
from ._common import INVALID_VALUE, NOT_PERMITTED, NOT_SUPPORTED, OK, OUT_OF_MEMORY

T = CUgraphNodeType


class GraphMemory:
    """The state of one graph allocation (``Block.graph``)."""

    __slots__ = ("graph", "free_graph", "launched", "freed")

    def __init__(self, graph):
        self.graph = graph  # the graph of its allocation node
        self.free_graph = None  # the graph holding its free node, once one was added
        self.launched = False  # an allocation node made it in a launch
        self.freed = False  # a free was queued since (a node, cuMemFreeAsync, cuMemFree)


class AllocWork:
    type = T.CU_GRAPH_NODE_TYPE_MEM_ALLOC
    __slots__ = ("block", "bytesize", "ctx")

    def __init__(self, block, bytesize: int, ctx):
        self.block = block
        self.bytesize = bytesize
        self.ctx = ctx

    def cost(self) -> int:
        return 0

    def op(self, driver):
        block, nbytes, ctx = self.block, self.bytesize, self.ctx

        def run():
            if not block.live:
                block.allocate(nbytes, ctx)

        return run

    def label(self) -> str:
        return "alloc node"


class FreeWork:
    type = T.CU_GRAPH_NODE_TYPE_MEM_FREE
    ctx = None
    __slots__ = ("block",)

    def __init__(self, block):
        self.block = block

    def cost(self) -> int:
        return 0

    def op(self, driver):
        return _ender(self.block)

    def label(self) -> str:
        return "free node"


def _ender(block):
    def run():
        if block.live:
            block.end(block.current)

    return run


class GraphMemoryModel:
    """cuGraphAddMemAllocNode, cuGraphAddMemFreeNode, and cuMemFree / cuMemFreeAsync of graph
    allocations."""

    def _graph_alloc(self, graph, ctx, nbytes: int):
        """(CUresult, AllocWork) for ``nbytes`` on ``ctx``'s device, for ``graph``."""
        if nbytes == 0:
            return INVALID_VALUE, None
        block = self._new_block(nbytes, ctx.device, ctx)
        if block is None:
            return OUT_OF_MEMORY, None
        block.allocate(nbytes, ctx)
        block.graph = GraphMemory(graph)
        return OK, AllocWork(block, nbytes, ctx)

    def _graph_free(self, graph, dptr):
        """(CUresult, FreeWork) freeing the graph allocation at ``dptr`` in ``graph``."""
        block = self._blocks.get(int(dptr or 0))
        state = block.graph if block is not None else None
        if state is None or state.free_graph is not None:
            return INVALID_VALUE, None
        state.free_graph = graph
        return OK, FreeWork(block)

    def cuGraphAddMemAllocNode(self, hGraph, dependencies, numDependencies, nodeParams):
        if not isinstance(nodeParams, CUDA_MEM_ALLOC_NODE_PARAMS):
            raise TypeError(
                f"Argument 'nodeParams' has incorrect type (expected "
                f"cuda.bindings.driver.CUDA_MEM_ALLOC_NODE_PARAMS, got "
                f"{type(nodeParams).__name__})"
            )
        nbytes = size_t(nodeParams.bytesize)
        made = []

        def make():
            props = nodeParams.poolProps
            err, ctx = self._work_context()
            if err:
                return err, None
            if (
                props.allocType != CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
                or props.location.type != CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
            ):
                return (
                    INVALID_VALUE
                    if props.allocType == CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_INVALID
                    else NOT_SUPPORTED
                ), None
            if props.location.id != ctx.device:
                return INVALID_VALUE, None  # the sim allocates for the current context's device
            err, work = self._graph_alloc(self._graph(hGraph), ctx, nbytes)
            made.append(work)
            return err, work

        result = self._add_node(hGraph, dependencies, numDependencies, make)
        if not result[0]:
            nodeParams.dptr = CUdeviceptr(made[0].block.base)  # the driver's out parameter
        return result

    def cuGraphAddMemFreeNode(self, hGraph, dependencies, numDependencies, dptr):
        return self._add_node(
            hGraph,
            dependencies,
            numDependencies,
            lambda: self._graph_free(self._graph(hGraph), dptr),
        )

    def cuGraphMemAllocNodeGetParams(self, hNode):
        node = self._graph_node(hNode)
        if node is None or node.type != T.CU_GRAPH_NODE_TYPE_MEM_ALLOC:
            return (INVALID_VALUE, None)
        params = CUDA_MEM_ALLOC_NODE_PARAMS()
        params.poolProps.allocType = CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        params.poolProps.location.type = CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        params.poolProps.location.id = node.work.block.device
        params.bytesize = node.work.bytesize
        params.dptr = CUdeviceptr(node.work.block.base)
        return (OK, params)

    def cuGraphMemFreeNodeGetParams(self, hNode):
        node = self._graph_node(hNode)
        if node is None or node.type != T.CU_GRAPH_NODE_TYPE_MEM_FREE:
            return (INVALID_VALUE, None)
        return (OK, CUdeviceptr(node.work.block.base))

    # -- launches and frees outside graphs ---------------------------------------------------

    def _launch_graph(self, exe, stream):
        works = [n.work for n in exe.graph.walk()]
        allocs = [w for w in works if isinstance(w, AllocWork)]
        for work in allocs:
            state = work.block.graph
            if state.launched and not state.freed:
                if not exe.flags & 1:  # CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH
                    return INVALID_VALUE
        for work in allocs:
            state = work.block.graph
            if state.launched and not state.freed:  # freed first, as cuMemFreeAsync would
                self._push(stream, _ender(work.block), 0, "auto free")
            state.launched, state.freed = True, False
        for work in works:
            if isinstance(work, FreeWork):
                work.block.graph.freed = True
        return super()._launch_graph(exe, stream)

    def cuMemFreeAsync(self, dptr, hStream):
        with self._lock:
            block = self._blocks.get(int(dptr or 0))
            if block is None or block.graph is None:
                return super().cuMemFreeAsync(dptr, hStream)
            err = self._free_graph_memory(block)
            return (err or self._enqueue(hStream, _ender(block), label="free"),)

    def cuMemFree(self, dptr):
        block = self._blocks.get(int(dptr or 0))
        if block is None or block.graph is None:
            return super().cuMemFree(dptr)
        if self._in_host_function():
            return (NOT_PERMITTED,)
        err, _ = self._work_context()
        if err:
            return (err,)
        err = self._free_graph_memory(block)
        if err:
            return (err,)
        err = self._synchronize_context(block.ctx)
        with self._lock:
            _ender(block)()
        return (err or OK,)

    @staticmethod
    def _free_graph_memory(block):
        """A free from outside graphs: once per launch that made the allocation; and never of
        an allocation its own graph or another one frees."""
        state = block.graph
        if state.freed or state.free_graph is not None or not block.live:
            return INVALID_VALUE
        state.freed = True
        return OK
