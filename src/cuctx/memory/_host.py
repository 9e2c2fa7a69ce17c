"""Page-locked host memory: `pinned_empty` (cuMemHostAlloc) and `register_host`
(cuMemHostRegister), and the record of page-locked ranges that tells a copy whether it is
asynchronous (memory.py); `HostBytes`, NumPy's view of memory the host addresses at its
device pointer (managed memory, host and managed pools)."""

from __future__ import annotations

import bisect
import threading
from typing import TYPE_CHECKING, Any

import numpy as np
from cuda.bindings.driver import CU_MEMHOSTALLOC_PORTABLE

from .._lifetimes import finalize
from ._layout import nbytes_of, shape_of
from ..context import ACTIVE, Context, context_for, in_context
from .._calls import fail
from ..device import Device
from ..errors import HOST_MEMORY_ALREADY_REGISTERED

if TYPE_CHECKING:
    from ._array import DeviceArray

# Pinned for all contexts; the same value as CU_MEMHOSTREGISTER_PORTABLE, for cuMemHostRegister.
_HOST_PORTABLE = CU_MEMHOSTALLOC_PORTABLE


# The page-locked host ranges cuctx made (start -> end, starts sorted): a copy with one is
# asynchronous, so its stream must hold the host array until the copy has run.
_locked_starts: list[int] = []
_locked_ends: dict[int, int] = {}
_locked_lock = threading.Lock()


def _lock_range(start: int, nbytes: int) -> None:
    with _locked_lock:
        bisect.insort(_locked_starts, start)
        _locked_ends[start] = start + nbytes


def page_locked(address: int, nbytes: int) -> bool:
    """True when all of [address, address + nbytes) is page-locked memory cuctx made."""
    i = bisect.bisect_right(_locked_starts, address) - 1
    return i >= 0 and address + nbytes <= _locked_ends.get(_locked_starts[i], 0)


class _PinnedMemory:
    """Owns page-locked host memory; it is the ``base`` of the NumPy array over it."""

    __slots__ = ("__array_interface__", "__weakref__")

    def __init__(self, ctx: Context, ptr: int, nbytes: int, shape, dtype: np.dtype):
        self.__array_interface__ = {
            "data": (ptr, False),
            "shape": shape,
            "typestr": dtype.str,
            "descr": dtype.descr,
            "version": 3,
        }
        _lock_range(ptr, nbytes)
        finalize(self, _host_call, ctx, "cuMemFreeHost", ptr)


def _host_call(ctx: Context, operation: str, ptr: int) -> None:
    """Free or unregister page-locked memory (its range is forgotten first)."""
    with _locked_lock:
        if _locked_ends.pop(ptr, None) is not None:
            _locked_starts.remove(ptr)
    if ctx._state is ACTIVE:  # a reset or destroyed context took the memory with it
        with in_context(ctx, operation):
            getattr(ctx._backend.driver, operation)(ptr)


def pinned_empty(
    shape: int | tuple[int, ...], dtype: Any = np.float64, *, device: Device | int | None = None
) -> np.ndarray:
    """An uninitialised NumPy array in page-locked host memory (cuMemHostAlloc, portable
    to all contexts). Copies to and from it are asynchronous and overlap with compute; it
    is freed when the array (and every view of it) is gone. It belongs to the primary
    context of ``device`` (default: the current device): ``device.reset()`` frees it too,
    so do not use the array after a reset."""
    shape, dtype = shape_of(shape), np.dtype(dtype)
    if dtype.hasobject:  # uninitialised memory read as Python object pointers would crash
        raise TypeError(f"pinned_empty cannot hold Python objects ({dtype})")
    nbytes = nbytes_of(shape, dtype, "page-locked host array")
    if nbytes == 0:
        return np.empty(shape, dtype)
    # Page-locked memory lives in a device's *primary* context: only a device reset can take
    # it away (a created context could be destroyed under a NumPy array using it).
    ctx = context_for(device, primary=True)
    with in_context(ctx, "pinned_empty"):
        err, ptr = ctx._backend.driver.cuMemHostAlloc(nbytes, _HOST_PORTABLE)
    if err:
        fail(
            ctx._backend,
            err,
            "cuMemHostAlloc",
            ctx,
            f"asked for {nbytes} bytes of page-locked host memory",
        )
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
    ctx = context_for(device, primary=True)
    ptr = ary.__array_interface__["data"][0]
    with in_context(ctx, "register_host"):
        (err,) = ctx._backend.driver.cuMemHostRegister(ptr, ary.nbytes, _HOST_PORTABLE)
    if err:
        fail(
            ctx._backend,
            err,
            "cuMemHostRegister",
            ctx,
            "this memory is already page-locked (pinned_empty or an earlier register_host)"
            if int(err) == HOST_MEMORY_ALREADY_REGISTERED
            else "",
        )
    _lock_range(ptr, ary.nbytes)
    finalize(ary, _host_call, ctx, "cuMemHostUnregister", ptr)
    return ary


class HostBytes:
    """Memory the host addresses at its device pointer (managed memory; a host or managed
    pool's), for NumPy: its bytes as ``__array_interface__``, and `host_view` of an array of
    it. Every view holds this object, which holds ``keep`` (what owns the memory)."""

    __slots__ = ("ptr", "__array_interface__", "_keep", "__weakref__")

    def __init__(self, ptr: int, nbytes: int, keep: Any = None):
        self.ptr = ptr
        self.__array_interface__ = {
            "data": (ptr, False),
            "shape": (nbytes,),
            "typestr": "|u1",
            "version": 3,
        }
        self._keep = keep

    def host_view(self, arr: DeviceArray) -> np.ndarray:
        """``arr`` (a view of this memory) as a NumPy array over the same bytes."""
        if not arr.size:
            return np.empty(arr.shape, arr.dtype)
        return np.ndarray(
            arr.shape,
            arr.dtype,
            buffer=np.asarray(self),
            offset=arr.ptr - self.ptr,
            strides=arr.strides,
        )
