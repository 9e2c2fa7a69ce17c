"""Device memory (`DeviceArray`), `empty` and copies; the exports of interop (CUDA Array
Interface, DLPack). The other constructors (`zeros`, `full`, `to_device`, `asarray`) are
`_construct`'s.

Device memory is allocated stream-ordered from the device's memory pool (cuMemAllocAsync)
on the stream the allocation names (the current stream by default), and freed the same way
on that stream when the last array using it goes. A freed block may be reused at once by
later allocations on that stream, which is safe because they run after everything queued
before the free. Work on *other* streams is not ordered with the free: `record_stream` tells
the array about such a stream, and the free then waits for that stream's work (an event
recorded on it, waited on by the allocation stream), as PyTorch's caching allocator does.
``with defer_cleanup():`` holds every free until the block ends, as in Numba.

Copies take any layouts of equal shape and dtype (views, transposes, reversed axes): each is
planned as rows of contiguous bytes (_layout.plan) and issued as 1D, 2D and 3D copies
(_copy.issue), or staged through a temporary where that needs fewer driver calls. Only
copies whose host side is page-locked (_host.py) are asynchronous; with ordinary (pageable)
memory they are synchronous, as in CUDA.
"""

from __future__ import annotations

from math import prod
from typing import TYPE_CHECKING, Any, Iterator

import numpy as np

from .. import _record
from . import _interop, _layout
from ._alloc import Allocation, allocate, pool_device
from ._copy import copy_host, fill_pattern, memset
from ._copy_device import copy_device
from ._host import HostBytes, pinned_empty, register_host
from .._lifetimes import defer_cleanup
from .._resource import Resource, upper
from ..context import ACTIVE, Context
from ..device import Device
from ..stream import Stream, current_stream, resolve_stream
from .._driver import LEGACY

if TYPE_CHECKING:
    from ._pool import IpcDescriptor, MemoryPool

__all__ = ["DeviceArray", "copy", "defer_cleanup", "empty", "pinned_empty", "register_host"]

# -- the device array ---------------------------------------------------------------------


class DeviceArray(Resource):
    """An n-dimensional array in device memory: ``shape``, ``dtype``, ``strides`` (bytes, as
    in NumPy), ``nbytes``, ``ptr`` (the device address), ``device`` and ``context``.

    Make one with `empty`, `zeros`, `full`, `to_device` or `asarray`. Basic indexing (ints,
    slices, ``...``, ``None``, 0-d integer arrays), `reshape`, `view`, `transpose` and ``.T``
    return views sharing the memory; `copy` makes a new array. The array keeps its context
    alive; after the context is destroyed every use raises `ContextDestroyedError`.
    """

    __slots__ = ("shape", "dtype", "strides", "ptr", "_alloc", "_owner", "_c", "_f", "__weakref__")

    def __init__(self) -> None:
        raise TypeError("make device arrays with cuctx.empty/zeros/full/to_device/asarray")

    @classmethod
    def _make(
        cls,
        ctx: Context,
        ptr: int,
        shape: tuple[int, ...],
        dtype: np.dtype,
        strides: tuple[int, ...] | None,
        alloc: Allocation | None,
        owner: Any = None,
        contiguity: tuple[bool, bool] | None = None,
    ):
        """``contiguity``: (C, Fortran) where the caller knows it, else worked out."""
        arr = object.__new__(cls)
        arr.shape = shape
        arr.dtype = dtype
        arr.strides = (
            _layout.c_strides(shape, dtype.itemsize) if strides is None else tuple(strides)
        )
        arr.ptr = arr._handle = arr._key = ptr  # the Resource protocol's handle: the address
        arr._ctx = ctx
        arr._backend = ctx._backend
        arr._alloc = alloc  # keeps cuctx's memory allocated while any view lives
        arr._owner = owner  # keeps another library's memory alive (asarray)
        arr._c, arr._f = (
            _layout.contiguity(shape, arr.strides, dtype.itemsize)
            if contiguity is None
            else contiguity
        )
        return arr

    def _view(self, offset: int, shape, strides, dtype: np.dtype | None = None) -> DeviceArray:
        dtype = self.dtype if dtype is None else dtype
        ptr = self.ptr + offset if prod(shape) else self.ptr  # an empty view points nowhere new
        return DeviceArray._make(
            self._ctx, ptr, tuple(shape), dtype, tuple(strides), self._alloc, self._owner
        )

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
    def pool(self) -> MemoryPool | None:
        """The `MemoryPool` the memory came from (the device's default pool for plain
        ``cuctx.empty``); None for managed memory and memory of other libraries."""
        if self._alloc is None:  # an empty array holds the pool it was asked of
            return self._owner if isinstance(self._owner, upper.memory_pool) else None
        return self._alloc.pool or self._ctx._device.memory_pool

    @property
    def host(self) -> np.ndarray:
        """A NumPy array over the same memory, for arrays of host memory: managed arrays
        (`managed_empty`) and arrays of a host or managed `MemoryPool`. Read or write it only
        while no device work using the array is queued (after a synchronize); device work
        sees host writes made before it was enqueued."""
        owner, pool, alloc = self._owner, self.pool, self._alloc
        if pool is not None and pool._location != "device":
            owner = HostBytes(alloc.ptr, alloc.nbytes, alloc) if alloc else HostBytes(0, 0)
        view = getattr(owner, "host_view", None)
        if view is None:
            raise TypeError(
                f"{self!r} is device memory, which the host cannot address: copy "
                "it with arr.to_host(), or allocate it with cuctx.managed_empty for a "
                "host view (or from a MemoryPool(device, location='host'))"
            )
        self._check("DeviceArray.host")
        return view(self)

    def _ipc_descriptor(self) -> IpcDescriptor:
        """This array for another process (`MemoryPool._import_array` there); see
        docs/memory.md. Only arrays of a ``MemoryPool(device, ipc=True)`` can be shared."""
        return self._sharing_pool("share")._describe(self)

    def __reduce__(self):
        """An array of an ipc pool pickles as the same memory, for another process of this
        machine (docs/memory.md); any other refuses with a TypeError."""
        return self._sharing_pool("pickle")._pickle_array(self)

    def _sharing_pool(self, operation: str) -> MemoryPool:
        """The pool that shares this array with another process (and refuses without ipc)."""
        if self.pool is None:
            raise sharing_refused(
                self,
                "managed memory"
                if hasattr(self._owner, "host_view")
                else "memory of another library (cuctx.asarray)",
                operation,
            )
        return self.pool

    @property
    def is_contiguous(self) -> bool:
        """True when the elements are dense in C or Fortran order."""
        return self._c or self._f

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d device array")
        return self.shape[0]

    def __iter__(self) -> Iterator[DeviceArray]:
        if not self.shape:
            raise TypeError("iteration over a 0-d device array")
        return (self[i] for i in range(self.shape[0]))

    def __bool__(self) -> bool:
        raise TypeError(
            "the truth value of a device array needs its data: test "
            "arr.to_host() (or use arr.size to ask whether it is empty)"
        )

    def __repr__(self) -> str:
        # Reads only what the object holds: safe for destroyed and poisoned contexts.
        state = "" if self._ctx._state is ACTIVE else f" context {self._ctx._state}"
        return (
            f"<DeviceArray shape={self.shape} {self.dtype} device "
            f"{self._ctx._device.ordinal} ptr={self.ptr:#x}{state}>"
        )

    def __array__(self, *args, **kwargs):
        raise TypeError(
            "a DeviceArray is not converted to NumPy implicitly; call "
            "arr.to_host() to copy it to the host"
        )

    # -- views --------------------------------------------------------------------------

    def __getitem__(self, key) -> DeviceArray:
        if key.__class__ is slice and key.step is None and self._c and self.shape:
            # arr[a:b] of a C-contiguous array (every pipeline's chunks): a C-contiguous
            # view, without the general indexing's arithmetic
            try:
                start, stop, _ = key.indices(self.shape[0])
            except (TypeError, ValueError):
                pass  # the general path says what is wrong with it
            else:
                rest = self.shape[1:]
                n = stop - start if stop > start else 0
                ptr = self.ptr + start * self.strides[0] if n and 0 not in rest else self.ptr
                return DeviceArray._make(
                    self._ctx,
                    ptr,
                    (n, *rest),
                    self.dtype,
                    self.strides,
                    self._alloc,
                    self._owner,
                    None if rest else (True, True),
                )
        offset, shape, strides = _layout.index(self.shape, self.strides, key)
        return self._view(offset, shape, strides)

    def reshape(self, *shape: int | tuple[int, ...], order: str = "C") -> DeviceArray:
        """A view with another shape (one dimension may be -1), read in ``order`` ("C",
        "F", or "A": F when the array is Fortran- and not C-contiguous), as NumPy's
        reshape. Where no view can do it (a non-contiguous layout), ValueError: copy first
        (``arr.copy().reshape(...)``)."""
        if order not in ("C", "F", "A"):
            raise ValueError(f"order must be 'C', 'F' or 'A', not {order!r}")
        if order == "A":
            order = "F" if self._f and not self._c else "C"
        new = _layout.resolve_shape(self.size, shape[0] if len(shape) == 1 else shape)
        strides = _layout.reshape(self.shape, self.strides, self.dtype.itemsize, new, order)
        if strides is None:
            advice = (
                f"arr.copy().reshape({new})"
                if order == "C"
                else f"arr.T.copy().T.reshape({new}, order='F')"
            )  # an F-contiguous copy
            raise ValueError(
                f"cannot reshape {self!r} (strides {self.strides}) to {new} "
                f"without copying; copy it first: {advice}"
            )
        return self._view(0, new, strides)

    def view(self, dtype: Any) -> DeviceArray:
        """The same memory read as ``dtype``, by NumPy's rules: a different itemsize
        rescales the last axis, which must then be contiguous."""
        dtype = _layout.dtype_of(dtype)
        shape, strides = _layout.view_dtype(self.shape, self.strides, self.dtype, dtype)
        return self._view(0, shape, strides, dtype)

    def transpose(self, *axes: int) -> DeviceArray:
        """A view with the axes permuted (reversed when none are given), as NumPy's."""
        order = _layout.axes_order(self.ndim, axes)
        return self._view(0, [self.shape[a] for a in order], [self.strides[a] for a in order])

    @property
    def T(self) -> DeviceArray:
        """The transposed view (axes reversed)."""
        return self.transpose()

    # -- copies and fills ---------------------------------------------------------------

    def copy(self, stream: Stream | Any | None = None) -> DeviceArray:
        """A new C-contiguous array with this one's values, allocated and copied
        stream-ordered on ``stream`` (default: the current stream of the array's context)."""
        self._check("DeviceArray.copy")
        stream = resolve_stream(stream, self._ctx, "DeviceArray.copy")
        out = empty(self.shape, self.dtype, stream=stream)
        copy(out, self, stream)
        return out

    def to_host(
        self, out: np.ndarray | None = None, stream: Stream | Any | None = None
    ) -> np.ndarray:
        """Copy to the host and return the host array. Without ``out`` the result is a new
        (pageable) NumPy array and the copy is synchronous: the data is there on return.
        With a page-locked ``out`` (`pinned_empty`, `register_host`) the copy is
        asynchronous on ``stream``: synchronize the stream before reading ``out``."""
        if out is None:
            order = "F" if self._f and not self._c else "C"
            out = np.empty(self.shape, self.dtype, order=order)
        copy(out, self, stream)
        return out

    def copy_from(
        self, src: DeviceArray | np.ndarray, stream: Stream | Any | None = None
    ) -> DeviceArray:
        """Copy ``src`` (host or device, same shape and dtype) into this array; see `copy`."""
        copy(self, src, stream)
        return self

    def fill(self, value: Any, stream: Stream | Any | None = None) -> DeviceArray:
        """Set every element to ``value`` (stream-ordered, on ``stream`` or the current
        stream). The value must be one number representable without truncation. A
        non-contiguous view is filled through a contiguous temporary (memset, then copy)."""
        self._check("DeviceArray.fill")
        pattern = fill_pattern(value, self.dtype)
        if not self.size:
            return self
        stream = resolve_stream(stream, self._ctx, "DeviceArray.fill")
        if self.is_contiguous and self.ptr % min(len(pattern), 4) == 0:
            memset(self, pattern, stream)
        else:  # memsets need dense, aligned memory; copies need neither
            dense = empty(self.shape, self.dtype, stream=stream)
            memset(dense, pattern, stream)
            copy(self, dense, stream)
        return self

    def record_stream(self, stream: Stream | Any) -> None:
        """Tell the array that ``stream`` uses its memory (as torch's record_stream): when
        the memory is freed, the free waits for the work queued on ``stream`` until then,
        so no later allocation reuses it while ``stream`` may still read or write it."""
        self._check("DeviceArray.record_stream")
        stream = Stream.wrap(stream)
        if self._alloc is None and (self.ptr == 0 or hasattr(self._owner, "host_view")):
            return  # no memory to keep, or managed memory: its free waits for all work
        if self._alloc is None:
            raise ValueError(
                f"{self!r} wraps memory of another library (cuctx.asarray); "
                "that library frees it, so tell it about the stream instead"
            )
        if stream != self._alloc.stream and stream not in self._alloc.recorded:
            self._alloc.recorded.append(stream)

    # -- interop ------------------------------------------------------------------------

    @property
    def __cuda_array_interface__(self) -> dict:
        """CUDA Array Interface v3. ``stream`` is this thread's current stream on the
        array's device: consumers make their work wait for it."""
        self._check("__cuda_array_interface__")
        if _record.threads:  # another library will enqueue work on it: not recorded
            _record.interrupt("__cuda_array_interface__ (another library uses the array)")
        return {
            "version": 3,
            "shape": self.shape,
            "typestr": self.dtype.str,
            "descr": [("", self.dtype.str)],
            "data": (self.ptr, False),
            "strides": None if self._c else self.strides,
            "stream": current_stream(self._ctx.device)._key,
        }

    def __dlpack_device__(self) -> tuple[int, int]:
        return (_interop.DL_CUDA, self._ctx._device.ordinal)

    def __dlpack__(
        self,
        *,
        stream: int | None = None,
        max_version: tuple[int, int] | None = None,
        dl_device: tuple[int, int] | None = None,
        copy: bool | None = None,
    ):
        """A DLPack capsule viewing this array (zero copy): versioned ("dltensor_versioned",
        DLPack 1.0) when the consumer's ``max_version`` is (1, x) or newer, else legacy.
        ``stream`` is the consumer's stream (None or 1: the legacy default stream, 2:
        per-thread, -1: no ordering); it is made to wait for this thread's current stream
        on the array's device. A consumer that rejects the capsule frees it: its error
        reaches its caller, and the array's memory is not held."""
        self._check("__dlpack__")
        if _record.threads:  # another library will enqueue work on it: not recorded
            _record.interrupt("__dlpack__ (another library uses the array)")
        if copy:
            raise BufferError("cuctx exports device arrays without copying (copy=True asked)")
        if dl_device is not None and tuple(dl_device) != self.__dlpack_device__():
            raise BufferError(
                f"{self!r} is on DLPack device {self.__dlpack_device__()}, not "
                f"{tuple(dl_device)}; copy it with arr.to_host() for the host"
            )
        if stream == 0:
            raise BufferError("stream=0 is ambiguous in DLPack: pass 1 (legacy) or 2 (per-thread)")
        if stream != -1:
            consumer = resolve_stream(LEGACY if stream is None else stream, self._ctx)
            producer = current_stream(self._ctx.device)
            if consumer != producer:
                consumer.wait(producer)
        return _interop.export(
            self,
            self.ptr,
            self.shape,
            self.strides,
            self.dtype,
            self.__dlpack_device__(),
            max_version,
        )


def sharing_refused(arr: DeviceArray, what: str, operation: str) -> TypeError:
    """The refusal to ``operation`` ("share", "pickle") ``arr``, whose memory is ``what``."""
    if operation == "pickle":
        return TypeError(
            f"cannot pickle {arr!r}: it is {what}; only arrays of a MemoryPool("
            "device, ipc=True) pickle (as the same memory, for another process of "
            "this machine): allocate it with cuctx.empty(..., pool=pool), or pickle "
            "arr.to_host() to send its contents"
        )
    return TypeError(
        f"cannot share {arr!r} with another process: it is {what}; allocate it "
        "from a MemoryPool(device, ipc=True) (cuctx.empty(..., pool=pool))"
    )


# -- making arrays ------------------------------------------------------------------------


def empty(
    shape: int | tuple[int, ...],
    dtype: Any = np.float64,
    *,
    stream: Stream | Any | None = None,
    device: Device | int | None = None,
    pool: MemoryPool | None = None,
) -> DeviceArray:
    """An uninitialised C-contiguous device array, allocated stream-ordered on ``stream``
    (default: the current stream of ``device``, default the current device, or of
    ``pool``'s device) from ``pool`` (a `MemoryPool`; default: the device's own)."""
    shape, dtype = _layout.shape_of(shape), _layout.dtype_of(dtype)
    if pool is not None:
        device = pool_device(pool, device)
    stream = resolve_stream(
        stream,
        operation="cuctx.empty",
        device=None if pool is not None and stream is not None else device,
    )
    nbytes = _layout.nbytes_of(shape, dtype, "device array")
    if nbytes == 0:  # the driver answers a null pointer; an empty array needs no memory
        stream._ctx._check("cuctx.empty")
        return DeviceArray._make(
            stream._ctx, 0, shape, dtype, None, None, pool or stream._ctx._device.memory_pool
        )
    alloc = allocate(nbytes, stream, pool)
    return DeviceArray._make(stream._ctx, alloc.ptr, shape, dtype, None, alloc)


# -- copies -------------------------------------------------------------------------------


def copy(
    dst: DeviceArray | np.ndarray, src: DeviceArray | np.ndarray, stream: Stream | Any | None = None
) -> None:
    """Copy ``src`` into ``dst`` (same shape and dtype, any layouts), stream-ordered on
    ``stream`` (default: the current stream of the device side's context; of ``dst``'s
    between devices or contexts, where a stream of either side may be given, but of the
    device side's opposite a host pool's array). Every direction: host to device and back,
    device to device, between contexts of a device, between devices, with host pools' arrays.

    A copy with a page-locked host side (`pinned_empty`, `register_host`) is asynchronous;
    with a pageable host side it is synchronous, as in CUDA: it returns when the host
    array may be reused (host to device) or holds the data (device to host). A copy that
    goes through a host temporary (see docs/memory.md) is synchronous too.
    """
    if dst.__class__ is DeviceArray:
        if src.__class__ is DeviceArray:
            copy_device(dst, src, stream)
        else:
            copy_host(dst, src, stream, to_device=True)
    elif src.__class__ is DeviceArray:
        copy_host(src, dst, stream, to_device=False)
    else:
        raise TypeError(
            f"cuctx.copy needs a DeviceArray on at least one side, got "
            f"{type(dst).__name__} and {type(src).__name__}; use numpy.copyto "
            "between host arrays"
        )
