"""Device memory (`DeviceArray`), page-locked host memory, copies, and zero-copy interop.

Device memory is allocated stream-ordered from the device's memory pool (cuMemAllocAsync)
on the stream the allocation names (the current stream by default), and freed the same way
on that stream when the last array using it goes. A freed block may be reused at once by
later allocations on that stream, which is safe because they run after everything queued
before the free. Work on *other* streams is not ordered with the free: `record_stream` tells
the array about such a stream, and the free then waits for that stream's work (an event
recorded on it, waited on by the allocation stream), as PyTorch's caching allocator does.
``with defer_cleanup():`` holds every free until the block ends, as in Numba.

Host memory: `pinned_empty` allocates page-locked memory (cuMemHostAlloc) and
`register_host` page-locks an existing array. Only copies whose host side is page-locked are
asynchronous (and overlap with compute); a copy to or from ordinary (pageable) memory is
synchronous, as in CUDA: it returns when the host side may be used again.
"""

from __future__ import annotations

import bisect
import contextlib
import ctypes
import operator
import sys
import threading
import weakref
from math import prod
from typing import Any, Iterator

import numpy as np
from cuda.bindings.driver import CUpointer_attribute, CUstream

from . import _driver
from .context import ACTIVE, Context, current_device, fail
from .device import Device
from .stream import LEGACY, PER_THREAD, Stream, current_stream, hold, resolve_stream

_OUT_OF_MEMORY = 2
_HOST_PORTABLE = 0x1  # CU_MEMHOSTALLOC_PORTABLE == CU_MEMHOSTREGISTER_PORTABLE: pinned for all contexts
_DL_CPU, _DL_CUDA = 1, 2  # DLPack device types


# -- shapes and dtypes --------------------------------------------------------------------

def _shape(shape: int | tuple[int, ...]) -> tuple[int, ...]:
    try:
        dims = (operator.index(shape),)
    except TypeError:
        try:
            dims = tuple(operator.index(d) for d in shape)
        except TypeError:
            raise TypeError(f"a shape is an int or a tuple of ints, not {shape!r}") from None
    if any(d < 0 for d in dims):
        raise ValueError(f"negative dimension in shape {dims}: sizes must be >= 0")
    return dims


def _dtype(dtype: Any) -> np.dtype:
    dt = np.dtype(dtype)
    if dt.kind not in "biufc" or not dt.isnative:
        raise TypeError(f"device arrays hold bool, integer, float or complex values in native "
                        f"byte order, not {dt}")
    return dt


def _c_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    strides, step = [], itemsize
    for d in reversed(shape):
        strides.append(step)
        step *= max(d, 1)
    return tuple(reversed(strides))


def _contiguous(shape, strides, itemsize) -> tuple[bool, bool]:
    """(C-contiguous, Fortran-contiguous), as NumPy decides them (size-1 axes don't count)."""
    def dense(axes):
        step = itemsize
        for d, s in axes:
            if d != 1 and s != step:
                return False
            step *= d
        return True
    if prod(shape) == 0:
        return True, True
    pairs = list(zip(shape, strides))
    return dense(reversed(pairs)), dense(pairs)


class _Raw:
    """NumPy's view of an address range that is never read: used to let NumPy do the index
    arithmetic of slicing on device memory."""

    __slots__ = ("__array_interface__",)

    def __init__(self, ptr: int, shape, dtype: np.dtype, strides):
        self.__array_interface__ = {"data": (ptr, False), "shape": shape, "typestr": dtype.str,
                                    "strides": strides, "version": 3}


_INDEX_BASE = 1 << 44  # a made-up address for slicing arithmetic: never dereferenced


# -- allocations --------------------------------------------------------------------------

class _Allocation:
    """One stream-ordered allocation; freed on its stream when the last array using it goes."""

    __slots__ = ("ptr", "stream", "recorded", "__weakref__")

    def __init__(self, ptr: int, stream: Stream):
        self.ptr = ptr
        self.stream = stream
        self.recorded: list[Stream] = []  # other streams that used it (record_stream)
        weakref.finalize(self, _free, ptr, stream, self.recorded).atexit = False


_defer_lock = threading.Lock()
_defer_depth = 0
_deferred: list[tuple] = []


def _free(ptr: int, stream: Stream, recorded: list[Stream]) -> None:
    with _defer_lock:
        if _defer_depth:
            _deferred.append((ptr, stream, recorded))
            return
    _release(ptr, stream, recorded)


def _release(ptr: int, stream: Stream, recorded: list[Stream]) -> None:
    if stream._ctx._state is not ACTIVE:
        return  # the driver freed it with the context (or will, when it is destroyed)
    for other in recorded:
        if other._ctx._state is ACTIVE:
            stream.wait(other)  # the free is queued after that stream's work so far
    # At garbage collection there is no caller to raise to; a failure here means the
    # context was lost meanwhile, and the driver frees the memory with it.
    stream._call(stream._backend.driver.cuMemFreeAsync, ptr, stream._handle)


@contextlib.contextmanager
def defer_cleanup() -> Iterator[None]:
    """Hold every free of device memory until the (outermost) block ends, as Numba's
    ``defer_cleanup`` does: memory of arrays that die inside the block stays allocated, so
    work still queued on other streams may use it. Blocks nest; the hold is process-wide,
    because arrays may be collected on any thread."""
    global _defer_depth
    with _defer_lock:
        _defer_depth += 1
    try:
        yield
    finally:
        with _defer_lock:
            _defer_depth -= 1
            held = _deferred[:] if _defer_depth == 0 else []
            if held:
                _deferred.clear()
        for item in held:
            _release(*item)


def _allocation_stream(stream: Stream | Any | None, device: Device | int | None) -> Stream:
    if stream is None:
        return current_stream(device)
    stream = Stream.wrap(stream)
    if device is not None and stream.device is not Device(device):
        raise ValueError(f"device={Device(device)!r} but stream {stream!r} is on "
                         f"{stream.device!r}; pass one of them, or a stream of that device")
    return stream


def _allocate(nbytes: int, stream: Stream) -> _Allocation:
    ctx = stream._ctx
    if ctx._state is not ACTIVE:
        raise ctx._unusable("cuctx.empty")
    alloc = stream._backend.driver.cuMemAllocAsync
    err, ptr = stream._call(alloc, nbytes, stream._handle)
    if err and int(err) == _OUT_OF_MEMORY:
        # Let the pool hand back memory whose frees are still queued. The raw call: faults
        # and host-function errors of other work are for their own synchronize to report.
        with ctx._activated("cuctx.empty"):
            stream._backend.driver.cuCtxSynchronize()
        err, ptr = stream._call(alloc, nbytes, stream._handle)
    if err:
        hint = ""
        if int(err) == _OUT_OF_MEMORY:
            free, total = ctx.device.mem_info()
            hint = f"asked for {nbytes} bytes on device {ctx.device.ordinal} (free {free} of {total})"
        fail(stream._backend, err, "cuMemAllocAsync", ctx, hint)
    return _Allocation(int(ptr), stream)


# -- the device array ---------------------------------------------------------------------

class DeviceArray:
    """An n-dimensional array in device memory: ``shape``, ``dtype``, ``strides`` (bytes, as
    in NumPy), ``nbytes``, ``ptr`` (the device address), ``device`` and ``context``.

    Make one with `empty`, `zeros`, `full`, `to_device` or `asarray`. Basic indexing (ints,
    slices, ``...``, ``None``) returns views sharing the memory. The array keeps its context
    alive; after the context is destroyed every use raises `ContextDestroyedError`.
    """

    __slots__ = ("shape", "dtype", "strides", "ptr", "_ctx", "_alloc", "_owner", "_c", "_f",
                 "__weakref__")

    def __init__(self) -> None:
        raise TypeError("make device arrays with cuctx.empty/zeros/full/to_device/asarray")

    @classmethod
    def _make(cls, ctx: Context, ptr: int, shape: tuple[int, ...], dtype: np.dtype,
              strides: tuple[int, ...] | None, alloc: _Allocation | None, owner: Any = None):
        arr = object.__new__(cls)
        arr.shape = shape
        arr.dtype = dtype
        arr.strides = _c_strides(shape, dtype.itemsize) if strides is None else tuple(strides)
        arr.ptr = ptr
        arr._ctx = ctx
        arr._alloc = alloc  # keeps cuctx's memory allocated while any view lives
        arr._owner = owner  # keeps another library's memory alive (asarray)
        arr._c, arr._f = _contiguous(shape, arr.strides, dtype.itemsize)
        return arr

    # -- properties ---------------------------------------------------------------------

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    @property
    def device(self) -> Device:
        return self._ctx.device

    @property
    def context(self) -> Context:
        return self._ctx

    @property
    def is_contiguous(self) -> bool:
        """True when the elements are dense in C or Fortran order (copies need that)."""
        return self._c or self._f

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d device array")
        return self.shape[0]

    def __repr__(self) -> str:
        return (f"<DeviceArray shape={self.shape} dtype={self.dtype} device "
                f"{self._ctx.device.ordinal} ptr={self.ptr:#x}>")

    def __array__(self, *args, **kwargs):
        raise TypeError("a DeviceArray is not converted to NumPy implicitly; call "
                        "arr.to_host() to copy it to the host")

    def _check(self, operation: str) -> None:
        if self._ctx._state is not ACTIVE:
            raise self._ctx._unusable(operation)

    # -- views --------------------------------------------------------------------------

    def __getitem__(self, key) -> DeviceArray:
        key = key if isinstance(key, tuple) else (key,)
        for k in key:
            if not (k is None or k is Ellipsis or isinstance(k, slice)
                    or (hasattr(k, "__index__") and not isinstance(k, (bool, np.bool_)))):
                raise IndexError(f"device arrays take basic indices (ints, slices, ..., None), "
                                 f"not {type(k).__name__}; copy to the host for fancy indexing")
        if not any(k is Ellipsis for k in key):
            key += (Ellipsis,)  # so an int index yields a 0-d view, never a read
        fake = np.asarray(_Raw(_INDEX_BASE, self.shape, self.dtype, self.strides))
        view = fake[key]
        ptr = self.ptr + view.__array_interface__["data"][0] - _INDEX_BASE
        return DeviceArray._make(self._ctx, ptr if view.size else self.ptr, view.shape,
                                 self.dtype, view.strides, self._alloc, self._owner)

    # -- copies and fills ---------------------------------------------------------------

    def to_host(self, out: np.ndarray | None = None, stream: Stream | Any | None = None) -> np.ndarray:
        """Copy to the host and return the host array. Without ``out`` the result is a new
        (pageable) NumPy array and the copy is synchronous: the data is there on return.
        With a page-locked ``out`` (`pinned_empty`, `register_host`) the copy is
        asynchronous on ``stream``: synchronize the stream before reading ``out``."""
        if out is None:
            order = "F" if self._f and not self._c else "C"
            out = np.empty(self.shape, self.dtype, order=order)
        copy(out, self, stream)
        return out

    def copy_from(self, src: DeviceArray | np.ndarray, stream: Stream | Any | None = None) -> DeviceArray:
        """Copy ``src`` (host or device, same shape and dtype) into this array; see `copy`."""
        copy(self, src, stream)
        return self

    def fill(self, value: Any, stream: Stream | Any | None = None) -> DeviceArray:
        """Set every element to ``value`` (stream-ordered, on ``stream`` or the current
        stream). The value must be representable without truncation."""
        self._check("DeviceArray.fill")
        if not self.is_contiguous:
            raise ValueError(f"fill needs a contiguous array; {self!r} has strides {self.strides}")
        if self.dtype.kind in "biu" and np.asarray(value).dtype.kind in "fc":
            raise TypeError(f"cannot fill a {self.dtype} array with {value!r}: it would be "
                            "truncated; pass a whole number")
        if self.size:
            _memset(self, np.array(value, dtype=self.dtype).tobytes(),
                    resolve_stream(stream, self._ctx, "DeviceArray.fill"))
        return self

    def record_stream(self, stream: Stream | Any) -> None:
        """Tell the array that ``stream`` uses its memory (as torch's record_stream): when
        the memory is freed, the free waits for the work queued on ``stream`` until then,
        so no later allocation reuses it while ``stream`` may still read or write it."""
        self._check("DeviceArray.record_stream")
        stream = Stream.wrap(stream)
        if self._alloc is None:
            raise ValueError(f"{self!r} wraps memory of another library (cuctx.asarray); "
                             "that library frees it, so tell it about the stream instead")
        if stream != self._alloc.stream and stream not in self._alloc.recorded:
            self._alloc.recorded.append(stream)

    # -- interop ------------------------------------------------------------------------

    @property
    def __cuda_array_interface__(self) -> dict:
        """CUDA Array Interface v3. ``stream`` is this thread's current stream on the
        array's device: consumers make their work wait for it."""
        self._check("__cuda_array_interface__")
        return {"version": 3, "shape": self.shape, "typestr": self.dtype.str,
                "descr": [("", self.dtype.str)], "data": (self.ptr, False),
                "strides": None if self._c else self.strides,
                "stream": current_stream(self._ctx.device)._key}

    def __dlpack_device__(self) -> tuple[int, int]:
        return (_DL_CUDA, self._ctx.device.ordinal)

    def __dlpack__(self, *, stream: int | None = None, max_version=None, dl_device=None,
                   copy: bool | None = None):
        """A DLPack capsule viewing this array (zero copy; legacy, unversioned capsule,
        which consumers asking for a newer version accept). ``stream`` is the consumer's
        stream (None or 1: the legacy default stream, 2: per-thread, -1: no ordering); it
        is made to wait for this thread's current stream on the array's device."""
        self._check("__dlpack__")
        if copy:
            raise BufferError("cuctx exports device arrays without copying (copy=True asked)")
        if dl_device is not None and tuple(dl_device) != self.__dlpack_device__():
            raise BufferError(f"{self!r} is on {self.__dlpack_device__()}, not {dl_device}")
        if stream == 0:
            raise BufferError("stream=0 is ambiguous in DLPack: pass 1 (legacy) or 2 (per-thread)")
        if stream != -1:
            consumer = _foreign_stream(self._ctx, LEGACY if stream is None else stream)
            producer = current_stream(self._ctx.device)
            if consumer != producer:
                consumer.wait(producer)
        return _capsule(self.ptr, self.shape, self.strides, self.dtype,
                        self.__dlpack_device__(), self)


def _foreign_stream(ctx: Context, handle: int) -> Stream:
    """The stream another library names by ``handle``; the default streams' handles are
    taken in ``ctx`` (the memory's context), not in whichever context is current."""
    if handle in (LEGACY, PER_THREAD):
        return Stream._adopt(ctx, CUstream(handle), "legacy" if handle == LEGACY else "per-thread")
    return Stream.wrap(handle)


def _memset(arr: DeviceArray, pattern: bytes, stream: Stream) -> None:
    """Fill ``arr`` with the element ``pattern``: one memset for 1-, 2- and 4-byte
    patterns and repeating 4-byte words, else one strided 32-bit memset per word."""
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
            results = [call(drv.cuMemsetD2D32Async, arr.ptr + 4 * i, len(pattern), w, 1, n, h)
                       for i, w in enumerate(words)]
    for err, in results:
        if err:
            fail(stream._backend, err, "cuMemset", arr._ctx)


# -- making arrays ------------------------------------------------------------------------

def empty(shape: int | tuple[int, ...], dtype: Any = np.float64, *, stream: Stream | Any | None = None,
          device: Device | int | None = None) -> DeviceArray:
    """An uninitialised C-contiguous device array, allocated stream-ordered on ``stream``
    (default: the current stream of ``device``, default the current device)."""
    shape, dtype = _shape(shape), _dtype(dtype)
    stream = _allocation_stream(stream, device)
    nbytes = prod(shape) * dtype.itemsize
    if nbytes == 0:  # the driver answers a null pointer; an empty array needs no memory
        stream._ctx._check("cuctx.empty")
        return DeviceArray._make(stream._ctx, 0, shape, dtype, None, None)
    alloc = _allocate(nbytes, stream)
    return DeviceArray._make(stream._ctx, alloc.ptr, shape, dtype, None, alloc)


def zeros(shape: int | tuple[int, ...], dtype: Any = np.float64, *, stream: Stream | Any | None = None,
          device: Device | int | None = None) -> DeviceArray:
    """A device array of zeros (stream-ordered, see `empty`)."""
    return full(shape, 0, dtype, stream=stream, device=device)


def full(shape: int | tuple[int, ...], value: Any, dtype: Any = None, *,
         stream: Stream | Any | None = None, device: Device | int | None = None) -> DeviceArray:
    """A device array with every element ``value``; ``dtype`` defaults to NumPy's choice
    for ``value``."""
    dtype = np.asarray(value).dtype if dtype is None else dtype
    arr = empty(shape, dtype, stream=stream, device=device)
    return arr.fill(value, stream=arr._alloc.stream if arr._alloc else None)


def to_device(ary: Any, stream: Stream | Any | None = None, *,
              device: Device | int | None = None) -> DeviceArray:
    """A new device array holding a copy of ``ary`` (a NumPy array or anything
    ``numpy.asarray`` takes). From pageable memory the copy is synchronous; from
    page-locked memory (`pinned_empty`, `register_host`) it is asynchronous on ``stream``:
    keep ``ary`` unchanged until the stream is synchronized."""
    host = np.asarray(ary)
    if not host.flags.c_contiguous:
        host = np.ascontiguousarray(host)
    arr = empty(host.shape, host.dtype, stream=stream, device=device)
    copy(arr, host, arr._alloc.stream if arr._alloc else None)
    return arr


# -- copies -------------------------------------------------------------------------------

def copy(dst: DeviceArray | np.ndarray, src: DeviceArray | np.ndarray,
         stream: Stream | Any | None = None) -> None:
    """Copy ``src`` into ``dst`` (same shape and dtype, both contiguous in the same order),
    stream-ordered on ``stream`` (default: the current stream of the device side; of
    ``dst``'s device between devices). Every direction: host to device, device to host,
    device to device, and between devices (peer).

    A copy with a page-locked host side (`pinned_empty`, `register_host`) is asynchronous;
    with a pageable host side it is synchronous, as in CUDA: it returns when the host
    array may be reused (host to device) or holds the data (device to host). Only
    page-locked copies overlap with other work.
    """
    if dst.__class__ is DeviceArray:
        if src.__class__ is DeviceArray:
            _copy_device(dst, src, stream)
        else:
            _copy_host(dst, src, stream, to_device=True)
    elif src.__class__ is DeviceArray:
        _copy_host(src, dst, stream, to_device=False)
    else:
        raise TypeError(f"cuctx.copy needs a DeviceArray on at least one side, got "
                        f"{type(dst).__name__} and {type(src).__name__}; use numpy.copyto "
                        "between host arrays")


def _matching(dst, src, c: bool, f: bool) -> int:
    """Check that dst and src describe the same bytes; return how many."""
    if dst.shape != src.shape:
        raise ValueError(f"cuctx.copy: shapes differ: dst {dst.shape}, src {src.shape}")
    if dst.dtype != src.dtype:
        raise TypeError(f"cuctx.copy: dtypes differ: dst {dst.dtype}, src {src.dtype}; "
                        "copies do not convert (convert on the host with astype first)")
    if not (c or f):
        raise ValueError("cuctx.copy needs both arrays contiguous in the same order "
                         f"(dst strides {dst.strides}, src strides {src.strides}); copy "
                         "whole arrays and slice on the host, or use numpy.ascontiguousarray")
    return dst.nbytes


def _copy_host(arr: DeviceArray, host: Any, stream, to_device: bool) -> None:
    if not isinstance(host, np.ndarray):
        raise TypeError(f"cuctx.copy: the host side must be a numpy.ndarray, not "
                        f"{type(host).__name__} (use numpy.asarray(x, dtype=...) first)")
    ctx = arr._ctx
    if ctx._state is not ACTIVE:
        raise ctx._unusable("cuctx.copy")
    flags = host.flags
    if to_device:
        n = _matching(arr, host, arr._c and flags.c_contiguous, arr._f and flags.f_contiguous)
    else:
        n = _matching(host, arr, arr._c and flags.c_contiguous, arr._f and flags.f_contiguous)
        if not flags.writeable:
            raise ValueError("cuctx.copy: the destination host array is read-only")
    if n == 0:
        return
    stream = resolve_stream(stream, ctx, "cuctx.copy")
    drv = stream._backend.driver
    address = host.__array_interface__["data"][0]
    if to_device:
        err, = stream._call(drv.cuMemcpyHtoDAsync, arr.ptr, address, n, stream._handle)
    else:
        err, = stream._call(drv.cuMemcpyDtoHAsync, address, arr.ptr, n, stream._handle)
    if err:
        fail(stream._backend, err, "cuMemcpyHtoDAsync" if to_device else "cuMemcpyDtoHAsync", ctx)
    if _page_locked(address, n):  # asynchronous: the host array must outlive the copy
        hold(stream, host)


def _copy_device(dst: DeviceArray, src: DeviceArray, stream) -> None:
    for arr in (dst, src):
        if arr._ctx._state is not ACTIVE:
            raise arr._ctx._unusable("cuctx.copy")
    if dst._ctx._backend is not src._ctx._backend:
        raise ValueError("cuctx.copy: the arrays belong to different backends")
    n = _matching(dst, src, dst._c and src._c, dst._f and src._f)
    if n == 0:
        return
    if dst._ctx is src._ctx:
        stream = resolve_stream(stream, dst._ctx, "cuctx.copy")
        drv = stream._backend.driver
        err, = stream._call(drv.cuMemcpyDtoDAsync, dst.ptr, src.ptr, n, stream._handle)
        op = "cuMemcpyDtoDAsync"
    else:  # between devices or contexts: a peer copy, on a stream of either side
        if stream is not None and Stream.wrap(stream)._ctx is src._ctx:
            stream = Stream.wrap(stream)
        else:
            stream = resolve_stream(stream, dst._ctx, "cuctx.copy (between devices)")
        drv = stream._backend.driver
        err, = stream._call(drv.cuMemcpyPeerAsync, dst.ptr, dst._ctx._handle, src.ptr,
                            src._ctx._handle, n, stream._handle)
        op = "cuMemcpyPeerAsync"
    if err:
        fail(stream._backend, err, op, stream._ctx)


# -- host memory --------------------------------------------------------------------------

def _host_context(device: Device | int | None) -> Context:
    """Page-locked memory lives in a device's *primary* context: only a device reset can
    take it away (a created context could be destroyed under a NumPy array using it)."""
    return (current_device() if device is None else Device(device)).primary_context


# The page-locked host ranges cuctx made (start -> end, starts sorted): a copy with one is
# asynchronous, so its stream must hold the host array until the copy has run.
_locked_starts: list[int] = []
_locked_ends: dict[int, int] = {}
_locked_lock = threading.Lock()


def _lock_range(start: int, nbytes: int) -> None:
    with _locked_lock:
        bisect.insort(_locked_starts, start)
        _locked_ends[start] = start + nbytes


def _page_locked(address: int, nbytes: int) -> bool:
    i = bisect.bisect_right(_locked_starts, address) - 1
    return i >= 0 and address + nbytes <= _locked_ends.get(_locked_starts[i], 0)


class _PinnedMemory:
    """Owns page-locked host memory; it is the ``base`` of the NumPy array over it."""

    __slots__ = ("__array_interface__", "__weakref__")

    def __init__(self, ctx: Context, ptr: int, nbytes: int, shape, dtype: np.dtype):
        self.__array_interface__ = {"data": (ptr, False), "shape": shape, "typestr": dtype.str,
                                    "version": 3}
        _lock_range(ptr, nbytes)
        weakref.finalize(self, _host_call, ctx, "cuMemFreeHost", ptr).atexit = False


def _host_call(ctx: Context, operation: str, ptr: int) -> None:
    """Free or unregister page-locked memory (its range is forgotten first)."""
    with _locked_lock:
        if _locked_ends.pop(ptr, None) is not None:
            _locked_starts.remove(ptr)
    if ctx._state is ACTIVE:  # a reset or destroyed context took the memory with it
        with ctx._activated(operation):
            getattr(ctx._backend.driver, operation)(ptr)


def pinned_empty(shape: int | tuple[int, ...], dtype: Any = np.float64, *,
                 device: Device | int | None = None) -> np.ndarray:
    """An uninitialised NumPy array in page-locked host memory (cuMemHostAlloc, portable
    to all contexts). Copies to and from it are asynchronous and overlap with compute; it
    is freed when the array (and every view of it) is gone. It belongs to the primary
    context of ``device`` (default: the current device): ``device.reset()`` frees it too,
    so do not use the array after a reset."""
    shape, dtype = _shape(shape), np.dtype(dtype)
    nbytes = prod(shape) * dtype.itemsize
    if nbytes == 0:
        return np.empty(shape, dtype)
    ctx = _host_context(device)
    with ctx._activated("pinned_empty"):
        err, ptr = ctx._backend.driver.cuMemHostAlloc(nbytes, _HOST_PORTABLE)
    if err:
        fail(ctx._backend, err, "cuMemHostAlloc", ctx,
             f"asked for {nbytes} bytes of page-locked host memory")
    return np.asarray(_PinnedMemory(ctx, int(ptr), nbytes, shape, dtype))


def register_host(ary: np.ndarray, *, device: Device | int | None = None) -> np.ndarray:
    """Page-lock the memory of the contiguous NumPy array ``ary`` (cuMemHostRegister,
    portable) for as long as ``ary`` lives, so copies with it become asynchronous; return
    ``ary``. Registering memory that is already page-locked raises."""
    if not isinstance(ary, np.ndarray):
        raise TypeError(f"register_host takes a numpy.ndarray, not {type(ary).__name__}")
    if not (ary.flags.c_contiguous or ary.flags.f_contiguous):
        raise ValueError("register_host needs a contiguous array (it pins one address range)")
    if ary.nbytes == 0:
        return ary
    ctx = _host_context(device)
    ptr = ary.__array_interface__["data"][0]
    with ctx._activated("register_host"):
        err, = ctx._backend.driver.cuMemHostRegister(ptr, ary.nbytes, _HOST_PORTABLE)
    if err:
        fail(ctx._backend, err, "cuMemHostRegister", ctx,
             "this memory is already page-locked (pinned_empty or an earlier register_host)"
             if int(err) == 712 else "")
    _lock_range(ptr, ary.nbytes)
    weakref.finalize(ary, _host_call, ctx, "cuMemHostUnregister", ptr).atexit = False
    return ary


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
        raise TypeError("cuctx.asarray wraps device memory; this is a NumPy (host) array: "
                        "copy it with cuctx.to_device(ary)")
    raise TypeError(f"cuctx.asarray cannot wrap {type(obj).__name__}: it has neither "
                    "__cuda_array_interface__ nor __dlpack__")


def _context_of(ptr: int) -> Context:
    """The primary context of the device the memory at ``ptr`` is on (unified addressing
    tells it), where PyTorch, CuPy and Numba allocate."""
    if ptr == 0:  # empty arrays have no memory
        return current_device().primary_context
    backend = _driver.active()
    err, ordinal = backend.driver.cuPointerGetAttribute(
        CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr)
    if err:
        fail(backend, err, "cuPointerGetAttribute",
             hint=f"{ptr:#x} is not device memory the driver knows")
    return Device(int(ordinal)).primary_context


def _consumer(ctx: Context, stream: Stream | Any | None) -> Stream:
    """The stream that will use an imported array: ``stream``, else the current one."""
    return current_stream(ctx.device) if stream is None else Stream.wrap(stream)


def _after(ctx: Context, producer: int | None, stream: Stream | Any | None) -> None:
    """Make the consuming stream wait for the producer's stream."""
    if producer is None:
        return
    consumer = _consumer(ctx, stream)
    theirs = _foreign_stream(ctx, int(producer))
    if consumer != theirs:
        consumer.wait(theirs)


def _from_cai(obj: Any, cai: dict, stream: Stream | Any | None) -> DeviceArray:
    if cai.get("mask") is not None:
        raise ValueError("cuctx.asarray: masked arrays (a CUDA Array Interface 'mask') are "
                         "not supported")
    shape = _shape(tuple(cai["shape"]))
    dtype = _dtype(cai["typestr"])
    ptr = int(cai["data"][0])
    ctx = _context_of(ptr)
    _after(ctx, cai.get("stream"), stream)
    return DeviceArray._make(ctx, ptr, shape, dtype, cai.get("strides"), None, obj)


def _from_dlpack(obj: Any, stream: Stream | Any | None) -> DeviceArray:
    kind, ordinal = obj.__dlpack_device__()
    if int(kind) != _DL_CUDA:
        raise TypeError(f"cuctx.asarray: {type(obj).__name__} is on DLPack device type "
                        f"{int(kind)}, not CUDA (2); copy host data with cuctx.to_device")
    ctx = Device(int(ordinal)).primary_context
    capsule = obj.__dlpack__(stream=_consumer(ctx, stream)._key)
    return _import_capsule(capsule, ctx)


# -- DLPack capsules (ctypes only for the DLPack structs and the capsule API) ---------------

class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    pass


_DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(_DLManagedTensor))
_DLManagedTensor._fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p),
                             ("deleter", _DELETER)]

_DL_CODE = {"i": 0, "u": 1, "f": 2, "c": 5, "b": 6}
_DL_KIND = {v: k for k, v in _DL_CODE.items()}
_NAME, _USED_NAME = b"dltensor", b"used_dltensor"  # module constants: capsules keep the pointer

_api = ctypes.pythonapi
_api.PyCapsule_New.restype = ctypes.py_object
_api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_api.PyCapsule_IsValid.restype = ctypes.c_int
_api.PyCapsule_IsValid.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_SetName.restype = ctypes.c_int
_api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]

_exports: dict[int, tuple] = {}  # manager_ctx -> what an exported tensor keeps alive
_export_keys = iter(range(1, 1 << 62))


@_DELETER
def _delete_export(managed):
    _exports.pop(managed.contents.manager_ctx, None)


@ctypes.CFUNCTYPE(None, ctypes.c_void_p)
def _capsule_destructor(capsule, _finalizing=sys.is_finalizing):
    # A capsule nobody consumed still owns its tensor; a consumer renames it and calls
    # the deleter itself when done. Capsules still alive at interpreter exit are destroyed
    # after this module's globals are gone: then there is nothing left to free.
    try:
        if _api.PyCapsule_IsValid(capsule, _NAME):
            _call_deleter(_api.PyCapsule_GetPointer(ctypes.cast(capsule, ctypes.py_object), _NAME))
    except Exception:
        if not _finalizing():
            raise


_DESTRUCTOR = ctypes.cast(_capsule_destructor, ctypes.c_void_p).value


def _call_deleter(address: int) -> None:
    managed = ctypes.cast(address, ctypes.POINTER(_DLManagedTensor))
    if managed.contents.deleter:
        managed.contents.deleter(managed)


def _capsule(ptr: int, shape, strides, dtype: np.dtype, device: tuple[int, int], owner: Any):
    """A "dltensor" capsule describing memory at ``ptr``; it keeps ``owner`` alive until
    the consumer is done with it (or the capsule is dropped unused)."""
    if dtype.kind not in _DL_CODE:
        raise BufferError(f"DLPack cannot describe {dtype}")
    ndim = len(shape)
    c_shape = (ctypes.c_int64 * max(ndim, 1))(*shape)
    c_strides = (ctypes.c_int64 * max(ndim, 1))(*(s // dtype.itemsize for s in strides))
    key = next(_export_keys)
    managed = _DLManagedTensor()
    managed.dl_tensor = _DLTensor(
        ptr, _DLDevice(*device), ndim, _DLDataType(_DL_CODE[dtype.kind], 8 * dtype.itemsize, 1),
        ctypes.cast(c_shape, ctypes.POINTER(ctypes.c_int64)),
        ctypes.cast(c_strides, ctypes.POINTER(ctypes.c_int64)), 0)
    managed.manager_ctx = key
    managed.deleter = _delete_export
    _exports[key] = (managed, c_shape, c_strides, owner)
    return _api.PyCapsule_New(ctypes.addressof(managed), _NAME, _DESTRUCTOR)


class _DLPackOwner:
    """Holds a consumed DLPack tensor; calls its deleter when the last array using it goes."""

    __slots__ = ("__weakref__",)

    def __init__(self, address: int):
        weakref.finalize(self, _call_deleter, address).atexit = False


def _import_capsule(capsule: Any, ctx: Context) -> DeviceArray:
    address = _api.PyCapsule_GetPointer(capsule, _NAME)  # raises for a used/foreign capsule
    tensor = ctypes.cast(address, ctypes.POINTER(_DLManagedTensor)).contents.dl_tensor
    code, bits, lanes = tensor.dtype.code, tensor.dtype.bits, tensor.dtype.lanes
    if code not in _DL_KIND or lanes != 1 or bits % 8:
        raise TypeError(f"cuctx.asarray: DLPack dtype (code {code}, {bits} bits, {lanes} "
                        "lanes) has no NumPy equivalent")
    dtype = _dtype(f"{_DL_KIND[code]}{bits // 8}" if code != 6 else "?")
    if (tensor.device.device_type, tensor.device.device_id) != (_DL_CUDA, ctx.device.ordinal):
        raise BufferError(f"cuctx.asarray: the DLPack tensor is on device {tensor.device.device_type}"
                          f"/{tensor.device.device_id}, not the CUDA device "
                          f"{ctx.device.ordinal} its producer named")
    ndim = tensor.ndim
    shape = tuple(tensor.shape[i] for i in range(ndim))
    strides = tuple(tensor.strides[i] * dtype.itemsize for i in range(ndim)) \
        if tensor.strides else None
    ptr = (tensor.data or 0) + tensor.byte_offset
    _api.PyCapsule_SetName(capsule, _USED_NAME)  # ours now: its destructor must not delete
    return DeviceArray._make(ctx, ptr, shape, dtype, strides, None, _DLPackOwner(address))
