"""The constructors built on `empty` and the array's own fill and copy: `zeros`, `full`,
`to_device`; and `asarray`, a DeviceArray viewing another library's device memory (CUDA
Array Interface or DLPack, read by `_interop`) without copying.

`empty` and `copy` stay with DeviceArray in `_array`, whose methods (``copy``, ``fill``,
``to_host``) use them; these need the class, and nothing of the class needs them.
`_native_hooks` puts the compiled `empty` here too, where `full` and `to_device` call it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
from cuda.bindings.driver import CUpointer_attribute

from .. import _driver
from ..context import Context, context_for
from .._calls import fail
from ..device import Device
from ..stream import Stream, resolve_stream
from . import _interop, _layout
from ._array import DeviceArray, copy, empty

if TYPE_CHECKING:
    from ._pool import MemoryPool

__all__ = ["asarray", "full", "to_device", "zeros"]

# -- making arrays ------------------------------------------------------------------------


def zeros(
    shape: int | tuple[int, ...],
    dtype: Any = np.float64,
    *,
    stream: Stream | Any | None = None,
    device: Device | int | None = None,
    pool: MemoryPool | None = None,
) -> DeviceArray:
    """A device array of zeros (stream-ordered, see `empty`)."""
    return full(shape, 0, dtype, stream=stream, device=device, pool=pool)


def full(
    shape: int | tuple[int, ...],
    value: Any,
    dtype: Any = None,
    *,
    stream: Stream | Any | None = None,
    device: Device | int | None = None,
    pool: MemoryPool | None = None,
) -> DeviceArray:
    """A device array with every element ``value``; ``dtype`` defaults to NumPy's choice
    for ``value``."""
    dtype = np.asarray(value).dtype if dtype is None else dtype
    arr = empty(shape, dtype, stream=stream, device=device, pool=pool)
    return arr.fill(value, stream=arr._alloc.stream if arr._alloc else None)


def to_device(
    ary: Any,
    stream: Stream | Any | None = None,
    *,
    device: Device | int | None = None,
    pool: MemoryPool | None = None,
) -> DeviceArray:
    """A new C-contiguous device array holding a copy of ``ary`` (a NumPy array of any
    layout, anything ``numpy.asarray`` takes, or a DeviceArray), allocated as `empty` does
    (from ``pool`` when given). From pageable memory the copy is synchronous; from
    page-locked memory (`pinned_empty`, `register_host`) it is asynchronous on ``stream``:
    keep ``ary`` unchanged until the stream is synchronized."""
    src = ary if ary.__class__ is DeviceArray else np.asarray(ary)
    arr = empty(src.shape, src.dtype, stream=stream, device=device, pool=pool)
    copy(arr, src, arr._alloc.stream if arr._alloc else None)
    return arr


# -- zero-copy import ---------------------------------------------------------------------


def asarray(obj: Any, stream: Stream | Any | None = None) -> DeviceArray:
    """A DeviceArray viewing another library's device memory without copying: anything with
    ``__cuda_array_interface__`` (PyTorch, CuPy, Numba, ...) or ``__dlpack__`` on a CUDA
    device (cuda.core buffers, JAX, ...). The result keeps ``obj`` alive. Work queued
    later on ``stream`` (default: this thread's current stream on the array's device) waits
    for the stream the producer names."""
    if isinstance(obj, DeviceArray):
        return obj
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is not None:
        return _from_cai(obj, cai, stream)
    if hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__"):
        return _from_dlpack(obj, stream)
    if isinstance(obj, np.ndarray):
        raise TypeError(
            "cuctx.asarray wraps device memory; this is a NumPy (host) array: "
            "copy it with cuctx.to_device(ary)"
        )
    raise TypeError(
        f"cuctx.asarray cannot wrap {type(obj).__name__}: it has neither "
        "__cuda_array_interface__ nor __dlpack__"
    )


def _context_of(ptr: int) -> Context:
    """The primary context of the device the memory at ``ptr`` is on (unified addressing
    tells it), where PyTorch, CuPy and Numba allocate."""
    if ptr == 0:  # empty arrays have no memory
        return context_for(primary=True)
    backend = _driver.active()
    err, ordinal = backend.driver.cuPointerGetAttribute(
        CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr
    )
    if err:
        fail(
            backend,
            err,
            "cuPointerGetAttribute",
            hint=f"{ptr:#x} is not device memory the driver knows",
        )
    return context_for(int(ordinal), primary=True)


def _after(ctx: Context, producer: int | None, stream: Stream | Any | None) -> None:
    """Make the consuming stream wait for the producer's stream."""
    if producer is None:
        return
    consumer = resolve_stream(stream, device=ctx.device)  # the stream that will use it
    theirs = resolve_stream(int(producer), ctx)  # default handles: of the memory's context
    if consumer != theirs:
        consumer.wait(theirs)


def _from_cai(obj: Any, cai: Any, stream: Stream | Any | None) -> DeviceArray:
    ptr, shape, dtype, strides, producer = _interop.read_cai(cai)
    ctx = _context_of(ptr)
    _after(ctx, producer, stream)
    return DeviceArray._make(ctx, ptr, shape, dtype, strides, None, obj)


def _from_dlpack(obj: Any, stream: Stream | Any | None) -> DeviceArray:
    kind, ordinal = obj.__dlpack_device__()
    if int(kind) != _interop.DL_CUDA:
        raise TypeError(
            f"cuctx.asarray: {type(obj).__name__} is on DLPack device type "
            f"{int(kind)}, not CUDA (2); copy host data with cuctx.to_device"
        )
    ctx = context_for(int(ordinal), primary=True)
    key = resolve_stream(stream, device=ctx.device)._key
    try:
        capsule = obj.__dlpack__(stream=key, max_version=(1, 0))
    except TypeError:  # a producer of the DLPack protocol before max_version
        capsule = obj.__dlpack__(stream=key)
    ptr, shape, strides, dtype, device, owner = _interop.consume(capsule)
    if device != (_interop.DL_CUDA, ctx.device.ordinal):
        raise BufferError(
            f"cuctx.asarray: the DLPack tensor is on device {device[0]}/"
            f"{device[1]}, not the CUDA device {ctx.device.ordinal} its "
            "producer named"
        )
    return DeviceArray._make(ctx, ptr, shape, _layout.dtype_of(dtype), strides, None, owner)
