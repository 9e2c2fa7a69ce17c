"""The sim's CUDA graphs, called as cuda.bindings' driver functions: explicit graphs and their
nodes, executables launched through the stream engine, per-node updates, stream capture,
whole-graph updates, conditional and memory nodes. (cuctx's own graph API is tested in
tests/graphs.)"""

from __future__ import annotations

import ctypes
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
from cuda.bindings import driver as d

T = d.CUgraphNodeType
OK = d.CUresult.CUDA_SUCCESS
INVALID_VALUE = d.CUresult.CUDA_ERROR_INVALID_VALUE

PTX = b"""
.version 8.0
.target sm_90
.address_size 64
.visible .entry put(.param .u64 p, .param .u32 v) {
  .reg .b64 %rd<3>; .reg .b32 %r<2>;
  ld.param.u64 %rd1, [p]; ld.param.u32 %r1, [v];
  cvta.to.global.u64 %rd2, %rd1; st.global.u32 [%rd2], %r1; ret;
}
.visible .entry step(.param .u64 counter, .param .u64 handle) { ret; }
"""


def put(grid, block, p, v):
    p.view(np.uint32, 1)[0] = v


class Rig:
    """A context, a kernel ``put(p, v)`` (``*p = v``), a stream and helpers, on the sim."""

    def __init__(self, backend):
        self.backend = backend
        self.drv = drv = backend.driver
        assert drv.cuInit(0) == (OK,)
        _, self.ctx = drv.cuDevicePrimaryCtxRetain(d.CUdevice(0))
        assert drv.cuCtxPushCurrent(self.ctx) == (OK,)
        _, mod = drv.cuModuleLoadData(PTX)
        _, self.fn = drv.cuModuleGetFunction(mod, b"put")
        backend.sim.set_kernel_twin(self.fn, put)
        _, self.stream = drv.cuStreamCreate(1)
        self._keep = []

    def close(self):
        self.drv.cuCtxSynchronize()
        self.drv.cuCtxPopCurrent()

    def alloc(self, nbytes: int = 64) -> int:
        err, ptr = self.drv.cuMemAlloc(nbytes)
        assert not err
        assert self.drv.cuMemsetD8Async(ptr, 0, nbytes, 0) == (OK,)
        assert self.drv.cuCtxSynchronize() == (OK,)
        return int(ptr)

    def read(self, ptr: int, count: int = 4) -> list[int]:
        assert self.drv.cuCtxSynchronize() == (OK,)
        out = np.zeros(count, np.uint32)
        assert self.drv.cuMemcpyDtoH(out.ctypes.data, ptr, out.nbytes) == (OK,)
        return out.tolist()

    def kernel(self, ptr: int, value: int) -> d.CUDA_KERNEL_NODE_PARAMS:
        values = (ctypes.c_uint64 * 1)(ptr), (ctypes.c_uint32 * 1)(value)
        array = (ctypes.c_void_p * 2)(*[ctypes.addressof(v) for v in values])
        self._keep.append((values, array))
        params = d.CUDA_KERNEL_NODE_PARAMS()
        params.func = self.fn
        params.gridDimX = params.gridDimY = params.gridDimZ = 1
        params.blockDimX = params.blockDimY = params.blockDimZ = 1
        params.kernelParams = ctypes.addressof(array)
        return params

    @staticmethod
    def memset(ptr: int, value: int, width: int, size: int = 4, height: int = 1,
               pitch: int = 0) -> d.CUDA_MEMSET_NODE_PARAMS:
        params = d.CUDA_MEMSET_NODE_PARAMS()
        params.dst, params.value, params.elementSize = ptr, value, size
        params.width, params.height, params.pitch = width, height, pitch
        return params

    @staticmethod
    def copy(dst: int, src: int, nbytes: int) -> d.CUDA_MEMCPY3D:
        params = d.CUDA_MEMCPY3D()
        params.srcMemoryType = params.dstMemoryType = d.CUmemorytype.CU_MEMORYTYPE_DEVICE
        params.srcDevice, params.dstDevice = src, dst
        params.srcPitch = params.dstPitch = nbytes
        params.WidthInBytes, params.Height, params.Depth = nbytes, 1, 1
        return params

    def graph(self):
        err, graph = self.drv.cuGraphCreate(0)
        assert not err
        return graph

    def add(self, graph, kind: str, *args, after=()):
        err, node = getattr(self.drv, f"cuGraphAdd{kind}Node")(graph, list(after), len(after),
                                                               *args)
        assert err == OK, err
        return node

    def run(self, graph, flags: int = 0):
        err, exe = self.drv.cuGraphInstantiate(graph, flags)
        assert err == OK, err
        assert self.drv.cuGraphLaunch(exe, self.stream) == (OK,)
        assert self.drv.cuStreamSynchronize(self.stream) == (OK,)
        return exe


@pytest.fixture
def rig(sim):
    rig = Rig(sim)
    yield rig
    rig.close()


# -- explicit graphs ----------------------------------------------------------------------

def test_a_graph_runs_its_nodes_in_dependency_order_on_the_stream(rig):
    a, b = rig.alloc(), rig.alloc()
    g = rig.graph()
    fill = rig.add(g, "Memset", rig.memset(a, 5, 4), rig.ctx)
    put_ = rig.add(g, "Kernel", rig.kernel(a + 4, 9), after=[fill])
    rig.add(g, "Memcpy", rig.copy(b, a, 16), rig.ctx, after=[put_])
    rig.run(g)
    assert rig.read(b) == [5, 9, 5, 5]


def test_launches_are_asynchronous_and_ordered_with_the_streams_other_work(rig):
    a = rig.alloc()
    g = rig.graph()
    rig.add(g, "Kernel", rig.kernel(a, 1))
    _, exe = rig.drv.cuGraphInstantiate(g, 0)
    assert rig.drv.cuGraphLaunch(exe, rig.stream) == (OK,)
    assert rig.drv.cuMemsetD32Async(a, 2, 1, rig.stream) == (OK,)
    assert rig.drv.cuStreamQuery(rig.stream)[0] == d.CUresult.CUDA_ERROR_NOT_READY
    assert rig.read(a, 1) == [2]  # the memset after the launch ran after it


def test_parameters_are_copied_when_the_node_is_added(rig):
    a = rig.alloc()
    g = rig.graph()
    params = rig.kernel(a, 3)
    rig.add(g, "Kernel", params)
    ctypes.c_uint32.from_address(ctypes.c_void_p.from_address(params.kernelParams + 8).value) \
        .value = 4
    rig.run(g)
    assert rig.read(a, 1) == [3]


def test_nodes_and_edges_come_back_as_cuda_bindings_returns_them(rig):
    g = rig.graph()
    x = rig.add(g, "Empty")
    y = rig.add(g, "Empty", after=[x])
    assert rig.drv.cuGraphGetNodes(g) == (OK, [], 2)
    err, nodes, count = rig.drv.cuGraphGetNodes(g, 3)
    assert [int(n) for n in nodes] == [int(x), int(y), 0] and count == 2
    err, src, dst, data, count = rig.drv.cuGraphGetEdges(g, 1)
    assert (int(src[0]), int(dst[0]), count) == (int(x), int(y), 1)
    assert rig.drv.cuGraphNodeGetType(y) == (OK, T.CU_GRAPH_NODE_TYPE_EMPTY)


def test_child_graphs_are_cloned_when_added(rig):
    a = rig.alloc()
    child = rig.graph()
    rig.add(child, "Kernel", rig.kernel(a, 6))
    g = rig.graph()
    node = rig.add(g, "ChildGraph", child)
    rig.add(child, "Kernel", rig.kernel(a + 4, 7))  # after the clone: not in g
    err, inner = rig.drv.cuGraphChildGraphNodeGetGraph(node)
    assert rig.drv.cuGraphGetNodes(inner)[2] == 1
    assert rig.drv.cuGraphDestroy(inner) == (INVALID_VALUE,)  # the node owns it
    rig.run(g)
    assert rig.read(a, 2) == [6, 0]


def test_event_nodes_order_work_across_streams(rig):
    a = rig.alloc()
    _, event = rig.drv.cuEventCreate(0)
    g = rig.graph()
    k = rig.add(g, "Kernel", rig.kernel(a, 8))
    rig.add(g, "EventRecord", event, after=[k])
    _, exe = rig.drv.cuGraphInstantiate(g, 0)
    assert rig.drv.cuGraphLaunch(exe, rig.stream) == (OK,)
    _, other = rig.drv.cuStreamCreate(1)
    assert rig.drv.cuStreamWaitEvent(other, event, 0) == (OK,)
    out = np.zeros(1, np.uint32)
    host = rig.drv.cuMemHostAlloc(4, 0)[1]
    assert rig.drv.cuMemcpyDtoHAsync(host, a, 4, other) == (OK,)
    assert rig.drv.cuStreamSynchronize(other) == (OK,)
    ctypes.memmove(out.ctypes.data, host, 4)
    assert out.tolist() == [8]


def test_host_nodes_call_their_function(rig):
    seen = []
    callback = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(lambda data: seen.append(data))
    params = d.CUDA_HOST_NODE_PARAMS()
    params.fn = ctypes.cast(callback, ctypes.c_void_p).value
    params.userData = 42
    g = rig.graph()
    rig.add(g, "Host", params)
    rig.run(g)
    assert seen == [42]


def test_bad_handles_and_dependencies_are_invalid_values(rig):
    g, other = rig.graph(), rig.graph()
    foreign = rig.add(other, "Empty")
    assert rig.drv.cuGraphAddEmptyNode(g, [foreign], 1) == (INVALID_VALUE, None)
    x = rig.add(g, "Empty")
    assert rig.drv.cuGraphAddEmptyNode(g, [x, x], 2) == (INVALID_VALUE, None)
    with pytest.raises(RuntimeError):
        rig.drv.cuGraphAddEmptyNode(g, [x], 2)
    assert rig.drv.cuGraphAddEmptyNode(d.CUgraph(0), None, 0) == (INVALID_VALUE, None)
    assert rig.drv.cuGraphLaunch(d.CUgraphExec(0), rig.stream) == (INVALID_VALUE,)
    assert rig.drv.cuGraphAddMemsetNode(g, None, 0, rig.memset(12345, 0, 4), rig.ctx) \
        == (INVALID_VALUE, None)
    assert rig.drv.cuGraphDestroy(g) == (OK,)
    assert rig.drv.cuGraphDestroy(g) == (INVALID_VALUE,)
    assert rig.drv.cuGraphNodeGetType(x) == (INVALID_VALUE, None)


# -- executables --------------------------------------------------------------------------

def test_set_params_and_disabled_nodes_change_later_launches_only(rig):
    a = rig.alloc()
    g = rig.graph()
    k = rig.add(g, "Kernel", rig.kernel(a, 1))
    m = rig.add(g, "Memset", rig.memset(a + 4, 2, 1), rig.ctx, after=[k])
    _, exe = rig.drv.cuGraphInstantiate(g, 0)
    assert rig.drv.cuGraphLaunch(exe, rig.stream) == (OK,)
    assert rig.drv.cuGraphExecKernelNodeSetParams(exe, k, rig.kernel(a, 10)) == (OK,)
    assert rig.drv.cuGraphNodeSetEnabled(exe, m, 0) == (OK,)
    assert rig.drv.cuGraphNodeGetEnabled(exe, m) == (OK, 0)
    assert rig.read(a, 2) == [1, 2]  # the queued launch kept its parameters
    assert rig.drv.cuMemsetD32Async(a, 0, 2, rig.stream) == (OK,)
    assert rig.drv.cuGraphLaunch(exe, rig.stream) == (OK,)
    assert rig.read(a, 2) == [10, 0]


def test_memset_set_params_keep_the_shape(rig):
    a = rig.alloc()
    g = rig.graph()
    m = rig.add(g, "Memset", rig.memset(a, 2, 4), rig.ctx)
    _, exe = rig.drv.cuGraphInstantiate(g, 0)
    assert rig.drv.cuGraphExecMemsetNodeSetParams(exe, m, rig.memset(a + 16, 3, 4), rig.ctx) \
        == (OK,)
    assert rig.drv.cuGraphExecMemsetNodeSetParams(
        exe, m, rig.memset(a, 3, 2, height=2, pitch=16), rig.ctx) == (INVALID_VALUE,)
    assert rig.drv.cuGraphLaunch(exe, rig.stream) == (OK,)
    assert rig.read(a, 8) == [0, 0, 0, 0, 3, 3, 3, 3]


# -- stream capture -----------------------------------------------------------------------

CAPTURE = d.CUstreamCaptureMode
STATUS = d.CUstreamCaptureStatus
R = d.CUresult


def node_types(drv, graph) -> list[str]:
    _, nodes, _ = drv.cuGraphGetNodes(graph, drv.cuGraphGetNodes(graph)[2])
    return [drv.cuGraphNodeGetType(n)[1].name.removeprefix("CU_GRAPH_NODE_TYPE_")
            for n in nodes]


def pinned(rig, nbytes: int) -> int:
    err, host = rig.drv.cuMemHostAlloc(nbytes, 0)
    assert not err
    return int(host)


def test_captured_work_becomes_nodes_and_runs_only_when_launched(rig):
    drv, s = rig.drv, rig.stream
    a, host = rig.alloc(), pinned(rig, 16)
    assert drv.cuStreamBeginCapture(s, CAPTURE.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL) == (OK,)
    assert drv.cuStreamIsCapturing(s) == (OK, STATUS.CU_STREAM_CAPTURE_STATUS_ACTIVE)
    assert drv.cuMemsetD32Async(a, 4, 4, s) == (OK,)
    assert drv.cuLaunchKernel(rig.fn, 1, 1, 1, 1, 1, 1, 0, s,
                              rig.kernel(a + 8, 5).kernelParams, 0) == (OK,)
    assert drv.cuMemcpyDtoHAsync(host, a, 16, s) == (OK,)
    err, info = drv.cuStreamGetCaptureInfo(s), None
    assert info is None and err[1] == STATUS.CU_STREAM_CAPTURE_STATUS_ACTIVE and err[6] == 1
    err, graph = drv.cuStreamEndCapture(s)
    assert err == OK
    assert node_types(drv, graph) == ["MEMSET", "KERNEL", "MEMCPY"]
    assert drv.cuGraphGetEdges(graph)[4] == 2  # a chain
    assert rig.read(a) == [0, 0, 0, 0]  # nothing ran
    rig.run(graph)
    assert (ctypes.c_uint32 * 4).from_address(host)[:] == [4, 4, 5, 4]


def test_forked_streams_join_through_events(rig):
    drv, s = rig.drv, rig.stream
    a = rig.alloc()
    _, side = drv.cuStreamCreate(1)
    _, fork = drv.cuEventCreate(0)
    _, join = drv.cuEventCreate(0)
    assert drv.cuStreamBeginCapture(s, CAPTURE.CU_STREAM_CAPTURE_MODE_GLOBAL) == (OK,)
    assert drv.cuMemsetD32Async(a, 1, 4, s) == (OK,)
    assert drv.cuEventRecord(fork, s) == (OK,)
    assert drv.cuStreamWaitEvent(side, fork, 0) == (OK,)
    assert drv.cuStreamIsCapturing(side) == (OK, STATUS.CU_STREAM_CAPTURE_STATUS_ACTIVE)
    assert drv.cuMemsetD32Async(a + 4, 2, 1, side) == (OK,)
    assert drv.cuMemsetD32Async(a + 8, 3, 1, s) == (OK,)
    assert drv.cuEventRecord(join, side) == (OK,)
    assert drv.cuStreamWaitEvent(s, join, 0) == (OK,)
    assert drv.cuEventQuery(fork) == (R.CUDA_ERROR_CAPTURED_EVENT,)
    err, graph = drv.cuStreamEndCapture(s)
    assert err == R.CUDA_ERROR_STREAM_CAPTURE_INVALIDATED and graph is None  # the query broke it
    assert drv.cuStreamIsCapturing(side) == (OK, STATUS.CU_STREAM_CAPTURE_STATUS_NONE)

    assert drv.cuStreamBeginCapture(s, CAPTURE.CU_STREAM_CAPTURE_MODE_GLOBAL) == (OK,)
    assert drv.cuMemsetD32Async(a, 1, 4, s) == (OK,)
    assert drv.cuEventRecord(fork, s) == (OK,)
    assert drv.cuStreamWaitEvent(side, fork, 0) == (OK,)
    assert drv.cuMemsetD32Async(a + 4, 2, 1, side) == (OK,)
    assert drv.cuMemsetD32Async(a + 8, 3, 1, s) == (OK,)
    assert drv.cuEventRecord(join, side) == (OK,)
    assert drv.cuStreamWaitEvent(s, join, 0) == (OK,)
    err, graph = drv.cuStreamEndCapture(s)
    assert err == OK
    assert drv.cuGraphGetEdges(graph)[4] == 2  # the first memset forks into the two others
    rig.run(graph)
    assert rig.read(a) == [1, 2, 3, 1]


def test_a_fork_not_joined_back_ends_the_capture_without_a_graph(rig):
    drv, s = rig.drv, rig.stream
    a = rig.alloc()
    _, side = drv.cuStreamCreate(1)
    _, fork = drv.cuEventCreate(0)
    assert drv.cuStreamBeginCapture(s, CAPTURE.CU_STREAM_CAPTURE_MODE_GLOBAL) == (OK,)
    assert drv.cuEventRecord(fork, s) == (OK,)
    assert drv.cuStreamWaitEvent(side, fork, 0) == (OK,)
    assert drv.cuMemsetD32Async(a, 2, 1, side) == (OK,)
    assert drv.cuStreamEndCapture(s) == (R.CUDA_ERROR_STREAM_CAPTURE_UNJOINED, None)
    assert drv.cuStreamIsCapturing(side) == (OK, STATUS.CU_STREAM_CAPTURE_STATUS_NONE)


@pytest.mark.parametrize("breaker, code", [
    (lambda rig: rig.drv.cuStreamSynchronize(rig.stream), R.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED),
    (lambda rig: rig.drv.cuStreamQuery(rig.stream), R.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED),
    (lambda rig: rig.drv.cuCtxSynchronize(), R.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED),
    (lambda rig: rig.drv.cuMemAlloc(16)[:1], R.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED),
    (lambda rig: rig.drv.cuMemcpyHtoDAsync(rig.alloc_during, np.zeros(4).ctypes.data, 4,
                                           rig.stream), R.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED),
])
def test_a_call_that_breaks_a_capture_invalidates_it_and_the_stream_recovers(rig, breaker, code):
    drv, s = rig.drv, rig.stream
    rig.alloc_during = a = rig.alloc()
    assert drv.cuStreamBeginCapture(s, CAPTURE.CU_STREAM_CAPTURE_MODE_GLOBAL) == (OK,)
    assert drv.cuMemsetD32Async(a, 1, 1, s) == (OK,)
    assert breaker(rig) == (code,)
    assert drv.cuStreamIsCapturing(s) == (OK, STATUS.CU_STREAM_CAPTURE_STATUS_INVALIDATED)
    assert drv.cuMemsetD32Async(a, 1, 1, s) == (R.CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,)
    assert drv.cuStreamEndCapture(s) == (R.CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, None)
    assert drv.cuMemsetD32Async(a, 7, 1, s) == (OK,)  # usable again, eagerly
    assert rig.read(a, 1) == [7]


def test_relaxed_and_thread_local_modes_allow_unsafe_calls_as_documented(rig):
    drv, s = rig.drv, rig.stream
    assert drv.cuStreamBeginCapture(s, CAPTURE.CU_STREAM_CAPTURE_MODE_RELAXED) == (OK,)
    assert drv.cuCtxSynchronize() == (OK,)
    assert drv.cuStreamEndCapture(s)[0] == OK
    assert drv.cuStreamBeginCapture(s, CAPTURE.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL) == (OK,)
    assert drv.cuThreadExchangeStreamCaptureMode(CAPTURE.CU_STREAM_CAPTURE_MODE_RELAXED) \
        == (OK, CAPTURE.CU_STREAM_CAPTURE_MODE_GLOBAL)
    assert drv.cuCtxSynchronize() == (OK,)  # this thread asked to be relaxed
    drv.cuThreadExchangeStreamCaptureMode(CAPTURE.CU_STREAM_CAPTURE_MODE_GLOBAL)
    assert drv.cuStreamEndCapture(s)[0] == OK


def test_the_legacy_stream_is_refused_while_a_blocking_stream_captures(rig):
    drv = rig.drv
    a = rig.alloc()
    _, blocking = drv.cuStreamCreate(0)
    assert drv.cuStreamBeginCapture(0, CAPTURE.CU_STREAM_CAPTURE_MODE_GLOBAL) \
        == (R.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,)
    assert drv.cuStreamBeginCapture(blocking, CAPTURE.CU_STREAM_CAPTURE_MODE_RELAXED) == (OK,)
    assert drv.cuStreamIsCapturing(0) == (R.CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, None)
    assert drv.cuMemsetD32Async(a, 1, 1, 0) == (R.CUDA_ERROR_STREAM_CAPTURE_IMPLICIT,)
    assert drv.cuStreamEndCapture(blocking) == (R.CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, None)


def test_end_capture_from_another_thread_is_refused_unless_relaxed(rig):
    import threading
    drv, s = rig.drv, rig.stream
    assert drv.cuStreamBeginCapture(s, CAPTURE.CU_STREAM_CAPTURE_MODE_GLOBAL) == (OK,)
    seen = []
    t = threading.Thread(target=lambda: seen.append(drv.cuStreamEndCapture(s)))
    t.start()
    t.join()
    assert seen == [(R.CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD, None)]
    assert drv.cuStreamEndCapture(s)[0] == OK
    assert drv.cuStreamEndCapture(s) == (R.CUDA_ERROR_ILLEGAL_STATE, None)


def test_stream_ordered_allocations_in_a_capture_become_memory_nodes(rig):
    drv, s = rig.drv, rig.stream
    host = pinned(rig, 4)
    assert drv.cuStreamBeginCapture(s, CAPTURE.CU_STREAM_CAPTURE_MODE_GLOBAL) == (OK,)
    err, ptr = drv.cuMemAllocAsync(64, s)
    assert err == OK and int(ptr)
    assert drv.cuMemsetD32Async(ptr, 6, 16, s) == (OK,)
    assert drv.cuMemcpyDtoHAsync(host, ptr, 4, s) == (OK,)
    assert drv.cuMemFreeAsync(ptr, s) == (OK,)
    err, graph = drv.cuStreamEndCapture(s)
    assert node_types(drv, graph) == ["MEM_ALLOC", "MEMSET", "MEMCPY", "MEM_FREE"]
    exe = rig.run(graph)
    assert ctypes.c_uint32.from_address(host).value == 6
    assert drv.cuGraphLaunch(exe, s) == (OK,)  # freed in the graph: relaunching is fine
    assert drv.cuStreamSynchronize(s) == (OK,)
    assert drv.cuGraphInstantiate(graph, 0) == (INVALID_VALUE, None)  # one at a time


# -- whole-graph updates ------------------------------------------------------------------

UPDATE = d.CUgraphExecUpdateResult


def test_an_update_with_the_same_structure_takes_the_new_parameters(rig):
    drv = rig.drv
    a, b = rig.alloc(), rig.alloc()

    def build(ptr, value):
        g = rig.graph()
        k = rig.add(g, "Kernel", rig.kernel(ptr, value))
        rig.add(g, "Memset", rig.memset(ptr + 4, value, 3), rig.ctx, after=[k])
        return g
    exe = rig.run(build(a, 1))
    err, info = drv.cuGraphExecUpdate(exe, build(b, 2))
    assert (err, info.result) == (OK, UPDATE.CU_GRAPH_EXEC_UPDATE_SUCCESS)
    assert drv.cuGraphLaunch(exe, rig.stream) == (OK,)
    assert rig.read(b) == [2, 2, 2, 2] and rig.read(a) == [1, 1, 1, 1]


def test_an_update_is_refused_naming_the_node_and_the_reason(rig):
    drv = rig.drv
    a = rig.alloc()
    g = rig.graph()
    rig.add(g, "Memset", rig.memset(a, 1, 4), rig.ctx)
    _, exe = drv.cuGraphInstantiate(g, 0)

    def refused(graph):
        err, info = drv.cuGraphExecUpdate(exe, graph)
        assert err == R.CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE
        return info.result, int(info.errorNode)

    two = rig.graph()
    rig.add(two, "Memset", rig.memset(a, 1, 4), rig.ctx)
    rig.add(two, "Empty")
    assert refused(two) == (UPDATE.CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED, 0)
    other = rig.graph()
    node = rig.add(other, "Kernel", rig.kernel(a, 1))
    assert refused(other) == (UPDATE.CU_GRAPH_EXEC_UPDATE_ERROR_NODE_TYPE_CHANGED, int(node))
    shape = rig.graph()
    node = rig.add(shape, "Memset", rig.memset(a, 1, 2, height=2, pitch=16), rig.ctx)
    assert refused(shape) == (UPDATE.CU_GRAPH_EXEC_UPDATE_ERROR_PARAMETERS_CHANGED, int(node))
    assert drv.cuGraphLaunch(exe, rig.stream) == (OK,)  # unchanged by the refusals
    assert rig.read(a) == [1, 1, 1, 1]


# -- conditional nodes, memory nodes, dot files -------------------------------------------

COND = d.CUgraphConditionalNodeType


def conditional(rig, graph, kind, size: int = 1, default: int = 0, flags: int = 0, after=()):
    err, handle = rig.drv.cuGraphConditionalHandleCreate(graph, rig.ctx, default, flags)
    assert err == OK
    params = d.CUgraphNodeParams()
    params.type = T.CU_GRAPH_NODE_TYPE_CONDITIONAL
    params.conditional.handle, params.conditional.type = handle, kind
    params.conditional.size, params.conditional.ctx = size, rig.ctx
    err, node = rig.drv.cuGraphAddNode(graph, list(after), None, len(after), params)
    assert err == OK, err
    return handle, params.conditional.phGraph_out


def stepper(rig):
    """A kernel ``step(counter, handle)`` whose twin decrements *counter and sets the
    condition to whether it is still above zero (as cudaGraphSetConditional would)."""
    _, mod = rig.drv.cuModuleLoadData(PTX)
    _, fn = rig.drv.cuModuleGetFunction(mod, b"step")

    def step(grid, block, counter, handle: int):
        view = counter.view(np.uint32, 1)
        view[0] -= 1
        rig.backend.sim.set_conditional(handle, int(view[0] > 0))
    rig.backend.sim.set_kernel_twin(fn, step)
    return fn


def test_a_while_node_runs_its_body_while_a_kernel_keeps_the_condition_set(rig):
    drv = rig.drv
    counter, out = rig.alloc(), rig.alloc()
    fn = stepper(rig)
    g = rig.graph()
    handle, bodies = conditional(rig, g, COND.CU_GRAPH_COND_TYPE_WHILE, default=1,
                                 flags=d.CU_GRAPH_COND_ASSIGN_DEFAULT)
    body = bodies[0]
    values = (ctypes.c_uint64 * 2)(counter, int(handle))
    array = (ctypes.c_void_p * 2)(ctypes.addressof(values), ctypes.addressof(values) + 8)
    params = rig.kernel(0, 0)
    params.func, params.kernelParams = fn, ctypes.addressof(array)
    k = rig.add(body, "Kernel", params)
    rig.add(body, "Memset", rig.memset(out, 9, 1), rig.ctx, after=[k])
    assert drv.cuMemsetD32Async(counter, 3, 1, rig.stream) == (OK,)
    rig.run(g)
    assert rig.read(counter, 1) == [0] and rig.read(out, 1) == [9]


def test_an_if_node_runs_its_else_body_when_the_condition_is_zero(rig):
    a = rig.alloc()
    g = rig.graph()
    _, bodies = conditional(rig, g, COND.CU_GRAPH_COND_TYPE_IF, size=2, default=0,
                            flags=d.CU_GRAPH_COND_ASSIGN_DEFAULT)
    rig.add(bodies[0], "Memset", rig.memset(a, 1, 1), rig.ctx)
    rig.add(bodies[1], "Memset", rig.memset(a + 4, 2, 1), rig.ctx)
    assert rig.drv.cuGraphAddHostNode(bodies[0], None, 0, d.CUDA_HOST_NODE_PARAMS())[0] \
        == INVALID_VALUE  # a null function; host nodes may not be in bodies at all
    rig.run(g)
    assert rig.read(a, 2) == [0, 2]


def test_an_unused_conditional_handle_fails_instantiation(rig):
    g = rig.graph()
    assert rig.drv.cuGraphConditionalHandleCreate(g, rig.ctx, 0, 0)[0] == OK
    assert rig.drv.cuGraphInstantiate(g, 0) == (INVALID_VALUE, None)


def test_explicit_memory_nodes_and_relaunching_an_unfreed_allocation(rig):
    drv = rig.drv
    params = d.CUDA_MEM_ALLOC_NODE_PARAMS()
    params.poolProps.allocType = d.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    params.poolProps.location.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    params.poolProps.location.id = 0
    params.bytesize = 64
    g = rig.graph()
    alloc = rig.add(g, "MemAlloc", params)
    ptr = int(params.dptr)
    rig.add(g, "Memset", rig.memset(ptr, 5, 16), rig.ctx, after=[alloc])
    exe = rig.run(g)
    assert rig.read(ptr, 2) == [5, 5]  # not freed in the graph: usable after it
    assert drv.cuGraphLaunch(exe, rig.stream) == (INVALID_VALUE,)  # still unfreed
    assert drv.cuMemFreeAsync(ptr, rig.stream) == (OK,)
    assert drv.cuGraphLaunch(exe, rig.stream) == (OK,)
    assert drv.cuStreamSynchronize(rig.stream) == (OK,)
    drv.cuGraphExecDestroy(exe)
    rig.run(g, flags=d.CUgraphInstantiate_flags.CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH)
    free = rig.graph()
    rig.add(free, "MemFree", ptr)
    assert drv.cuGraphAddMemFreeNode(free, None, 0, ptr) == (INVALID_VALUE, None)  # twice


def test_a_dot_file_describes_the_graph(rig, tmp_path):
    a = rig.alloc()
    g = rig.graph()
    k = rig.add(g, "Kernel", rig.kernel(a, 1))
    rig.add(g, "Memset", rig.memset(a, 1, 1), rig.ctx, after=[k])
    path = tmp_path / "g.dot"
    assert rig.drv.cuGraphDebugDotPrint(g, str(path).encode(), 0) == (OK,)
    text = path.read_text()
    assert "KERNEL" in text and "put" in text and "MEMSET" in text and "n0 -> n1" in text


# -- parity with the GPU ------------------------------------------------------------------

TRANSCRIPT = Path(__file__).with_name("graphs_transcript.json")
RECORD = ("record it on a GPU: CUCTX_BACKEND=cuda PYTHONPATH=src python "
          "scripts/probe_graphs.py tests/driver/graphs_transcript.json")


def probe():
    """scripts/probe_graphs.py, whose `transcript` both the GPU recording and this test run."""
    path = Path(__file__).parents[2] / "scripts" / "probe_graphs.py"
    spec = importlib.util.spec_from_file_location("probe_graphs", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_probe_runs_on_the_sim_without_errors_of_its_own(sim):
    steps = probe().transcript(sim)
    assert len(steps) > 300
    assert not [s for s in steps if isinstance(s[1], str) and s[1].startswith("raised")]


def test_the_sim_answers_the_graph_transcript_as_the_gpu_did(sim):
    if not TRANSCRIPT.exists():
        pytest.skip(f"no GPU transcript of graph calls yet ({RECORD})")
    expected = json.loads(TRANSCRIPT.read_text())["steps"]
    seen = probe().transcript(sim)
    differences = [f"{want[0]}: GPU {want[1]!r}, sim {got[1]!r}"
                   for want, got in zip(expected, seen) if want != got]
    if [s[0] for s in expected] != [s[0] for s in seen]:
        differences.append("the steps differ: record the transcript again with this script")
    assert not differences, "the sim differs from the GPU:\n" + "\n".join(differences)
