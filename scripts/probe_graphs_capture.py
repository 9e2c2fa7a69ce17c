"""The stream-capture steps of scripts/probe_graphs.py: beginning and ending captures,
captured work, the calls that break a capture in each mode, forks and joins, merges, threads,
captured memory nodes and graph launches; instantiating, launching and changing executables
while a capture is active."""

from __future__ import annotations

import ctypes
import threading

from probe_graphs_common import MODE, Recorder, Setup, types


def capture(r: Recorder, s: Setup) -> None:
    step, drv, stream = r.step, r.drv, s.stream
    put, pinned, pageable, seen = s.put, s.pinned, s.pageable, s.seen
    a, b = s.allocs[:2]
    _, blocking = drv.cuStreamCreate(0)
    _, side = drv.cuStreamCreate(1)
    _, fork = drv.cuEventCreate(0)
    _, join = drv.cuEventCreate(0)
    _, outside = drv.cuEventCreate(0)
    drv.cuEventRecord(outside, stream)
    spare = [drv.cuMemAlloc(64)[1] for _ in range(3)]  # one for each mode's cuMemFree

    def begin(label, s=stream, mode=MODE.CU_STREAM_CAPTURE_MODE_GLOBAL):
        step(f"begin capture {label}", lambda: drv.cuStreamBeginCapture(s, mode))

    def end(label, s=stream):
        result = step(f"end capture {label}", lambda: drv.cuStreamEndCapture(s))
        if result is not None and not result[0]:
            r.name(result[1], label)
        return result[1] if result is not None else None

    def launch(s, value, ptr=a):
        params = r.kernel(put, ptr, value)
        return drv.cuLaunchKernel(put, 1, 1, 1, 1, 1, 1, 0, s, params.kernelParams, 0)

    step(
        "begin capture on the legacy stream",
        lambda: drv.cuStreamBeginCapture(0, MODE.CU_STREAM_CAPTURE_MODE_GLOBAL),
    )
    step("end capture of a stream not capturing", lambda: drv.cuStreamEndCapture(stream))
    step("is capturing (idle)", lambda: drv.cuStreamIsCapturing(stream))
    step("capture info (idle)", lambda: drv.cuStreamGetCaptureInfo(stream))
    begin("C1")
    step(
        "begin capture again",
        lambda: drv.cuStreamBeginCapture(stream, MODE.CU_STREAM_CAPTURE_MODE_GLOBAL),
    )
    step("is capturing", lambda: drv.cuStreamIsCapturing(stream))
    step("captured memset", lambda: drv.cuMemsetD32Async(a, 6, 4, stream))
    step("captured launch", lambda: launch(stream, 8))
    step("captured copy to pinned", lambda: drv.cuMemcpyDtoHAsync(pinned, a, 16, stream))
    step("captured host function", lambda: drv.cuLaunchHostFunc(stream, r.host(seen, 11).fn, 11))
    step("captured zero-size memset", lambda: drv.cuMemsetD32Async(a, 6, 0, stream))
    step("capture info", lambda: drv.cuStreamGetCaptureInfo(stream))
    g = end("C1")
    step("C1 node types", lambda: types(drv, g))
    step("C1 edges", lambda: drv.cuGraphGetEdges(g)[4])
    step("C1 run", lambda: (drv.cuGraphInstantiate(g, 0)[0],))

    breakers = {
        "synchronize the capturing stream": lambda: drv.cuStreamSynchronize(stream),
        "query the capturing stream": lambda: drv.cuStreamQuery(stream),
        "cuCtxSynchronize": lambda: drv.cuCtxSynchronize(),
        "cuMemAlloc": lambda: drv.cuMemAlloc(64)[0],
        "pageable async copy": lambda: drv.cuMemcpyHtoDAsync(a, pageable.ctypes.data, 16, stream),
        "pageable synchronous copy": lambda: drv.cuMemcpyHtoD(a, pageable.ctypes.data, 16),
        "legacy stream memset": lambda: drv.cuMemsetD32Async(a, 1, 1, 0),
        "wait on an event recorded outside": lambda: drv.cuStreamWaitEvent(stream, outside, 0),
        "external wait on an event recorded outside": lambda: drv.cuStreamWaitEvent(
            stream, outside, 1
        ),
        "query an event recorded in the capture": lambda: (
            drv.cuEventRecord(fork, stream),
            drv.cuEventQuery(fork),
        ),
        "synchronize an event recorded in the capture": lambda: (
            drv.cuEventRecord(fork, stream),
            drv.cuEventSynchronize(fork),
        ),
        "cuStreamSynchronize of another stream": lambda: drv.cuStreamSynchronize(side),
        "cuStreamQuery of another stream": lambda: drv.cuStreamQuery(side),
        "cuMemFree": lambda: drv.cuMemFree(spare.pop()),
    }
    for mode in (
        MODE.CU_STREAM_CAPTURE_MODE_GLOBAL,
        MODE.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
        MODE.CU_STREAM_CAPTURE_MODE_RELAXED,
    ):
        for label, breaker in breakers.items():
            label = f"{mode.name.removeprefix('CU_STREAM_CAPTURE_MODE_')}: {label}"
            begin(label, mode=mode)
            step(f"work before [{label}]", lambda: drv.cuMemsetD32Async(a, 1, 1, stream))
            step(f"[{label}]", breaker)
            step(f"status after [{label}]", lambda: drv.cuStreamIsCapturing(stream))
            step(f"work after [{label}]", lambda: drv.cuMemsetD32Async(a, 1, 1, stream))
            step(f"end [{label}]", lambda: drv.cuStreamEndCapture(stream)[0])
            step(
                f"eager work after [{label}]",
                lambda: (drv.cuMemsetD32Async(a, 2, 1, stream), drv.cuStreamSynchronize(stream)),
            )
            for event in (fork, outside):
                drv.cuEventRecord(event, stream)  # out of the capture again
            drv.cuStreamSynchronize(stream)

    begin("legacy with a blocking stream", s=blocking)
    step("is capturing: legacy", lambda: drv.cuStreamIsCapturing(0))
    step("capture info: legacy", lambda: drv.cuStreamGetCaptureInfo(0)[0])
    step("legacy memset while a blocking stream captures", lambda: drv.cuMemsetD32Async(a, 1, 1, 0))
    step("end: legacy with a blocking stream", lambda: drv.cuStreamEndCapture(blocking))

    begin("fork and join")
    step("fork: memset", lambda: drv.cuMemsetD32Async(a, 1, 4, stream))
    step("fork: record", lambda: drv.cuEventRecord(fork, stream))
    step("fork: side waits", lambda: drv.cuStreamWaitEvent(side, fork, 0))
    step("fork: side status", lambda: drv.cuStreamIsCapturing(side))
    step("fork: side capture info", lambda: drv.cuStreamGetCaptureInfo(side))
    step("fork: side memset", lambda: drv.cuMemsetD32Async(a + 4, 2, 1, side))
    step("fork: origin memset", lambda: drv.cuMemsetD32Async(a + 8, 3, 1, stream))
    step("end capture on the forked stream", lambda: drv.cuStreamEndCapture(side))
    step("fork: end after that", lambda: drv.cuStreamEndCapture(stream)[0])
    begin("fork and join again")
    drv.cuMemsetD32Async(a, 1, 4, stream)
    drv.cuEventRecord(fork, stream)
    drv.cuStreamWaitEvent(side, fork, 0)
    drv.cuMemsetD32Async(a + 4, 2, 1, side)
    drv.cuMemsetD32Async(a + 8, 3, 1, stream)
    step("join: record on side", lambda: drv.cuEventRecord(join, side))
    step("join: origin waits", lambda: drv.cuStreamWaitEvent(stream, join, 0))
    step("join: capture info", lambda: drv.cuStreamGetCaptureInfo(stream)[6])
    joined = end("joined")
    step("joined: edges", lambda: drv.cuGraphGetEdges(joined)[4])
    begin("unjoined")
    drv.cuEventRecord(fork, stream)
    drv.cuStreamWaitEvent(side, fork, 0)
    drv.cuMemsetD32Async(a, 2, 1, side)
    step("end: unjoined", lambda: drv.cuStreamEndCapture(stream))
    step("unjoined: side status after", lambda: drv.cuStreamIsCapturing(side))

    begin("merge A")
    begin("merge B", s=side)
    drv.cuEventRecord(fork, stream)
    step("merge: side waits on A's event", lambda: drv.cuStreamWaitEvent(side, fork, 0))
    step("merge: end A", lambda: drv.cuStreamEndCapture(stream)[0])
    step("merge: end B", lambda: drv.cuStreamEndCapture(side)[0])

    begin("wrong thread")
    out = []
    t = threading.Thread(target=lambda: out.append(r.show(drv.cuStreamEndCapture(stream))))
    t.start()
    t.join()
    step("end capture from another thread (global)", lambda: out[0])
    step("end capture on its thread", lambda: drv.cuStreamEndCapture(stream)[0])
    begin("relaxed, ended elsewhere", mode=MODE.CU_STREAM_CAPTURE_MODE_RELAXED)
    out.clear()
    t = threading.Thread(target=lambda: out.append(drv.cuStreamEndCapture(stream)[0].name))
    t.start()
    t.join()
    step("end capture from another thread (relaxed)", lambda: out[0])
    step(
        "exchange capture mode",
        lambda: drv.cuThreadExchangeStreamCaptureMode(MODE.CU_STREAM_CAPTURE_MODE_RELAXED),
    )
    step(
        "exchange capture mode back",
        lambda: drv.cuThreadExchangeStreamCaptureMode(MODE.CU_STREAM_CAPTURE_MODE_GLOBAL),
    )

    begin("memory")
    step("capture: cuMemAllocAsync", lambda: drv.cuMemAllocAsync(64, stream)[0])
    step("capture: cuMemFreeAsync of cuMemAlloc memory", lambda: drv.cuMemFreeAsync(b, stream))
    step("end: memory", lambda: drv.cuStreamEndCapture(stream)[0])
    begin("memory nodes")
    ptr = drv.cuMemAllocAsync(64, stream)[1]
    drv.cuMemsetD32Async(ptr, 6, 16, stream)
    drv.cuMemcpyDtoHAsync(pinned, ptr, 4, stream)
    step("capture: free of the captured allocation", lambda: drv.cuMemFreeAsync(ptr, stream))
    mg = end("memory nodes")
    step("memory nodes: types", lambda: types(drv, mg))
    mx = step("memory nodes: instantiate", lambda: drv.cuGraphInstantiate(mg, 0))
    step(
        "memory nodes: launch twice",
        lambda: (
            drv.cuGraphLaunch(mx[1], stream),
            drv.cuGraphLaunch(mx[1], stream),
            drv.cuStreamSynchronize(stream),
        ),
    )
    step("memory nodes: value", lambda: ctypes.c_uint32.from_address(pinned).value)
    step("memory nodes: second instantiate", lambda: drv.cuGraphInstantiate(mg, 0))

    x = drv.cuGraphInstantiate(g, 0)[1]
    begin("graph launch")
    step("capture: cuGraphLaunch", lambda: drv.cuGraphLaunch(x, stream))
    lg = end("graph launch")
    step("graph launch: node types", lambda: types(drv, lg) if lg is not None else None)


def instantiate_once(drv, g):
    """cuGraphInstantiate's answer for ``g``; the executable, if any, destroyed again."""
    err, exe = drv.cuGraphInstantiate(g, 0)
    if not err:
        drv.cuGraphExecDestroy(exe)
    return err


def graphs_in_a_capture(r: Recorder, s: Setup) -> None:
    """What cuctx's GraphExec.launch and upload refuse on a capturing stream, and
    Graph.instantiate while this thread captures (thread-local mode: an H100 refuses
    cuGraphInstantiate of another graph and invalidates the capture)."""
    step, drv, stream = r.step, r.drv, s.stream
    g = r.graph("outside the capture")
    drv.cuGraphAddMemsetNode(g, None, 0, r.memset(s.allocs[0], 1, 1), s.ctx)
    x = drv.cuGraphInstantiate(g, 0)[1]

    for label, call in (
        ("cuGraphInstantiate of another graph", lambda: instantiate_once(drv, g)),
        ("cuGraphUpload", lambda: drv.cuGraphUpload(x, stream)),
        ("cuStreamIsCapturing", lambda: drv.cuStreamIsCapturing(stream)),
    ):
        step(
            f"begin capture thread-local: {label}",
            lambda: drv.cuStreamBeginCapture(stream, MODE.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
        )
        step(f"thread-local capture: {label}", call)
        step(f"status after [{label}]", lambda: drv.cuStreamIsCapturing(stream))
        step(f"end [{label}]", lambda: drv.cuStreamEndCapture(stream)[0])
    drv.cuGraphExecDestroy(x)


def instantiating_beside_captures(r: Recorder, s: Setup) -> None:
    """What cuctx's Graph.instantiate and AutoGraph rely on: cuGraphInstantiate (refused in
    a thread-local capture, `graphs_in_a_capture`) in the other modes, with this thread's
    mode relaxed, and beside another thread's capture; and an executable launched, uploaded
    or changed on a stream that does not capture while this thread captures."""
    step, drv, stream = r.step, r.drv, s.stream
    _, other = drv.cuStreamCreate(1)
    g = r.graph("beside captures")
    node = drv.cuGraphAddMemsetNode(g, None, 0, r.memset(s.allocs[0], 1, 1), s.ctx)[1]
    x = drv.cuGraphInstantiate(g, 0)[1]

    def instantiate():
        return instantiate_once(drv, g)

    relax = MODE.CU_STREAM_CAPTURE_MODE_RELAXED
    for label, mode, call, thread_mode in (
        ("global: cuGraphInstantiate", MODE.CU_STREAM_CAPTURE_MODE_GLOBAL, instantiate, None),
        ("relaxed: cuGraphInstantiate", relax, instantiate, None),
        (
            "thread-local, thread relaxed: cuGraphInstantiate",
            MODE.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            instantiate,
            relax,
        ),
        (
            "thread-local: cuGraphLaunch on another stream",
            MODE.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            lambda: drv.cuGraphLaunch(x, other),
            None,
        ),
        (
            "thread-local: cuGraphUpload on another stream",
            MODE.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            lambda: drv.cuGraphUpload(x, other),
            None,
        ),
        (
            "thread-local: cuGraphExecMemsetNodeSetParams",
            MODE.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            lambda: drv.cuGraphExecMemsetNodeSetParams(x, node, r.memset(s.allocs[0], 2, 1), s.ctx),
            None,
        ),
        (
            "thread-local: cuGraphExecUpdate",
            MODE.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            lambda: drv.cuGraphExecUpdate(x, g)[0],
            None,
        ),
    ):
        step(f"begin capture [{label}]", lambda mode=mode: drv.cuStreamBeginCapture(stream, mode))
        if thread_mode is not None:
            _, thread_mode = drv.cuThreadExchangeStreamCaptureMode(thread_mode)
        step(f"capture {label}", call)
        if thread_mode is not None:
            drv.cuThreadExchangeStreamCaptureMode(thread_mode)
        step(f"status after [{label}]", lambda: drv.cuStreamIsCapturing(stream))
        step(f"end [{label}]", lambda: drv.cuStreamEndCapture(stream)[0])

    for name, mode in (
        ("global", MODE.CU_STREAM_CAPTURE_MODE_GLOBAL),
        ("thread-local", MODE.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
    ):
        begun, instantiated, out = threading.Event(), threading.Event(), []

        def capture_there(mode=mode, begun=begun, instantiated=instantiated, out=out):
            drv.cuCtxPushCurrent(s.ctx)
            try:
                out.append(drv.cuStreamBeginCapture(stream, mode)[0].name)
            finally:
                begun.set()  # the main thread goes on, whatever happened here
            instantiated.wait()
            out.append(drv.cuStreamEndCapture(stream)[0].name)
            drv.cuCtxPopCurrent()

        t = threading.Thread(target=capture_there)
        t.start()
        begun.wait()
        step(f"another thread's {name} capture: cuGraphInstantiate", instantiate)
        instantiated.set()
        t.join()
        step(f"another thread's {name} capture: its begin and end", lambda out=out: out)
    drv.cuCtxSynchronize()
    drv.cuGraphExecDestroy(x)
    drv.cuStreamDestroy(other)
