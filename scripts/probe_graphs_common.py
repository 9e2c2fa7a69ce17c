"""The machinery of scripts/probe_graphs.py: the Recorder (steps, handle names, parameter
builders), the test module's PTX and its sim twins, and small queries the steps share."""

from __future__ import annotations

import ctypes

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


def put_twin(grid, block, p, v):
    p.view(np.uint32, 1)[0] = v


def other_twin(grid, block, p, v):
    pass


class Setup:
    """What every part of the transcript uses: the context, the module's two kernels, a
    non-blocking stream, three zeroed 256-byte buffers, pinned and pageable host memory."""

    def __init__(self, drv, backend, ctx):
        self.ctx = ctx
        _, mod = drv.cuModuleLoadData(PTX)
        _, self.put = drv.cuModuleGetFunction(mod, b"put")
        _, self.other = drv.cuModuleGetFunction(mod, b"other")
        if backend.sim is not None:
            backend.sim.set_kernel_twin(self.put, put_twin)
            backend.sim.set_kernel_twin(self.other, other_twin)
        _, self.stream = drv.cuStreamCreate(1)
        self.allocs = [int(drv.cuMemAlloc(256)[1]) for _ in range(3)]
        for ptr in self.allocs:
            drv.cuMemsetD8Async(ptr, 0, 256, self.stream)
        self.pinned = int(drv.cuMemHostAlloc(256, 0)[1])
        self.pageable = np.zeros(64, np.uint8)
        self.seen: list = []  # what host nodes and host functions were called with


class NodeParams:
    """Node parameter structs, with the ctypes arrays and callbacks they point into, kept
    while the driver may read them. The probe's `Recorder` and the sim's graph tests
    (tests/driver/test_sim_graphs.py) build their nodes with it."""

    def __init__(self):
        self.keep: list = []

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
    def memset(
        ptr: int, value: int, width: int, size: int = 4, height: int = 1, pitch: int = 0
    ) -> d.CUDA_MEMSET_NODE_PARAMS:
        params = d.CUDA_MEMSET_NODE_PARAMS()
        params.dst, params.value, params.elementSize = ptr, value, size
        params.width, params.height, params.pitch = width, height, pitch
        return params

    @staticmethod
    def copy(
        dst: int, src: int, nbytes: int, dst_kind=DEVICE, src_kind=DEVICE, height: int = 1
    ) -> d.CUDA_MEMCPY3D:
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


class Recorder(NodeParams):
    """Runs steps and writes what they return with the script's names for handles."""

    def __init__(self, drv):
        super().__init__()
        self.drv = drv
        self.names: dict[tuple[str, int], str] = {}
        self.steps: list[list] = []

    def name(self, handle, label: str):
        self.names[(type(handle).__name__, int(handle))] = label
        return handle

    def show(self, value):
        if isinstance(value, d.CUresult) or hasattr(value, "name") and hasattr(value, "value"):
            return value.name
        if isinstance(value, (list, tuple)):
            return [self.show(v) for v in value]
        if isinstance(value, d.CUgraphExecUpdateResultInfo):
            return {
                "result": value.result.name,
                "errorNode": self.show(value.errorNode),
                "errorFromNode": self.show(value.errorFromNode),
            }
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

    def graph(self, label: str):
        result = self.step(f"cuGraphCreate {label}", lambda: self.drv.cuGraphCreate(0))
        return self.name(result[1], label)

    def add(self, label: str, kind: str, g, *args, after=()):
        """cuGraphAdd<kind>Node as a step; the node (named ``label``) or None."""
        fn = getattr(self.drv, f"cuGraphAdd{kind}Node")
        result = self.step(f"add {kind} {label}", lambda: fn(g, list(after), len(after), *args))
        if result is not None and not result[0]:
            self.name(result[1], label)
        return result[1] if result is not None else None

    def instantiate(self, label: str, g, flags: int = 0):
        result = self.step(f"instantiate {label}", lambda: self.drv.cuGraphInstantiate(g, flags))
        if result is not None and not result[0]:
            self.name(result[1], label)
        return result[1] if result is not None else None

    def read(self, ptr: int, count: int = 4) -> list[int]:
        """``count`` words at ``ptr`` once all work of the context is done."""
        self.drv.cuCtxSynchronize()
        out = np.zeros(count, np.uint32)
        self.drv.cuMemcpyDtoH(out.ctypes.data, ptr, out.nbytes)
        return out.tolist()

    def forget(self, handle) -> None:
        """``handle`` was destroyed: the driver may hand its value out again."""
        self.names.pop((type(handle).__name__, int(handle)), None)


def types(drv, graph) -> list:
    """The node types of ``graph`` in the order cuGraphGetNodes lists them."""
    count = drv.cuGraphGetNodes(graph)[2]
    return [drv.cuGraphNodeGetType(n)[1] for n in drv.cuGraphGetNodes(graph, count)[1]]


def with_grid(params, n):
    params.gridDimX = n
    return params
