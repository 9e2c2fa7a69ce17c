"""Copies and fills of device arrays of any layout (memory.py's `copy` and `fill`).

A copy is planned as rows of contiguous bytes (`_layout.plan`) and issued as one linear
copy (cuMemcpyHtoDAsync, cuMemcpyDtoHAsync, cuMemcpyDtoDAsync), one 2D copy
(cuMemcpy2DAsync, CUDA_MEMCPY2D) or one 3D copy (cuMemcpy3DAsync, CUDA_MEMCPY3D) per
iteration of the plan's loops. Where the two layouts disagree (a transpose, a reversed
axis), the copy goes through a temporary when that takes fewer driver calls: a pageable host
buffer in the device array's own layout that NumPy reorders. A copy between two device
arrays (between contexts or devices too: cuMemcpyPeerAsync) is `_copy_device`'s, which
issues what this module plans. Every call is made with its stream's context current
(`Stream._call`).

An array of a host-located pool (`MemoryPool(device, location="host")`) is host memory,
which the driver refuses as the device side of those calls (CUDA_ERROR_INVALID_VALUE for
cuMemcpyHtoDAsync, two H200s, driver 580): a copy with such a side is made with the
unified-addressing forms, where the driver infers each side from its address: one
cuMemcpyAsync for a linear copy, CU_MEMORYTYPE_UNIFIED (and its ``...Device`` field) for that
side of a 2D or 3D copy (`memory_type`). Between devices such a copy is a host copy of the
other side's device, never cuMemcpyPeerAsync (`_copy_device`). Until a host pool is made no
array can be one, so ordinary copies pay a test of one module flag (`_alloc.host_pools`).

Each copy issued and each memset is announced on the trace with both sides' byte extents; a
staged copy announces each of its stages (what the streams really do).
"""

from __future__ import annotations

import itertools
from math import prod
from typing import Any, NamedTuple

import numpy as np
from cuda.bindings.driver import CUDA_MEMCPY2D, CUDA_MEMCPY3D, CUmemorytype

from . import _alloc, _layout
from .. import _lifetimes, _record, _trace
from ._alloc import in_host_pool
from ._host import page_locked
from ._layout import Plan
from .._driver import native
from .._calls import fail
from ..stream import Stream, resolve_stream
from .._calls import refuse_legacy_in_global_capture

_HOST, _DEVICE = CUmemorytype.CU_MEMORYTYPE_HOST, CUmemorytype.CU_MEMORYTYPE_DEVICE
_UNIFIED = CUmemorytype.CU_MEMORYTYPE_UNIFIED
_LINEAR = {
    (True, False): "cuMemcpyHtoDAsync",
    (False, True): "cuMemcpyDtoHAsync",
    (True, True): "cuMemcpyDtoDAsync",
}
_LINEAR_UNIFIED = "cuMemcpyAsync"  # a linear copy with a host pool's side


def memory_type(obj, on_device: bool) -> CUmemorytype:
    """How a 2D or 3D copy (or a graph's copy node) names one side: a NumPy array as host
    memory, a device array as device memory, an array of a host-located pool by its unified
    address (the driver refuses it as device memory)."""
    if not on_device:
        return _HOST
    return _UNIFIED if _alloc.host_pools and in_host_pool(obj) else _DEVICE


def _unified(dst_obj, src_obj, dst_on_device: bool, src_on_device: bool) -> bool:
    """Whether a side of a copy is an array of a host-located pool (asked only once
    `_alloc.host_pools` is set)."""
    return dst_on_device and in_host_pool(dst_obj) or src_on_device and in_host_pool(src_obj)


def _interface_address(host: np.ndarray) -> int:
    return host.__array_interface__["data"][0]


# A NumPy array's data address: __array_interface__ builds a dict for it (microseconds, on
# every copy), the extension reads it from __array_struct__ (cuctx/csrc/copies.c).
_extension, _ = native.extension()
host_address = _interface_address if _extension is None else _extension.host_address


def _address(obj, on_device: bool) -> int:
    return obj.ptr if on_device else host_address(obj)


def _access(obj, on_device: bool, mode: str) -> _trace.Access:
    """The bytes one side of a copy (a DeviceArray, or a NumPy array) spans."""
    if on_device:
        return _trace.device_access(obj, mode)
    start, nbytes = _trace.extent(_address(obj, False), obj.shape, obj.strides, obj.dtype.itemsize)
    return _trace.Access(start, nbytes, mode, obj, host=True)


def _copy_accesses(dst, src, dst_on_device: bool, src_on_device: bool) -> tuple:
    return _access(src, src_on_device, _trace.READ), _access(dst, dst_on_device, _trace.WRITE)


def announce_copy(stream: Stream, dst, src, dst_on_device: bool, src_on_device: bool) -> None:
    _trace.emit_lazily(
        "copy", stream._ctx, stream, (_copy_accesses, dst, src, dst_on_device, src_on_device)
    )


def issue(
    stream: Stream, plan: Plan, dst_obj, src_obj, dst_on_device: bool, src_on_device: bool
) -> None:
    """Queue ``plan`` on ``stream`` from ``src_obj`` to ``dst_obj`` (device arrays or NumPy
    arrays, as the flags say). Raises the driver's error as a CudaError."""
    _issue(
        stream,
        plan,
        dst_obj,
        src_obj,
        dst_on_device,
        src_on_device,
        _address(dst_obj, dst_on_device),
        _address(src_obj, src_on_device),
    )


def _issue(
    stream: Stream,
    plan: Plan,
    dst_obj,
    src_obj,
    dst_on_device: bool,
    src_on_device: bool,
    dst: int,
    src: int,
) -> None:
    """`issue`, the addresses of both sides' first elements given."""
    if _record.threads and _record.enqueue(
        stream, _record.COPY, plan, dst_obj, src_obj, dst_on_device, src_on_device
    ):
        return  # an autograph call recorded it
    if _lifetimes.capturing:
        refuse_legacy_in_global_capture(stream, "cuctx.copy")
    drv = stream._backend.driver
    dst += plan.dst_offset
    src += plan.src_offset
    name = (
        _LINEAR_UNIFIED
        if _alloc.host_pools and _unified(dst_obj, src_obj, dst_on_device, src_on_device)
        else _LINEAR[dst_on_device, src_on_device]
    )
    if plan.rows is None and not plan.loops:  # one linear copy: every contiguous pair
        (err,) = stream._call(getattr(drv, name), dst, src, plan.width, stream._handle)
        if err:
            fail(stream._backend, err, name, stream._ctx)
    else:
        _issue_calls(
            stream,
            drv,
            plan,
            dst,
            src,
            name,
            memory_type(dst_obj, dst_on_device),
            memory_type(src_obj, src_on_device),
        )
    if _trace.sinks:  # (announce_copy inline: the trace walks every frame to the user's)
        _trace.emit_lazily(
            "copy",
            stream._ctx,
            stream,
            (_copy_accesses, dst_obj, src_obj, dst_on_device, src_on_device),
        )


def _issue_calls(
    stream: Stream,
    drv,
    plan: Plan,
    dst: int,
    src: int,
    name: str,
    dst_type: CUmemorytype,
    src_type: CUmemorytype,
) -> None:
    """The calls of a plan with rows or loops: 1D copies (the driver's function ``name``),
    or 2D or 3D copies naming each side as its `memory_type`, one per loop index."""
    if plan.rows is None:
        call = getattr(drv, name)

        def one(d, s):
            return stream._call(call, d, s, plan.width, stream._handle)
    else:
        name = "cuMemcpy3DAsync" if plan.slices else "cuMemcpy2DAsync"
        call = getattr(drv, name)
        params = _params(plan, dst_type, src_type)
        dst_field = "dstHost" if dst_type is _HOST else "dstDevice"
        src_field = "srcHost" if src_type is _HOST else "srcDevice"

        def one(d, s):
            setattr(params, dst_field, d)
            setattr(params, src_field, s)
            return stream._call(call, params, stream._handle)

    for index in itertools.product(*(range(n) for n, _, _ in plan.loops)):
        d = dst + sum(i * step for i, (_, step, _) in zip(index, plan.loops))
        s = src + sum(i * step for i, (_, _, step) in zip(index, plan.loops))
        (err,) = one(d, s)
        if err:
            fail(stream._backend, err, name, stream._ctx)


def _params(plan: Plan, dst_type: CUmemorytype, src_type: CUmemorytype):
    height, dst_pitch, src_pitch = plan.rows
    params = CUDA_MEMCPY3D() if plan.slices else CUDA_MEMCPY2D()
    params.WidthInBytes = plan.width
    params.Height = height
    params.dstPitch, params.srcPitch = dst_pitch, src_pitch
    params.dstMemoryType, params.srcMemoryType = dst_type, src_type
    if plan.slices:
        depth, dst_slice, src_slice = plan.slices
        params.Depth = depth
        params.dstHeight = dst_slice // dst_pitch
        params.srcHeight = src_slice // src_pitch
    return params


# -- fills ---------------------------------------------------------------------------------


def fill_pattern(value: Any, dtype: np.dtype) -> bytes:
    """The bytes of one element ``value`` of ``dtype``, refusing what would change it."""
    v = np.asarray(value)
    if v.ndim or v.dtype.kind not in "biufc":
        raise TypeError(f"fill takes one number (bool, int, float or complex), not {value!r}")
    if dtype.kind in "biu" and v.dtype.kind in "fc":
        raise TypeError(
            f"cannot fill a {dtype} array with {value!r}: it would be "
            "truncated; pass a whole number"
        )
    if dtype.kind != "c" and v.dtype.kind == "c":
        raise TypeError(
            f"cannot fill a {dtype} array with {value!r}: the imaginary part would be dropped"
        )
    if dtype.kind in "iu" and v.dtype.kind in "iu":
        info = np.iinfo(dtype)
        if not info.min <= int(v) <= info.max:
            raise ValueError(
                f"cannot fill a {dtype} array with {value!r}: it is out of range "
                f"for {dtype} [{info.min}, {info.max}]"
            )
    return np.array(value, dtype=dtype).tobytes()


def memset(arr, pattern: bytes, stream: Stream) -> None:
    """Fill the dense, aligned ``arr`` with the element ``pattern``: one memset for 1-, 2-
    and 4-byte patterns and repeating 4-byte words, else one strided 32-bit memset per word."""
    if _record.threads and _record.enqueue(stream, _record.FILL, arr, pattern):
        return  # an autograph call recorded it
    if _lifetimes.capturing:
        refuse_legacy_in_global_capture(stream, "DeviceArray.fill")
    drv, h, n, call = stream._backend.driver, stream._handle, arr.size, stream._call
    if len(pattern) == 1:
        results = [call(drv.cuMemsetD8Async, arr.ptr, pattern[0], n, h)]
    elif len(pattern) == 2:
        results = [call(drv.cuMemsetD16Async, arr.ptr, int.from_bytes(pattern, "little"), n, h)]
    else:
        words = np.frombuffer(pattern, "<u4").tolist()
        if len(set(words)) == 1:
            results = [call(drv.cuMemsetD32Async, arr.ptr, words[0], n * len(words), h)]
        else:
            results = [
                call(drv.cuMemsetD2D32Async, arr.ptr + 4 * i, len(pattern), w, 1, n, h)
                for i, w in enumerate(words)
            ]
    for (err,) in results:
        if err:
            fail(stream._backend, err, "cuMemset", arr._ctx)
    if _trace.sinks:
        _trace.emit(
            "memset",
            stream._ctx,
            stream,
            (_trace.device_access(arr, _trace.WRITE),),
            pattern=pattern,
        )


# -- copies between arrays -----------------------------------------------------------------


class Layouts(NamedTuple):
    """What a copy between two layouts of one shape and itemsize needs beyond the arrays."""

    size: int  # elements; 0: nothing to copy
    overlapping: bool  # the destination's elements overlap each other: refused
    plan: Plan | None  # the direct copy (None when size is 0)
    staged: bool  # through a temporary instead, which takes fewer calls
    dst_span: tuple[int, int]  # bytes [lo, hi) relative to the first element (`_layout.span`)
    src_span: tuple[int, int]


# Planning a copy costs several times the driver call it plans, and programs copy the same
# few layouts again and again (a pipeline's slices): each pair is planned once, keyed by
# (shape, dst strides, src strides, itemsize, dst on device, src on device).
PLANS_KEPT = 1024
_planned: dict[tuple, Layouts] = {}


def _layouts(dst, src, dst_on_device: bool, src_on_device: bool) -> Layouts:
    """The `Layouts` of a copy between arrays of one shape and dtype."""
    key = (dst.shape, dst.strides, src.strides, dst.dtype.itemsize, dst_on_device, src_on_device)
    found = _planned.get(key)
    if found is None:
        if len(_planned) >= PLANS_KEPT:  # ever new layouts: start over rather than grow
            _planned.clear()
        found = _planned[key] = _plan_layouts(*key)
    return found


def _plan_layouts(
    shape, dst_strides, src_strides, itemsize: int, dst_on_device: bool, src_on_device: bool
) -> Layouts:
    size = prod(shape)
    plan, staged = None, False
    if size:
        plan = _layout.plan(shape, dst_strides, src_strides, itemsize)
        # Where the layouts disagree (a transpose, a reversal), the copy engines cannot
        # reorder elements in few calls: staging through a buffer in each device side's own
        # order lets NumPy reorder them on the host.
        own = sum(
            _own_plan(shape, strides, itemsize).calls
            for strides, on_device in ((dst_strides, dst_on_device), (src_strides, src_on_device))
            if on_device
        )
        staged = own < plan.calls
    return Layouts(
        size,
        _layout.self_overlapping(shape, dst_strides, itemsize),
        plan,
        staged,
        _layout.span(shape, dst_strides, itemsize),
        _layout.span(shape, src_strides, itemsize),
    )


def _alike(dst, src) -> None:
    if dst.shape != src.shape:
        raise ValueError(f"cuctx.copy: shapes differ: dst {dst.shape}, src {src.shape}")
    if dst.dtype != src.dtype:
        raise TypeError(
            f"cuctx.copy: dtypes differ: dst {dst.dtype}, src {src.dtype}; "
            "copies do not convert (convert on the host with astype first)"
        )


def _overlapping(dst) -> ValueError:
    return ValueError(
        f"cuctx.copy: the destination's elements overlap (strides "
        f"{dst.strides}): copy into an array without repeated elements"
    )


def _checked(dst, src, dst_on_device: bool, src_on_device: bool) -> Layouts:
    """Check that dst and src can be copied; return their `Layouts`."""
    _alike(dst, src)
    layouts = _layouts(dst, src, dst_on_device, src_on_device)
    if layouts.overlapping:
        raise _overlapping(dst)
    return layouts


def _matching(dst, src) -> int:
    """Check that dst and src (device or NumPy arrays) can be copied; return the element
    count."""
    return _checked(dst, src, not isinstance(dst, np.ndarray), not isinstance(src, np.ndarray)).size


def _own_plan(shape, strides, itemsize: int) -> Plan:
    """The plan between a layout and a dense buffer in its own axis order."""
    dense, _ = _layout.dense_strides(shape, strides, itemsize)
    return _layout.plan(shape, dense, strides, itemsize)


def _dense_host(like) -> np.ndarray:
    """A pageable host array with the axis order and directions of ``like``'s layout."""
    strides, offset = _layout.dense_strides(like.shape, like.strides, like.dtype.itemsize)
    buffer = np.empty(prod(like.shape) * like.dtype.itemsize, np.uint8)
    return np.ndarray(like.shape, like.dtype, buffer, offset, strides)


def copy_host(arr, host: Any, stream, to_device: bool) -> None:
    if not isinstance(host, np.ndarray):
        raise TypeError(
            f"cuctx.copy: the host side must be a numpy.ndarray, not "
            f"{type(host).__name__} (use numpy.asarray(x, dtype=...) first)"
        )
    arr._check("cuctx.copy")
    if to_device:
        layouts = _checked(arr, host, True, False)
    else:
        layouts = _checked(host, arr, False, True)
        if not host.flags.writeable:
            raise ValueError("cuctx.copy: the destination host array is read-only")
    if layouts.size:
        stream = resolve_stream(stream, arr._ctx, "cuctx.copy")
        if layouts.staged:
            _host_copy(arr, host, stream, to_device, layouts)
        else:  # (directly: the trace walks every frame to the user's)
            _transfer(arr, host, stream, to_device, layouts)


def _host_copy(
    arr, host: np.ndarray, stream: Stream, to_device: bool, layouts: Layouts | None = None
) -> None:
    """Copy checked arrays on ``stream`` (of the array's context, or of another context of
    its device)."""
    if layouts is None:
        layouts = _host_layouts(arr, host, to_device)
    if layouts.staged:
        # The host layout disagrees with the device's (a transpose, say): move the bytes in
        # the device's own layout through a pageable temporary and let NumPy reorder them.
        temp = _dense_host(arr)
        if to_device:
            np.copyto(temp, host)
            _transfer(arr, temp, stream, True, _host_layouts(arr, temp, True))
        else:
            _transfer(arr, temp, stream, False, _host_layouts(arr, temp, False))
            np.copyto(host, temp)  # pageable: the data was there on return
        return
    _transfer(arr, host, stream, to_device, layouts)


def _host_layouts(arr, host: np.ndarray, to_device: bool) -> Layouts:
    return _layouts(arr, host, True, False) if to_device else _layouts(host, arr, False, True)


def _transfer(arr, host: np.ndarray, stream: Stream, to_device: bool, layouts: Layouts) -> None:
    """The direct copy between ``arr`` and ``host`` (as many driver calls as its plan has)."""
    lo, hi = layouts.src_span if to_device else layouts.dst_span
    address = host_address(host)
    locked = page_locked(address + lo, hi - lo)
    if not locked and _lifetimes.capturing:
        _lifetimes.refuse_in_capture("cuctx.copy", stream=stream, why=_PAGEABLE_IN_CAPTURE)
    if to_device:
        _issue(stream, layouts.plan, arr, host, True, False, arr.ptr, address)
    else:
        _issue(stream, layouts.plan, host, arr, False, True, address, arr.ptr)
    if locked:  # asynchronous: keep it until done
        stream._hold(host)


_PAGEABLE_IN_CAPTURE = (
    "the host side is pageable memory (an ordinary NumPy array; to_host() without out= makes "
    "one), which cuctx copies synchronously, so a graph cannot hold the copy: use page-locked "
    "memory (cuctx.pinned_empty, cuctx.register_host; to_host(out=pinned)) and read it after "
    "the graph ran, or copy outside the capture"
)
