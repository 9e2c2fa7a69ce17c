"""What graph nodes of the sim do: one *work* object per node, fixed when the node is made
or its parameters are set (a set-params call replaces the work, never changes it), so an
executable's nodes can share works with the graph they were instantiated from.

Each work checks its parameters when it is made, exactly where the driver does (adding the
node), and gives ``op(driver)``: the operation a launch queues on the stream. Memory is
resolved again when that operation runs (a graph is launched many times; its memory may be
freed meanwhile): memory that is no longer live then is CUDA_ERROR_ILLEGAL_ADDRESS, which
is sticky, as a GPU's fault would be.
"""

from __future__ import annotations

import ctypes

import numpy as np
from cuda.bindings.driver import (
    CUDA_KERNEL_NODE_PARAMS,
    CUDA_MEMCPY3D,
    CUDA_MEMSET_NODE_PARAMS,
    CUcontext,
    CUfunction,
    CUgraphNodeType,
    CUkernel,
    CUmemorytype,
)

from ._cargs import size_t, unsigned
from ._common import ILLEGAL_ADDRESS, INVALID_VALUE, OK
from ._launches import Launch
from ._library import SimModule
from ._timing import HOST, KERNEL, LAUNCH_NS, MEMSET, copy_kind, duration
from ._unified import host_located

T = CUgraphNodeType
_COPY_FIELDS = tuple(
    name for name in dir(CUDA_MEMCPY3D()) if not name.startswith("_") and name != "getPtr"
)
_ELEMENT = {1: np.uint8, 2: np.uint16, 4: np.uint32}


class KernelWork:
    """A kernel node: a checked `Launch` (parameter bytes copied when it was made)."""

    type = T.CU_GRAPH_NODE_TYPE_KERNEL
    activity = KERNEL  # its kind on the activity feed and in the timing model (`_timing`)
    __slots__ = ("launch", "_params")

    def __init__(self, launch: Launch):
        self.launch = launch
        self._params = None  # the void** array cuGraphKernelNodeGetParams hands out

    @property
    def ctx(self):
        return self.launch.ctx

    def cost(self) -> int:
        return LAUNCH_NS  # and its bytes, counted when it runs

    def op(self, driver):
        return self.launch.run(driver)

    def label(self) -> str:
        return f"kernel {self.launch.kernel.name}"

    def params(self) -> CUDA_KERNEL_NODE_PARAMS:
        """The node's parameters as cuGraphKernelNodeGetParams returns them: the driver's
        own copy of the argument bytes, valid while the node's parameters stay."""
        launch = self.launch
        if self._params is None:
            buffers = [ctypes.create_string_buffer(raw, max(len(raw), 1)) for raw in launch.raw]
            array = (ctypes.c_void_p * max(len(buffers), 1))(
                *[ctypes.addressof(b) for b in buffers]
            )
            self._params = (array, buffers)
        out = CUDA_KERNEL_NODE_PARAMS()
        if isinstance(launch.kernel.owner, SimModule):
            out.func = CUfunction(launch.kernel.handle)
        else:
            out.kern = CUkernel(launch.kernel.handle)
        out.gridDimX, out.gridDimY, out.gridDimZ = launch.grid
        out.blockDimX, out.blockDimY, out.blockDimZ = launch.block
        out.sharedMemBytes = launch.shared
        out.ctx = CUcontext(launch.ctx.handle)
        out.kernelParams = ctypes.addressof(self._params[0]) if launch.raw else 0
        return out


class CopyWork:
    """A memcpy node: a copy of the caller's CUDA_MEMCPY3D, planned again when it runs."""

    type = T.CU_GRAPH_NODE_TYPE_MEMCPY
    __slots__ = ("copy", "ctx", "nbytes", "kinds", "devices")

    def __init__(self, copy: CUDA_MEMCPY3D, ctx, nbytes: int, kinds, devices):
        self.copy = copy
        self.ctx = ctx
        self.nbytes = nbytes
        self.kinds = kinds  # (source, destination) CUmemorytype as given
        self.devices = devices  # (source, destination) device ordinal, None for host memory

    @property
    def activity(self) -> str:
        source, target = self.devices
        return copy_kind(source is None, target is None, source != target)

    def cost(self) -> int:
        return duration(self.activity, self.nbytes, 1.0)

    def op(self, driver):
        copy = self.copy

        def run():
            err, plan = driver._pitched_plan(copy, copy.Depth, three_d=True)
            if err:
                return ILLEGAL_ADDRESS  # its memory went away since the node was made
            return plan[1]() if plan is not None else None

        return run

    def label(self) -> str:
        return "copy node"


class MemsetWork:
    """A memset node: ``height`` rows of ``width`` elements of ``size`` bytes, ``pitch``
    bytes apart, at ``dst``."""

    type = T.CU_GRAPH_NODE_TYPE_MEMSET
    __slots__ = ("dst", "pitch", "value", "size", "width", "height", "ctx", "device")

    def __init__(self, dst, pitch, value, size, width, height, ctx, device):
        self.dst, self.pitch, self.value, self.size = dst, pitch, value, size
        self.width, self.height, self.ctx, self.device = width, height, ctx, device

    @property
    def extent(self) -> int:
        return (self.height - 1) * self.pitch + self.width * self.size

    activity = MEMSET

    @property
    def nbytes(self) -> int:
        return self.width * self.height * self.size

    def cost(self) -> int:
        return duration(MEMSET, self.nbytes, 1.0)

    def op(self, driver):
        dst, extent, height, width = self.dst, self.extent, self.height, self.width
        pitch, size = self.pitch, self.size
        value = self.value & ((1 << 8 * size) - 1)

        def run():
            span = driver._device_span(dst, extent)
            if span is None:
                return ILLEGAL_ADDRESS
            err, view = span.get()
            if err:
                return err
            rows = np.ndarray(
                (height, width),
                _ELEMENT[size],
                buffer=view,
                strides=(pitch if height > 1 else width * size, size),
            )
            rows[...] = value

        return run

    def label(self) -> str:
        return "memset node"


class HostWork:
    """A host node: a C function pointer and its argument."""

    type = T.CU_GRAPH_NODE_TYPE_HOST
    activity = HOST
    ctx = None
    __slots__ = ("fn", "data")

    def __init__(self, fn: int, data: int):
        self.fn = fn
        self.data = data

    def cost(self) -> int:
        return 0

    def op(self, driver):
        return driver._host_call(self.fn, self.data)

    def label(self) -> str:
        return "host node"


class EmptyWork:
    type = T.CU_GRAPH_NODE_TYPE_EMPTY
    ctx = None
    __slots__ = ()

    def cost(self) -> int:
        return 0

    def op(self, driver):
        return None

    def label(self) -> str:
        return "empty node"


class EventWork:
    """An event record or wait node (the launch handles both: markers and waits)."""

    __slots__ = ("type", "event")

    def __init__(self, kind, event):
        self.type = kind
        self.event = event

    @property
    def ctx(self):
        return self.event.ctx


class ChildWork:
    """A child graph node: the graph it holds (a clone made when the node was added)."""

    type = T.CU_GRAPH_NODE_TYPE_GRAPH
    ctx = None
    __slots__ = ("graph",)

    def __init__(self, graph):
        self.graph = graph


# -- making works from the driver's parameter structs, with its checks ------------------------


def kernel_work(driver, params: CUDA_KERNEL_NODE_PARAMS):
    """(CUresult, KernelWork): ``func`` when set (a CUfunction runs in its module's context,
    a CUkernel cast to one in the current context), else ``kern`` in ``ctx`` (null: the
    current context)."""
    if not isinstance(params, CUDA_KERNEL_NODE_PARAMS):
        raise TypeError(
            f"Argument 'nodeParams' has incorrect type (expected "
            f"cuda.bindings.driver.CUDA_KERNEL_NODE_PARAMS, got "
            f"{type(params).__name__})"
        )
    handle = int(params.func) or int(params.kern)
    kernel = driver._kernel(handle)
    if kernel is None:
        return INVALID_VALUE, None
    owner_ctx = getattr(kernel.owner, "ctx", None)
    if owner_ctx is not None:
        err, ctx = driver._work_context(owner_ctx)
    elif not int(params.func) and int(params.ctx):
        target = driver._lookup(params.ctx)
        if target is None:
            return INVALID_VALUE, None
        err, ctx = driver._work_context(target)
    else:
        err, ctx = driver._work_context()
    if err:
        return err, None
    grid = (int(params.gridDimX), int(params.gridDimY), int(params.gridDimZ))
    block = (int(params.blockDimX), int(params.blockDimY), int(params.blockDimZ))
    err, launch = driver._prepared_launch(
        kernel,
        ctx,
        grid,
        block,
        int(params.sharedMemBytes),
        int(params.kernelParams or 0),
        int(params.extra or 0),
    )
    if err:
        return err, None
    return OK, KernelWork(launch)


def copy_work(driver, copy: CUDA_MEMCPY3D, ctx, reach_from=None):
    """(CUresult, CopyWork), checked now as cuMemcpy3DAsync checks its copy: its device
    memory against ``reach_from`` (a context; default: the node's)."""
    if not isinstance(copy, CUDA_MEMCPY3D):
        raise TypeError(
            f"Argument 'copyParams' has incorrect type (expected "
            f"cuda.bindings.driver.CUDA_MEMCPY3D, got {type(copy).__name__})"
        )
    err, ctx = _node_context(driver, ctx)
    if err:
        return err, None
    own = CUDA_MEMCPY3D()
    for name in _COPY_FIELDS:
        try:
            setattr(own, name, getattr(copy, name))
        except ValueError:  # a memory type never set: the plan below refuses it
            pass
    err, _ = driver._pitched_plan(own, own.Depth, True, reach_from or ctx)
    if err:
        return err, None
    kinds, devices = [], []
    for prefix in ("src", "dst"):
        kind = getattr(own, prefix + "MemoryType")
        address = int(
            getattr(own, prefix + ("Host" if kind == CUmemorytype.CU_MEMORYTYPE_HOST else "Device"))
        )
        block = driver._block_at(address) if kind != CUmemorytype.CU_MEMORYTYPE_HOST else None
        kinds.append(kind)
        # (a host pool's memory is host memory: `_unified`)
        devices.append(block.device if block is not None and not host_located(block) else None)
    nbytes = own.WidthInBytes * own.Height * own.Depth
    return OK, CopyWork(own, ctx, nbytes, tuple(kinds), tuple(devices))


def memset_work(driver, params: CUDA_MEMSET_NODE_PARAMS, ctx):
    """(CUresult, MemsetWork): element size 1, 2 or 4, an aligned destination, rows that
    fit their pitch, all inside one live allocation."""
    if not isinstance(params, CUDA_MEMSET_NODE_PARAMS):
        raise TypeError(
            f"Argument 'memsetParams' has incorrect type (expected "
            f"cuda.bindings.driver.CUDA_MEMSET_NODE_PARAMS, got "
            f"{type(params).__name__})"
        )
    err, ctx = _node_context(driver, ctx)
    if err:
        return err, None
    size, width, height = int(params.elementSize), size_t(params.width), size_t(params.height)
    pitch, dst = size_t(params.pitch), int(params.dst)
    value = unsigned(params.value, 32, "unsigned int")
    if (
        size not in _ELEMENT
        or dst % size
        or not width
        or not height
        or (height > 1 and pitch < width * size)
    ):
        return INVALID_VALUE, None
    work = MemsetWork(dst, pitch, value, size, width, height, ctx, None)
    block = driver._live_range(dst, work.extent)
    if block is None:
        return INVALID_VALUE, None
    work.device = block.device
    return OK, work


def _node_context(driver, ctx):
    """The context a memcpy or memset node runs in: ``ctx``, or the current one when null."""
    if ctx is None or not int(ctx):
        return driver._work_context()
    target = driver._lookup(ctx)
    if target is None:
        return INVALID_VALUE, None
    return driver._work_context(target)
