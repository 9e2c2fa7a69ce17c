"""A graph node's parameters, built once from what the user passed, with the checks of the
eager operation they stand for:

- kernels: the launch configuration (`_launch_config.make_config` / `validate`) and the
  arguments (`_plan`: the kernel's `Packer` makes the plan, `Plan.pack` the bytes, the same
  KernelArgumentError messages). `KernelParams` keeps the driver's struct, a parameter buffer
  and the ``void*`` array into it, so a kernel node's update repacks in place.
- copies: `_copy`'s shape/dtype checks and `_layout.plan`, as one CUDA_MEMCPY3D; a graph
  replays the copy later, so a host side must be page-locked.
- fills: `_copy.fill_pattern` (which values fit which dtype) as one memset node.
- host functions: the trampoline of `_lifetimes` with a key of a `GraphOwner`.

Conditional nodes and their conditions: `_conditions.py`.

Node kinds are named once here (`KINDS`), for nodes made by cuctx and for nodes found in a
driver graph (`_capture._adopt`).
"""

from __future__ import annotations

import ctypes
import weakref
from collections import Counter
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
from cuda.bindings.driver import (
    CUDA_HOST_NODE_PARAMS,
    CUDA_KERNEL_NODE_PARAMS,
    CUDA_MEMCPY3D,
    CUDA_MEMSET_NODE_PARAMS,
    CUgraphNodeType,
    CUkernel,
)

from ..memory import _layout
from ..kernels._access import condition_params
from ..kernels._args import PACK_ERRORS
from ..memory._alloc import in_host_pool
from ..memory._copy import _address, _matching, fill_pattern, memory_type
from ..memory._host import page_locked
from ..kernels._launch_config import Config
from .._lifetimes import TRAMPOLINE_FN, GraphOwner
from ..kernels._plan import pack_slowly
from ..memory._array import DeviceArray

if TYPE_CHECKING:
    from ..kernels._kernel import Kernel
    from ..context import Context
    from ..stream import Stream

_T = CUgraphNodeType
# The driver's node types by the names cuctx uses (GraphNode.kind).
KINDS = {
    int(_T.CU_GRAPH_NODE_TYPE_KERNEL): "kernel",
    int(_T.CU_GRAPH_NODE_TYPE_MEMCPY): "copy",
    int(_T.CU_GRAPH_NODE_TYPE_MEMSET): "fill",
    int(_T.CU_GRAPH_NODE_TYPE_HOST): "host",
    int(_T.CU_GRAPH_NODE_TYPE_GRAPH): "child",
    int(_T.CU_GRAPH_NODE_TYPE_EMPTY): "empty",
    int(_T.CU_GRAPH_NODE_TYPE_WAIT_EVENT): "wait",
    int(_T.CU_GRAPH_NODE_TYPE_EVENT_RECORD): "record",
    int(_T.CU_GRAPH_NODE_TYPE_MEM_ALLOC): "alloc",
    int(_T.CU_GRAPH_NODE_TYPE_MEM_FREE): "free",
    int(_T.CU_GRAPH_NODE_TYPE_CONDITIONAL): "conditional",
}


def kind_of(node_type) -> str:
    """cuctx's name for a driver node type (the enum's own name, shortened, for the rest)."""
    code = int(node_type)
    if code in KINDS:
        return KINDS[code]
    try:
        return _T(code).name.removeprefix("CU_GRAPH_NODE_TYPE_").lower()
    except ValueError:
        return f"type {code}"


def summarize(nodes: list) -> str:
    """A graph's nodes in words: "3 nodes: 2 kernel ('saxpy' x2); 1 fill"."""
    kinds = Counter(node.kind for node in nodes)
    parts = []
    for kind, n in kinds.items():
        if kind == "kernel":
            names = Counter(
                node._kernel.name if node._kernel else "?"
                for node in nodes
                if node.kind == "kernel"
            )
            named = ", ".join(
                f"{name!r}" + (f" x{k}" if k > 1 else "") for name, k in names.items()
            )
            parts.append(f"{n} kernel ({named})")
        else:
            parts.append(f"{n} {kind}")
    return f"{len(nodes)} nodes" + (f": {'; '.join(parts)}" if parts else "")


class NodeInfo(NamedTuple):
    """What cuctx knows of a node beyond the driver's graph: the user's call site, the
    objects its work uses (kept alive while a graph or executable holds the node), words for
    messages, and for kernel nodes the kernel and configuration (for `GraphExec.update_node`).
    Capture (graphs/_capture.py) passes one per captured node to `_adopt`."""

    site: tuple[str, int, str] | None = None
    keep: tuple = ()
    description: str = ""
    kernel: Kernel | None = None
    config: Config | None = None


class HostFunctions:
    """The host functions of a graph's host nodes, shared by the graph and every executable
    made from it (the node's userData is fixed when the node is added). The `GraphOwner`
    drops them when the last holder of this object goes (a weakref finalizer: no CUDA call).
    Failures are filed under ``owner.key``: an executable points it at the stream it launches
    on, so that stream's synchronize reports them, as for `Stream.launch_host_func`."""

    __slots__ = ("owner", "__weakref__")

    def __init__(self, ctx: Context) -> None:
        self.owner = GraphOwner((ctx._key, id(self)))
        weakref.finalize(self, self.owner.release)

    def add(self, fn, args: tuple, on_gpu: bool) -> CUDA_HOST_NODE_PARAMS:
        params = CUDA_HOST_NODE_PARAMS()
        params.fn = TRAMPOLINE_FN
        params.userData = self.owner.add_host_function(fn, args, on_gpu)
        return params


# -- kernels --------------------------------------------------------------------------------


class KernelParams:
    """A kernel node's driver struct with its own parameter buffer: `pack` writes arguments
    into the buffer the struct points at, `configure` the grid, block and shared memory.
    ``conditions``: the parameters the source declares as condition handles."""

    __slots__ = ("kernel", "config", "packer", "struct", "buffer", "pointers", "args", "conditions")

    def __init__(self, kernel: Kernel, config: Config, ctx: Context) -> None:
        self.kernel = kernel
        self.conditions = condition_params(kernel)
        self.packer = kernel._packer()
        self.buffer, self.pointers = self.packer.buffers()
        struct = self.struct = CUDA_KERNEL_NODE_PARAMS()
        # A library's CUkernel goes in `kern` (the driver refuses it cast into `func`, measured
        # on an H100); a module's CUfunction in `func`. `ctx`: the context it runs in.
        if isinstance(kernel._handle, CUkernel):
            struct.kern = kernel._handle
        else:
            struct.func = kernel._handle
        struct.ctx = ctx._handle
        struct.kernelParams = ctypes.addressof(self.pointers) if self.pointers is not None else 0
        self.configure(config)
        self.args: tuple = ()

    def configure(self, config: Config) -> None:
        struct = self.struct
        struct.gridDimX, struct.gridDimY, struct.gridDimZ = config.grid
        struct.blockDimX, struct.blockDimY, struct.blockDimZ = config.block
        struct.sharedMemBytes = config.shared_mem
        self.config = config

    def pack(self, args: tuple, stream: Stream) -> None:
        """Check and pack ``args`` as a launch does (the same plan, the same errors); keep
        them, since the node's pointers lead to their memory."""
        plan = self.packer.plan(args)
        try:
            plan.pack(self.buffer, stream, args)
        except PACK_ERRORS:
            pack_slowly(self.packer, plan, args, stream, self.buffer)
        self.args = args

    def keep(self) -> tuple:
        return (self.kernel._owner, *self.args)


def describe_kernel(kernel: Kernel, config: Config) -> str:
    return f"kernel {kernel.name!r} grid={config.grid} block={config.block}" + (
        f" shared_mem={config.shared_mem}" if config.shared_mem else ""
    )


# -- copies ---------------------------------------------------------------------------------


def _side(
    obj: Any, ctx: Context, operation: str, role: str, written: bool, copy: bool = True
) -> bool:
    """Check one side of a graph copy (or fill: not ``copy``); True for device memory."""
    if isinstance(obj, DeviceArray):
        obj._check(operation)
        if obj._backend is not ctx._backend:
            raise ValueError(f"{operation}: the {role} {obj!r} is of another backend")
        here, there = ctx._device, obj._ctx._device
        # (a host pool's array is host memory: any device's copy reaches it)
        if there is not here and not (copy and (there in here._peers or in_host_pool(obj))):
            raise ValueError(
                f"{operation}: the {role} {obj!r} is on device {there.ordinal}, the graph's "
                f"context on device {here.ordinal}; "
                + (
                    f"a copy between devices in a graph is made by device {here.ordinal}, "
                    f"which needs peer access to device {there.ordinal}: call cuctx.Device("
                    f"{here.ordinal}).enable_peer_access({there.ordinal}) first"
                    if copy
                    else "a graph fills memory of its own device"
                )
            )
        return True
    if not isinstance(obj, np.ndarray):
        raise TypeError(
            f"{operation}: the {role} must be a DeviceArray or a page-locked "
            f"numpy.ndarray, not {type(obj).__name__}"
        )
    if written and not obj.flags.writeable:
        raise ValueError(f"{operation}: the destination host array is read-only")
    lo, hi = _layout.span(obj.shape, obj.strides, obj.dtype.itemsize)
    if not page_locked(_address(obj, False) + lo, hi - lo):
        raise ValueError(
            f"{operation}: the {role} is pageable host memory; a graph copies it at every "
            "launch, long after this call returns, which CUDA allows only for page-locked "
            "memory: allocate it with cuctx.pinned_empty(shape, dtype) or page-lock it with "
            "cuctx.register_host(array)"
        )
    return False


def copy_params(dst: Any, src: Any, ctx: Context, operation: str) -> tuple[CUDA_MEMCPY3D, str]:
    """The one 3D copy from ``src`` to ``dst`` (device arrays of the graph's device or of a
    device it has peer access to, arrays of a host pool, or page-locked host arrays),
    checked as `cuctx.copy` checks; and its description."""
    dst_dev = _side(dst, ctx, operation, "destination", True)
    src_dev = _side(src, ctx, operation, "source", False)
    if not (dst_dev or src_dev):
        raise TypeError(
            f"{operation} needs a DeviceArray on at least one side; use "
            "numpy.copyto between host arrays"
        )
    n = _matching(dst, src)
    if n == 0:
        raise ValueError(
            f"{operation}: the arrays are empty ({dst.shape}); a graph holds no "
            "empty copy, so leave the node out"
        )
    itemsize = dst.dtype.itemsize
    if dst_dev and src_dev:
        d_lo, d_hi = _layout.span(dst.shape, dst.strides, itemsize)
        s_lo, s_hi = _layout.span(src.shape, src.strides, itemsize)
        if dst.ptr + d_lo < src.ptr + s_hi and src.ptr + s_lo < dst.ptr + d_hi:
            raise ValueError(
                f"{operation}: source and destination overlap; a copy's order of "
                "reads and writes is undefined, so copy through another array"
            )
    plan = _layout.plan(dst.shape, dst.strides, src.strides, itemsize)
    if plan.calls > 1:
        raise ValueError(
            f"{operation}: these layouts (strides {dst.strides} and {src.strides}) need "
            f"{plan.calls} copies, and a graph's copy node makes one 3D copy: copy between "
            "arrays whose layouts agree (C-contiguous ones, say)"
        )
    params = CUDA_MEMCPY3D()
    params.WidthInBytes = plan.width
    height, dst_pitch, src_pitch = plan.rows or (1, plan.width, plan.width)
    depth, dst_slice, src_slice = plan.slices or (1, height * dst_pitch, height * src_pitch)
    params.Height, params.Depth = height, depth
    params.dstPitch, params.srcPitch = dst_pitch, src_pitch
    params.dstHeight, params.srcHeight = dst_slice // dst_pitch, src_slice // src_pitch
    params.dstMemoryType = memory_type(dst, dst_dev)
    params.srcMemoryType = memory_type(src, src_dev)
    d = _address(dst, dst_dev) + plan.dst_offset
    s = _address(src, src_dev) + plan.src_offset
    if dst_dev:
        params.dstDevice = d
    else:
        params.dstHost = d
    if src_dev:
        params.srcDevice = s
    else:
        params.srcHost = s
    return (
        params,
        f"copy {_memory(src, src_dev)} to {_memory(dst, dst_dev)} {n} x {dst.dtype} {dst.shape}",
    )


def _memory(obj: Any, on_device: bool) -> str:
    """One side of a copy node in its description."""
    return ("host pool" if in_host_pool(obj) else "device") if on_device else "host"


# -- fills ----------------------------------------------------------------------------------


def fill_params(
    arr: Any, value: Any, ctx: Context, operation: str
) -> tuple[CUDA_MEMSET_NODE_PARAMS, str]:
    """One memset node setting every element of ``arr`` to ``value`` (the values `fill`
    takes); the array must be dense and the element expressible as 1, 2 or 4-byte words."""
    if not isinstance(arr, DeviceArray):
        raise TypeError(f"{operation} fills a DeviceArray, not {type(arr).__name__}")
    arr._check(operation)
    _side(arr, ctx, operation, "array", True, copy=False)
    pattern = fill_pattern(value, arr.dtype)
    if not arr.size:
        raise ValueError(f"{operation}: the array is empty; a graph holds no empty memset")
    if not arr.is_contiguous or arr.ptr % min(len(pattern), 4):
        raise ValueError(
            f"{operation}: a memset node fills dense memory, and {arr!r} (strides "
            f"{arr.strides}) is not; fill a contiguous array (or copy into the "
            "view from one)"
        )
    words = np.frombuffer(pattern, "<u4").tolist() if len(pattern) % 4 == 0 else []
    params = CUDA_MEMSET_NODE_PARAMS()
    if len(pattern) in (1, 2):
        params.elementSize, params.value = len(pattern), int.from_bytes(pattern, "little")
        params.width = arr.size
    elif words and len(set(words)) == 1:
        params.elementSize, params.value = 4, words[0]
        params.width = arr.size * len(words)
    else:
        raise ValueError(
            f"{operation}: a memset node repeats one 1-, 2- or 4-byte word, and {value!r} as "
            f"{arr.dtype} is {len(pattern)} bytes that differ ({pattern.hex()}); fill with a "
            "kernel node, or copy from an array filled eagerly (arr.fill(value))"
        )
    params.dst = arr.ptr
    params.height = 1
    params.pitch = 0
    return params, f"fill {arr.dtype} {arr.shape} with {value!r}"
