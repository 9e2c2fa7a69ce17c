"""The sim's stream capture, called as cuda.bindings' driver functions: captured work becoming
nodes, forks and joins, the calls that break a capture in each mode (as an H100 answers them:
tests/driver/graphs_transcript.json), captured memory nodes."""

from __future__ import annotations

import ctypes
import threading

import numpy as np
import pytest
from cuda.bindings import driver as d
import test_sim_graphs
from test_sim_graphs import OK

rig = test_sim_graphs.rig  # the fixture: a context, a kernel, a stream (test_sim_graphs.Rig)

CAPTURE = d.CUstreamCaptureMode
STATUS = d.CUstreamCaptureStatus
R = d.CUresult


def node_types(drv, graph) -> list[str]:
    _, nodes, _ = drv.cuGraphGetNodes(graph, drv.cuGraphGetNodes(graph)[2])
    return [drv.cuGraphNodeGetType(n)[1].name.removeprefix("CU_GRAPH_NODE_TYPE_") for n in nodes]


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
    assert drv.cuLaunchKernel(
        rig.fn, 1, 1, 1, 1, 1, 1, 0, s, rig.kernel(a + 8, 5).kernelParams, 0
    ) == (OK,)
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


@pytest.mark.parametrize(
    "breaker",
    [
        lambda rig: rig.drv.cuStreamSynchronize(rig.stream),
        lambda rig: rig.drv.cuStreamQuery(rig.stream),
        lambda rig: rig.drv.cuCtxSynchronize(),
        lambda rig: rig.drv.cuMemAlloc(16)[:1],
        lambda rig: rig.drv.cuStreamSynchronize(rig.other),  # another stream: unsafe in GLOBAL
        lambda rig: rig.drv.cuGraphLaunch(rig.exe, rig.stream),  # graphs are not captured
        lambda rig: rig.drv.cuGraphUpload(rig.exe, rig.stream),
        lambda rig: rig.drv.cuGraphInstantiate(rig.template, 0)[:1],  # unsafe, as cuMemAlloc
    ],
    ids=[
        "stream sync",
        "stream query",
        "ctx sync",
        "cuMemAlloc",
        "other stream sync",
        "graph launch",
        "graph upload",
        "instantiate",
    ],
)
def test_a_call_that_breaks_a_capture_invalidates_it_and_the_stream_recovers(rig, breaker):
    drv, s = rig.drv, rig.stream
    a = rig.alloc()
    _, rig.other = drv.cuStreamCreate(1)
    rig.template = g = rig.graph()
    rig.add(g, "Empty")
    _, rig.exe = drv.cuGraphInstantiate(g, 0)
    assert drv.cuStreamBeginCapture(s, CAPTURE.CU_STREAM_CAPTURE_MODE_GLOBAL) == (OK,)
    assert drv.cuMemsetD32Async(a, 1, 1, s) == (OK,)
    assert breaker(rig) == (R.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,)
    assert drv.cuStreamIsCapturing(s) == (OK, STATUS.CU_STREAM_CAPTURE_STATUS_INVALIDATED)
    assert drv.cuMemsetD32Async(a, 1, 1, s) == (R.CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,)
    assert drv.cuStreamEndCapture(s) == (R.CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, None)
    assert drv.cuMemsetD32Async(a, 7, 1, s) == (OK,)  # usable again, eagerly
    assert rig.read(a, 1) == [7]


def test_relaxed_mode_allows_unsafe_calls_but_never_a_context_synchronize(rig):
    drv, s = rig.drv, rig.stream
    _, other = drv.cuStreamCreate(1)
    g = rig.graph()
    rig.add(g, "Empty")
    assert drv.cuStreamBeginCapture(s, CAPTURE.CU_STREAM_CAPTURE_MODE_RELAXED) == (OK,)
    assert drv.cuMemAlloc(16)[0] == OK
    assert drv.cuStreamSynchronize(other) == (OK,)
    err, exe = drv.cuGraphInstantiate(g, 0)
    assert err == OK and drv.cuGraphExecDestroy(exe) == (OK,)
    assert drv.cuStreamEndCapture(s)[0] == OK
    assert drv.cuStreamBeginCapture(s, CAPTURE.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL) == (OK,)
    assert drv.cuThreadExchangeStreamCaptureMode(CAPTURE.CU_STREAM_CAPTURE_MODE_RELAXED) == (
        OK,
        CAPTURE.CU_STREAM_CAPTURE_MODE_GLOBAL,
    )
    assert drv.cuMemAlloc(16)[0] == OK  # this thread asked to be relaxed
    drv.cuThreadExchangeStreamCaptureMode(CAPTURE.CU_STREAM_CAPTURE_MODE_GLOBAL)
    assert drv.cuStreamEndCapture(s)[0] == OK
    assert drv.cuStreamBeginCapture(s, CAPTURE.CU_STREAM_CAPTURE_MODE_RELAXED) == (OK,)
    assert drv.cuCtxSynchronize() == (R.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,)  # H100
    assert drv.cuStreamEndCapture(s) == (R.CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, None)


def test_pageable_and_synchronous_copies_do_not_break_a_capture(rig):
    drv, s = rig.drv, rig.stream
    a = rig.alloc()
    host = np.full(4, 3, np.uint32)
    assert drv.cuStreamBeginCapture(s, CAPTURE.CU_STREAM_CAPTURE_MODE_GLOBAL) == (OK,)
    assert drv.cuMemcpyHtoDAsync(a, host.ctypes.data, 16, s) == (OK,)  # captured (H100)
    assert drv.cuMemcpyHtoD(a + 16, host.ctypes.data, 16) == (OK,)  # runs now, legacy stream
    err, graph = drv.cuStreamEndCapture(s)
    assert err == OK and node_types(drv, graph) == ["MEMCPY"]
    assert rig.read(a, 8) == [0, 0, 0, 0, 3, 3, 3, 3]
    rig.run(graph)
    assert rig.read(a, 4) == [3, 3, 3, 3]


def test_the_legacy_stream_is_refused_while_a_blocking_stream_captures(rig):
    drv = rig.drv
    a = rig.alloc()
    _, blocking = drv.cuStreamCreate(0)
    assert drv.cuStreamBeginCapture(0, CAPTURE.CU_STREAM_CAPTURE_MODE_GLOBAL) == (
        R.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
    )
    assert drv.cuStreamBeginCapture(blocking, CAPTURE.CU_STREAM_CAPTURE_MODE_RELAXED) == (OK,)
    assert drv.cuStreamIsCapturing(0) == (R.CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, None)
    assert drv.cuMemsetD32Async(a, 1, 1, 0) == (R.CUDA_ERROR_STREAM_CAPTURE_IMPLICIT,)
    assert drv.cuStreamEndCapture(blocking) == (R.CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, None)


@pytest.mark.parametrize("mode, refused", [("GLOBAL", True), ("THREAD_LOCAL", False)])
def test_a_global_capture_of_another_thread_forbids_this_one_instantiate(rig, mode, refused):
    """The programming guide's rule for potentially unsafe calls: a thread in the default
    (global) mode may not make them while any thread captures in global mode; another
    thread's thread-local capture is none of its business."""
    drv, s = rig.drv, rig.stream
    g = rig.graph()
    rig.add(g, "Empty")
    begun, instantiated, seen = threading.Event(), threading.Event(), []

    def capture():
        drv.cuCtxPushCurrent(rig.ctx)
        drv.cuStreamBeginCapture(s, getattr(CAPTURE, f"CU_STREAM_CAPTURE_MODE_{mode}"))
        begun.set()
        instantiated.wait()
        seen.append(drv.cuStreamEndCapture(s)[0])
        drv.cuCtxPopCurrent()

    t = threading.Thread(target=capture)
    t.start()
    begun.wait()
    err, exe = drv.cuGraphInstantiate(g, 0)
    instantiated.set()
    t.join()
    if refused:
        assert (err, exe) == (R.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, None)
        assert seen == [R.CUDA_ERROR_STREAM_CAPTURE_INVALIDATED]
    else:
        assert err == OK and seen == [OK]
        assert drv.cuGraphExecDestroy(exe) == (OK,)


def test_end_capture_from_another_thread_is_refused_unless_relaxed(rig):
    drv, s = rig.drv, rig.stream
    assert drv.cuStreamBeginCapture(s, CAPTURE.CU_STREAM_CAPTURE_MODE_GLOBAL) == (OK,)
    seen = []
    t = threading.Thread(target=lambda: seen.append(drv.cuStreamEndCapture(s)))
    t.start()
    t.join()
    assert seen == [(R.CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD, None)]
    # ...and ended the capture without a graph (H100)
    assert drv.cuStreamIsCapturing(s) == (OK, STATUS.CU_STREAM_CAPTURE_STATUS_NONE)
    assert drv.cuStreamEndCapture(s) == (R.CUDA_ERROR_ILLEGAL_STATE, None)
    assert drv.cuStreamBeginCapture(s, CAPTURE.CU_STREAM_CAPTURE_MODE_RELAXED) == (OK,)
    t = threading.Thread(target=lambda: seen.append(drv.cuStreamEndCapture(s)[0]))
    t.start()
    t.join()
    assert seen[1] == OK


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
    assert drv.cuGraphInstantiate(graph, 0) == (
        R.CUDA_ERROR_NOT_SUPPORTED,
        None,
    )  # one at a time (H100)
