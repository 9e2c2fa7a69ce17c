"""What the driver answers for CUDA graphs and stream capture: one scripted transcript of
driver calls, each step's result code and relevant outputs (node types, edges, update
results and error nodes, capture states, memory read back). Handles are written as the
names the script gave them, so transcripts from the sim and a GPU compare step by step.

Record on a GPU (dev tool):
    CUCTX_BACKEND=cuda PYTHONPATH=src python scripts/probe_graphs.py tests/driver/graphs_transcript.json
tests/driver/test_sim_graphs.py runs the same `transcript` on the sim and compares.
"""

from __future__ import annotations

import ctypes
import json
import sys
import tempfile
import threading
from pathlib import Path

import numpy as np
from cuda.bindings import driver as d

PTX = b"""
.version 8.0
.target sm_90
.address_size 64
.visible .entry put(.param .u64 p, .param .u32 v) {
  .reg .b64 %rd<3>; .reg .b32 %r<2>;
  ld.param.u64 %rd1, [p]; ld.param.u32 %r1, [v];
  cvta.to.global.u64 %rd2, %rd1; st.global.u32 [%rd2], %r1; ret;
}
.visible .entry other(.param .u64 p, .param .u32 v) { ret; }
"""
T = d.CUgraphNodeType
MODE = d.CUstreamCaptureMode
DEVICE, HOST = d.CUmemorytype.CU_MEMORYTYPE_DEVICE, d.CUmemorytype.CU_MEMORYTYPE_HOST
_HOST_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


def _put(grid, block, p, v):
    p.view(np.uint32, 1)[0] = v


def _other(grid, block, p, v):
    pass


class Recorder:
    """Runs steps and writes what they return with the script's names for handles."""

    def __init__(self, drv):
        self.drv = drv
        self.names: dict[tuple[str, int], str] = {}
        self.steps: list[list] = []
        self.keep: list = []  # parameter arrays and callbacks the driver may still read

    def name(self, handle, label: str):
        self.names[(type(handle).__name__, int(handle))] = label
        return handle

    def show(self, value):
        if isinstance(value, d.CUresult) or hasattr(value, "name") and hasattr(value, "value"):
            return value.name
        if isinstance(value, (list, tuple)):
            return [self.show(v) for v in value]
        if isinstance(value, d.CUgraphExecUpdateResultInfo):
            return {"result": value.result.name, "errorNode": self.show(value.errorNode),
                    "errorFromNode": self.show(value.errorFromNode)}
        if isinstance(value, d.CUgraphEdgeData):
            return [int(value.type), int(value.from_port), int(value.to_port)]
        if isinstance(value, d.cuuint64_t):
            return "id" if int(value) else 0
        if isinstance(value, (int, float, str, bool)) or value is None:
            return value
        if hasattr(value, "getPtr"):  # a handle
            kind = type(value).__name__
            return "null" if not int(value) else self.names.get((kind, int(value)), kind)
        return repr(value)

    def step(self, label: str, fn):
        """Run ``fn()``; record its result (a driver tuple, or anything printable)."""
        try:
            result = fn()
        except Exception as exc:  # noqa: BLE001 - the binding's own refusals are answers too
            self.steps.append([label, f"raised {type(exc).__name__}"])
            return None
        self.steps.append([label, self.show(result)])
        return result

    # -- builders ---------------------------------------------------------------------------

    def kernel(self, fn, ptr: int, value: int) -> d.CUDA_KERNEL_NODE_PARAMS:
        values = (ctypes.c_uint64 * 1)(ptr), (ctypes.c_uint32 * 1)(value)
        array = (ctypes.c_void_p * 2)(*[ctypes.addressof(v) for v in values])
        self.keep.append((values, array))
        params = d.CUDA_KERNEL_NODE_PARAMS()
        params.func = fn
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
    def copy(dst: int, src: int, nbytes: int, dst_kind=DEVICE, src_kind=DEVICE,
             height: int = 1) -> d.CUDA_MEMCPY3D:
        params = d.CUDA_MEMCPY3D()
        params.srcMemoryType, params.dstMemoryType = src_kind, dst_kind
        for prefix, kind, address in (("src", src_kind, src), ("dst", dst_kind, dst)):
            setattr(params, prefix + ("Host" if kind == HOST else "Device"), address)
            setattr(params, prefix + "Pitch", nbytes)
            setattr(params, prefix + "Height", height)
        params.WidthInBytes, params.Height, params.Depth = nbytes, height, 1
        return params

    def host(self, seen: list, tag: int) -> d.CUDA_HOST_NODE_PARAMS:
        callback = _HOST_FN(lambda data: seen.append(data))
        self.keep.append(callback)
        params = d.CUDA_HOST_NODE_PARAMS()
        params.fn = ctypes.cast(callback, ctypes.c_void_p).value
        params.userData = tag
        return params


def transcript(backend) -> list[list]:
    """The scripted steps on ``backend`` (cuctx's backend object: its driver, and on the
    sim its controls for the kernels' twins)."""
    drv = backend.driver
    r = Recorder(drv)
    drv.cuInit(0)
    _, dev = drv.cuDeviceGet(0)
    _, ctx = drv.cuDevicePrimaryCtxRetain(dev)
    drv.cuCtxPushCurrent(ctx)
    try:
        _explicit(r, drv, ctx, backend)
    finally:
        drv.cuCtxSynchronize()
        drv.cuCtxPopCurrent()
        drv.cuDevicePrimaryCtxRelease(dev)
    return r.steps


def _explicit(r, drv, ctx, backend):
    step = r.step
    _, mod = drv.cuModuleLoadData(PTX)
    _, put = drv.cuModuleGetFunction(mod, b"put")
    _, other = drv.cuModuleGetFunction(mod, b"other")
    if backend.sim is not None:
        backend.sim.set_kernel_twin(put, _put)
        backend.sim.set_kernel_twin(other, _other)
    _, stream = drv.cuStreamCreate(1)
    allocs = [int(drv.cuMemAlloc(256)[1]) for _ in range(3)]
    a, b, c = allocs
    for ptr in allocs:
        drv.cuMemsetD8Async(ptr, 0, 256, stream)
    _, pinned = drv.cuMemHostAlloc(256, 0)
    pinned = int(pinned)
    pageable = np.zeros(64, np.uint8)
    seen: list = []

    def read(ptr, count=4):
        drv.cuCtxSynchronize()
        out = np.zeros(count, np.uint32)
        drv.cuMemcpyDtoH(out.ctypes.data, ptr, out.nbytes)
        return out.tolist()

    def graph(label):
        result = step(f"cuGraphCreate {label}", lambda: drv.cuGraphCreate(0))
        return r.name(result[1], label)

    def add(label, kind, g, *args, after=()):
        fn = getattr(drv, f"cuGraphAdd{kind}Node")
        result = step(f"add {kind} {label}", lambda: fn(g, list(after), len(after), *args))
        if result is not None and not result[0]:
            r.name(result[1], label)
        return result[1] if result is not None else None

    def instantiate(label, g, flags=0):
        result = step(f"instantiate {label}", lambda: drv.cuGraphInstantiate(g, flags))
        if result is not None and not result[0]:
            r.name(result[1], label)
        return result[1] if result is not None else None

    # -- explicit graphs ----------------------------------------------------------------------
    step("cuGraphCreate flags=1", lambda: drv.cuGraphCreate(1))
    g = graph("G")
    k = add("k", "Kernel", g, r.kernel(put, a, 1))
    m = add("m", "Memset", g, r.memset(a + 4, 2, 3), ctx, after=[k])
    cp = add("cp", "Memcpy", g, r.copy(b, a, 16), ctx, after=[m])
    h = add("h", "Host", g, r.host(seen, 7), after=[cp])
    e = add("e", "Empty", g, after=[k])
    _, event = drv.cuEventCreate(0)
    add("rec", "EventRecord", g, event, after=[h])
    add("wait", "EventWait", g, event, after=[e])
    add("dup deps", "Empty", g, after=[k, k])
    _, foreign_graph = drv.cuGraphCreate(0)
    foreign = drv.cuGraphAddEmptyNode(foreign_graph, None, 0)[1]
    add("foreign dep", "Empty", g, after=[foreign])
    step("add Empty to a null graph", lambda: drv.cuGraphAddEmptyNode(d.CUgraph(0), None, 0))
    step("add Memset outside any allocation",
         lambda: drv.cuGraphAddMemsetNode(g, None, 0, r.memset(16, 0, 4), ctx))
    step("add Memset elementSize 3", lambda: drv.cuGraphAddMemsetNode(
        g, None, 0, r.memset(a, 0, 4, size=3), ctx))
    step("add Memset misaligned", lambda: drv.cuGraphAddMemsetNode(
        g, None, 0, r.memset(a + 2, 0, 4), ctx))
    step("add Memcpy past the end", lambda: drv.cuGraphAddMemcpyNode(
        g, None, 0, r.copy(b, a, 512), ctx))
    step("add Host null fn", lambda: drv.cuGraphAddHostNode(g, None, 0,
                                                            d.CUDA_HOST_NODE_PARAMS()))
    step("add Memcpy pageable host", lambda: drv.cuGraphAddMemcpyNode(
        g, None, 0, r.copy(pageable.ctypes.data, a, 16, dst_kind=HOST), ctx)[0])
    child = graph("child")
    add("ck", "Kernel", child, r.kernel(put, c, 5))
    add("child", "ChildGraph", g, child)
    step("GetNodes count", lambda: drv.cuGraphGetNodes(g))
    step("GetNodes", lambda: drv.cuGraphGetNodes(g, 10))
    step("GetRootNodes", lambda: drv.cuGraphGetRootNodes(g, 3))
    step("GetEdges count", lambda: drv.cuGraphGetEdges(g))
    step("GetEdges", lambda: drv.cuGraphGetEdges(g, 6))
    step("node types", lambda: types(drv, g))
    step("NodeGetDependencies of cp", lambda: drv.cuGraphNodeGetDependencies(cp, 2))
    step("instantiate UPLOAD flag", lambda: drv.cuGraphInstantiate(g, 2))
    step("instantiate AUTO_FREE|DEVICE_LAUNCH", lambda: drv.cuGraphInstantiate(g, 5))
    step("instantiate DEVICE_LAUNCH with host nodes", lambda: drv.cuGraphInstantiate(g, 4)[0])
    x = instantiate("X", g)
    step("upload", lambda: drv.cuGraphUpload(x, stream))
    step("launch", lambda: drv.cuGraphLaunch(x, stream))
    step("sync", lambda: drv.cuStreamSynchronize(stream))
    step("memory after launch", lambda: (read(a), read(b), read(c, 1), seen[:]))
    step("launch legacy stream", lambda: drv.cuGraphLaunch(x, 0))
    step("launch null exec", lambda: drv.cuGraphLaunch(d.CUgraphExec(0), stream))

    # -- per-node parameters of an executable -------------------------------------------------
    step("kernel set params", lambda: drv.cuGraphExecKernelNodeSetParams(
        x, k, r.kernel(put, a, 10)))
    step("kernel set params other function", lambda: drv.cuGraphExecKernelNodeSetParams(
        x, k, r.kernel(other, a, 10)))
    step("kernel set params on memset node", lambda: drv.cuGraphExecKernelNodeSetParams(
        x, m, r.kernel(put, a, 10)))
    for label, params in (("value and address", r.memset(a + 8, 3, 3)),
                          ("narrower", r.memset(a + 4, 3, 2)),
                          ("wider", r.memset(a + 4, 3, 8)),
                          ("element size 1", r.memset(a + 4, 3, 12, size=1)),
                          ("2D", r.memset(a + 4, 3, 3, height=2, pitch=16)),
                          ("back", r.memset(a + 4, 4, 3))):
        step(f"memset set params {label}",
             lambda params=params: drv.cuGraphExecMemsetNodeSetParams(x, m, params, ctx))
    for label, params in (("other buffer", r.copy(c, a, 16)),
                          ("bigger", r.copy(b, a, 64)),
                          ("to pinned host", r.copy(pinned, a, 16, dst_kind=HOST)),
                          ("2D", r.copy(b, a, 8, height=2)),
                          ("back", r.copy(b, a, 16))):
        step(f"memcpy set params {label}",
             lambda params=params: drv.cuGraphExecMemcpyNodeSetParams(x, cp, params, ctx))
    step("host set params", lambda: drv.cuGraphExecHostNodeSetParams(x, h, r.host(seen, 8)))
    step("set params with a foreign node", lambda: drv.cuGraphExecKernelNodeSetParams(
        x, foreign, r.kernel(put, a, 1)))
    for label, node in (("kernel", k), ("memset", m), ("memcpy", cp), ("host", h),
                        ("empty", e)):
        step(f"disable {label}", lambda node=node: drv.cuGraphNodeSetEnabled(x, node, 0))
        step(f"enabled? {label}", lambda node=node: drv.cuGraphNodeGetEnabled(x, node))
        step(f"enable {label}", lambda node=node: drv.cuGraphNodeSetEnabled(x, node, 1))
    step("disable memset, launch", lambda: (drv.cuGraphNodeSetEnabled(x, m, 0),
                                            drv.cuMemsetD32Async(a, 0, 16, stream),
                                            drv.cuGraphLaunch(x, stream)))
    step("memory after the second launch", lambda: (read(a), read(b), seen[:]))
    step("exec destroy", lambda: drv.cuGraphExecDestroy(x))

    _updates(r, drv, ctx, backend, put, other, stream, allocs, pinned, event, graph, add,
             instantiate)
    _capture(r, drv, ctx, put, stream, allocs, pinned, pageable, read, seen)
    _memory_and_conditionals(r, drv, ctx, stream, graph, add, instantiate, read, allocs)


def _updates(r, drv, ctx, backend, put, other, stream, allocs, pinned, event, graph, add,
             instantiate):
    """cuGraphExecUpdate: a base graph (kernel -> memset -> copy, a host node, an event
    record, a child graph) against variants, each on a fresh executable."""
    step = r.step
    a, b, c = allocs
    seen: list = []
    _, event2 = drv.cuEventCreate(0)
    _, dev = drv.cuCtxGetDevice()
    _, ctx2 = drv.cuCtxCreate(None, 0, dev)
    _, mod2 = drv.cuModuleLoadData(PTX)
    _, put2 = drv.cuModuleGetFunction(mod2, b"put")
    if backend.sim is not None:
        backend.sim.set_kernel_twin(put2, _put)
    drv.cuCtxPopCurrent()

    def base(name, kernel=None, memset=None, copy=None, host=7, record=event, child=5,
             extra=False, swap=False, cross=False):
        g = graph(name)
        k = add(f"{name}.k", "Kernel", g, kernel or r.kernel(put, a, 1))
        m = add(f"{name}.m", "Memset", g, memset or r.memset(a + 4, 2, 4), ctx,
                after=[] if swap else [k])
        cp = add(f"{name}.cp", "Memcpy", g, copy or r.copy(b, a, 16), ctx,
                 after=[k] if cross else [m])
        add(f"{name}.h", "Host", g, r.host(seen, host), after=[cp])
        add(f"{name}.rec", "EventRecord", g, record, after=[cp])
        inner = graph(f"{name}.inner")
        add(f"{name}.ik", "Kernel", inner, r.kernel(put, c, child))
        add(f"{name}.child", "ChildGraph", g, inner)
        if extra:
            add(f"{name}.extra", "Empty", g)
        return g

    g0 = base("U0")
    variants = {
        "same structure, new values": dict(kernel=r.kernel(put, b, 3), memset=r.memset(b, 4, 4),
                                           copy=r.copy(c, b, 16), host=9, child=6),
        "an extra node": dict(extra=True),
        "a dependency removed": dict(swap=True),
        "a dependency moved": dict(cross=True),
        "kernel: another function": dict(kernel=r.kernel(other, a, 1)),
        "kernel: a function of another context": dict(kernel=r.kernel(put2, a, 1)),
        "kernel: another grid": dict(kernel=_grid(r.kernel(put, a, 1), 2)),
        "memset: narrower": dict(memset=r.memset(a + 4, 2, 2)),
        "memset: wider": dict(memset=r.memset(a + 4, 2, 16)),
        "memset: element size 1": dict(memset=r.memset(a + 4, 2, 16, size=1)),
        "memset: element size 2 same bytes": dict(memset=r.memset(a + 4, 2, 8, size=2)),
        "memset: 2D": dict(memset=r.memset(a + 4, 2, 2, height=2, pitch=16)),
        "memcpy: to pinned host": dict(copy=r.copy(pinned, a, 16, dst_kind=HOST)),
        "memcpy: bigger": dict(copy=r.copy(b, a, 128)),
        "memcpy: 2D": dict(copy=r.copy(b, a, 8, height=2)),
        "event record: another event": dict(record=event2),
    }
    for label, kwargs in variants.items():
        g1 = base(f"V[{label}]", **kwargs)
        x = instantiate(f"U0 for {label}", g0)
        step(f"update: {label}", lambda x=x, g1=g1: drv.cuGraphExecUpdate(x, g1))
        step(f"launch after update: {label}", lambda x=x: drv.cuGraphLaunch(x, stream))
        step(f"sync after update: {label}", lambda: drv.cuStreamSynchronize(stream))
        drv.cuGraphExecDestroy(x)
    kinds = graph("kinds")
    add("kinds.m", "Memset", kinds, r.memset(a, 1, 4), ctx)
    x = instantiate("kinds exec", kinds)
    swapped = graph("swapped")
    add("swapped.k", "Kernel", swapped, r.kernel(put, a, 1))
    step("update: node type changed", lambda: drv.cuGraphExecUpdate(x, swapped))
    step("update: null graph", lambda: drv.cuGraphExecUpdate(x, d.CUgraph(0)))
    drv.cuCtxDestroy(ctx2)
    drv.cuCtxSetCurrent(ctx)


def types(drv, graph) -> list:
    """The node types of ``graph`` in the order cuGraphGetNodes lists them."""
    count = drv.cuGraphGetNodes(graph)[2]
    return [drv.cuGraphNodeGetType(n)[1] for n in drv.cuGraphGetNodes(graph, count)[1]]


def _grid(params, n):
    params.gridDimX = n
    return params


def _capture(r, drv, ctx, put, stream, allocs, pinned, pageable, read, seen):
    step = r.step
    a, b, c = allocs
    _, blocking = drv.cuStreamCreate(0)
    _, side = drv.cuStreamCreate(1)
    _, fork = drv.cuEventCreate(0)
    _, join = drv.cuEventCreate(0)
    _, outside = drv.cuEventCreate(0)
    drv.cuEventRecord(outside, stream)

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

    step("begin capture on the legacy stream",
         lambda: drv.cuStreamBeginCapture(0, MODE.CU_STREAM_CAPTURE_MODE_GLOBAL))
    step("end capture of a stream not capturing", lambda: drv.cuStreamEndCapture(stream))
    step("is capturing (idle)", lambda: drv.cuStreamIsCapturing(stream))
    step("capture info (idle)", lambda: drv.cuStreamGetCaptureInfo(stream))
    begin("C1")
    step("begin capture again", lambda: drv.cuStreamBeginCapture(
        stream, MODE.CU_STREAM_CAPTURE_MODE_GLOBAL))
    step("is capturing", lambda: drv.cuStreamIsCapturing(stream))
    step("captured memset", lambda: drv.cuMemsetD32Async(a, 6, 4, stream))
    step("captured launch", lambda: launch(stream, 8))
    step("captured copy to pinned", lambda: drv.cuMemcpyDtoHAsync(pinned, a, 16, stream))
    step("captured host function", lambda: drv.cuLaunchHostFunc(
        stream, r.host(seen, 11).fn, 11))
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
        "pageable async copy": lambda: drv.cuMemcpyHtoDAsync(a, pageable.ctypes.data, 16,
                                                             stream),
        "pageable synchronous copy": lambda: drv.cuMemcpyHtoD(a, pageable.ctypes.data, 16),
        "legacy stream memset": lambda: drv.cuMemsetD32Async(a, 1, 1, 0),
        "wait on an event recorded outside": lambda: drv.cuStreamWaitEvent(stream, outside, 0),
        "external wait on an event recorded outside": lambda: drv.cuStreamWaitEvent(
            stream, outside, 1),
        "query an event recorded in the capture": lambda: (drv.cuEventRecord(fork, stream),
                                                           drv.cuEventQuery(fork)),
        "synchronize an event recorded in the capture": lambda: (
            drv.cuEventRecord(fork, stream), drv.cuEventSynchronize(fork)),
        "cuStreamSynchronize of another stream": lambda: drv.cuStreamSynchronize(side),
    }
    for mode in (MODE.CU_STREAM_CAPTURE_MODE_GLOBAL, MODE.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
                 MODE.CU_STREAM_CAPTURE_MODE_RELAXED):
        for label, breaker in breakers.items():
            label = f"{mode.name.removeprefix('CU_STREAM_CAPTURE_MODE_')}: {label}"
            begin(label, mode=mode)
            step(f"work before [{label}]", lambda: drv.cuMemsetD32Async(a, 1, 1, stream))
            step(f"[{label}]", breaker)
            step(f"status after [{label}]", lambda: drv.cuStreamIsCapturing(stream))
            step(f"work after [{label}]", lambda: drv.cuMemsetD32Async(a, 1, 1, stream))
            step(f"end [{label}]", lambda: drv.cuStreamEndCapture(stream)[0])
            step(f"eager work after [{label}]", lambda: (
                drv.cuMemsetD32Async(a, 2, 1, stream), drv.cuStreamSynchronize(stream)))
            for event in (fork, outside):
                drv.cuEventRecord(event, stream)  # out of the capture again
            drv.cuStreamSynchronize(stream)

    begin("legacy with a blocking stream", s=blocking)
    step("is capturing: legacy", lambda: drv.cuStreamIsCapturing(0))
    step("capture info: legacy", lambda: drv.cuStreamGetCaptureInfo(0)[0])
    step("legacy memset while a blocking stream captures",
         lambda: drv.cuMemsetD32Async(a, 1, 1, 0))
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
    step("exchange capture mode", lambda: drv.cuThreadExchangeStreamCaptureMode(
        MODE.CU_STREAM_CAPTURE_MODE_RELAXED))
    step("exchange capture mode back", lambda: drv.cuThreadExchangeStreamCaptureMode(
        MODE.CU_STREAM_CAPTURE_MODE_GLOBAL))

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
    step("memory nodes: launch twice", lambda: (drv.cuGraphLaunch(mx[1], stream),
                                                drv.cuGraphLaunch(mx[1], stream),
                                                drv.cuStreamSynchronize(stream)))
    step("memory nodes: value", lambda: ctypes.c_uint32.from_address(pinned).value)
    step("memory nodes: second instantiate", lambda: drv.cuGraphInstantiate(mg, 0))

    x = drv.cuGraphInstantiate(g, 0)[1]
    begin("graph launch")
    step("capture: cuGraphLaunch", lambda: drv.cuGraphLaunch(x, stream))
    lg = end("graph launch")
    step("graph launch: node types", lambda: types(drv, lg))


def _memory_and_conditionals(r, drv, ctx, stream, graph, add, instantiate, read, allocs):
    step = r.step
    a = allocs[0]
    _, dev = drv.cuCtxGetDevice()

    def alloc_params(nbytes=64):
        params = d.CUDA_MEM_ALLOC_NODE_PARAMS()
        params.poolProps.allocType = d.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        params.poolProps.location.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        params.poolProps.location.id = int(dev)
        params.bytesize = nbytes
        return params

    g = graph("M")
    params = alloc_params()
    node = add("M.alloc", "MemAlloc", g, params)
    ptr = int(params.dptr)
    step("alloc node: dptr set", lambda: ptr != 0)
    add("M.fill", "Memset", g, r.memset(ptr, 5, 16), ctx, after=[node])
    step("alloc node of 0 bytes", lambda: drv.cuGraphAddMemAllocNode(
        g, None, 0, alloc_params(0))[0])
    step("free node of a cuMemAlloc pointer", lambda: drv.cuGraphAddMemFreeNode(
        g, None, 0, a)[0])
    x = instantiate("M exec", g)
    step("M: second instantiate", lambda: drv.cuGraphInstantiate(g, 0)[0])
    step("M: launch", lambda: (drv.cuGraphLaunch(x, stream), drv.cuStreamSynchronize(stream)))
    step("M: value", lambda: read(ptr, 2))
    step("M: relaunch unfreed", lambda: drv.cuGraphLaunch(x, stream))
    step("M: cuMemFreeAsync", lambda: drv.cuMemFreeAsync(ptr, stream))
    step("M: relaunch after the free", lambda: (drv.cuGraphLaunch(x, stream),
                                                drv.cuStreamSynchronize(stream)))
    step("M: exec destroy", lambda: drv.cuGraphExecDestroy(x))
    auto = instantiate("M auto-free", g, 1)
    step("M: auto-free relaunch", lambda: (drv.cuGraphLaunch(auto, stream),
                                           drv.cuGraphLaunch(auto, stream),
                                           drv.cuStreamSynchronize(stream)))
    free = graph("F")
    add("F.free", "MemFree", free, ptr)
    step("second free node", lambda: drv.cuGraphAddMemFreeNode(free, None, 0, ptr)[0])
    step("child graph with memory nodes", lambda: drv.cuGraphAddChildGraphNode(
        graph("holder"), None, 0, g)[0])
    drv.cuGraphExecDestroy(auto)

    def conditional(label, g, kind, size, default=0, flags=1):
        err, handle = drv.cuGraphConditionalHandleCreate(g, ctx, default, flags)
        params = d.CUgraphNodeParams()
        params.type = T.CU_GRAPH_NODE_TYPE_CONDITIONAL
        params.conditional.handle, params.conditional.type = handle, kind
        params.conditional.size, params.conditional.ctx = size, ctx
        result = step(f"add conditional {label}", lambda: drv.cuGraphAddNode(
            g, None, None, 0, params))
        bodies = params.conditional.phGraph_out if result and not result[0] else []
        step(f"conditional {label}: bodies", lambda: len([b for b in bodies if int(b)]))
        return bodies

    cond = d.CUgraphConditionalNodeType
    c = graph("Cond")
    if_bodies = conditional("IF default 1", c, cond.CU_GRAPH_COND_TYPE_IF, 1, default=1)
    if if_bodies:
        add("if.m", "Memset", if_bodies[0], r.memset(a, 7, 1), ctx)
        step("host node in a body", lambda: drv.cuGraphAddHostNode(
            if_bodies[0], None, 0, r.host([], 1))[0])
    else_bodies = conditional("IF/ELSE default 0", c, cond.CU_GRAPH_COND_TYPE_IF, 2)
    if len(else_bodies) == 2:
        add("else.m", "Memset", else_bodies[1], r.memset(a + 4, 8, 1), ctx)
    while_bodies = conditional("WHILE default 0", c, cond.CU_GRAPH_COND_TYPE_WHILE, 1)
    if while_bodies:
        add("while.m", "Memset", while_bodies[0], r.memset(a + 8, 9, 1), ctx)
    conditional("WHILE size 2", graph("bad while"), cond.CU_GRAPH_COND_TYPE_WHILE, 2)
    drv.cuMemsetD32Async(a, 0, 4, stream)
    cx = instantiate("Cond exec", c)
    step("Cond: launch", lambda: (drv.cuGraphLaunch(cx, stream), drv.cuStreamSynchronize(stream)))
    step("Cond: memory", lambda: read(a))
    unused = graph("unused handle")
    drv.cuGraphConditionalHandleCreate(unused, ctx, 0, 0)
    step("instantiate with an unused handle", lambda: drv.cuGraphInstantiate(unused, 0)[0])
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "g.dot"
        step("dot print", lambda: drv.cuGraphDebugDotPrint(c, str(path).encode(), 0))
        step("dot file written", lambda: path.exists())
    step("dot print to a missing directory", lambda: drv.cuGraphDebugDotPrint(
        c, b"/nonexistent-dir/g.dot", 0))


def main() -> None:
    import cuctx
    backend = cuctx.backend()
    result = {"backend": backend.name, "steps": transcript(backend)}
    if backend.name == "cuda":
        result["driver"] = d.cuDriverGetVersion()[1]
    text = json.dumps(result, indent=1)
    if len(sys.argv) > 1:
        Path(sys.argv[1]).write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
