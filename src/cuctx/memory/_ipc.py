"""Sharing an ``ipc=True`` pool and its arrays with another process of this machine.

One mechanism, two ways in. An array goes as an `IpcDescriptor` (its allocation's export
data, its offset, shape, strides and dtype) and becomes a DeviceArray over the same memory
in the other process (`import_array`), once the pool's descriptor got there:

- the worker executor sends the pool's descriptor over its own socket (`share` there,
  `import_pool` in the worker) and each array as its IpcDescriptor;
- pickling sends an array as its pool and its IpcDescriptor, and a pool as a `PoolRef`:
  the unpickling process fetches the descriptor once from the process that made the pool
  (`_handoff`); a pool already imported there is used as it is, and in the process that
  made it the pool and the array are the originals (`pool_from_pickle`,
  `array_from_pickle`).

The driver does not reference-count imports of one allocation (a second import returns the
same pointer, and one free unmaps it for both), so each allocation is imported once per
process while any array of it lives, and freed when the last goes. An imported array is
checked against the allocation the driver mapped (cuMemGetAddressRange): a descriptor that
claims more bytes than the allocation has, or an array reaching past them, is refused.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import threading
import weakref
from typing import Any, NamedTuple

import numpy as np
from cuda.bindings.driver import CUmemAllocationHandleType, CUmemPoolPtrExportData

from .. import _driver, _lifetimes, _trace
from .._resource import upper
from ..context import ACTIVE, context_for, in_context
from .._calls import call, fail
from ..device import Device
from ..stream import Stream, resolve_stream
from . import _handoff
from ._alloc import Allocation, _release
from ._array import DeviceArray, sharing_refused

POSIX_FD = CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
_tokens = itertools.count(1)  # names each exported allocation of this process


class SharedPool:
    """A pool exported for another process: ``fd`` (an OS file descriptor, this object's;
    send it over a Unix socket, never by pickle) and ``key`` (names the pool there). The
    descriptor is closed by `close()`, at the end of a ``with`` block, or when this goes;
    until then it keeps the pool, so no pool is destroyed with a descriptor of it open."""

    __slots__ = ("fd", "key", "device", "_pool", "_closer", "__weakref__")

    def __init__(self, fd: int, key: str, pool: Any):
        self.fd = fd
        self.key = key
        self.device = pool.device.ordinal
        self._pool = pool
        self._closer = weakref.finalize(self, os.close, fd)

    def close(self) -> None:
        self._closer()
        self._pool = None

    def __enter__(self) -> SharedPool:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def __reduce__(self):
        raise TypeError(
            "a SharedPool's file descriptor travels over a Unix socket "
            "(socket.send_fds), not by pickle; send its key by pickle, or "
            "pickle the MemoryPool itself"
        )

    def __repr__(self) -> str:
        state = "closed" if not self._closer.alive else f"fd {self.fd}"
        return f"<SharedPool {self.key} of device {self.device}, {state}>"


class IpcDescriptor(NamedTuple):
    """An array of an ``ipc=True`` pool, for another process (picklable, small). An empty
    array has no allocation: token 0, no data, 0 bytes."""

    key: str  # the pool's (`SharedPool.key`)
    token: int  # the allocation's, unique in the exporting process
    data: bytes  # the driver's export data (CUmemPoolPtrExportData)
    nbytes: int  # of the allocation
    offset: int  # of the array in the allocation
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: np.dtype


class PoolRef(NamedTuple):
    """An ipc pool, pickled: what another process needs to find or import it."""

    backend: str
    key: str
    device: str  # the GPU's UUID (its ordinal may differ in another process)
    ordinal: int  # in the process that pickled it, for messages
    origin: _handoff.Origin | None  # where its descriptor is served (None: nowhere)


class _Import:
    """One driver import of an allocation in this process, whoever holds it now."""

    __slots__ = ("ptr", "size", "generation", "holder")

    def __init__(self, ptr: int, size: int):
        self.ptr = ptr
        self.size = size  # of the allocation, as the driver mapped it
        self.generation = 0  # which Allocation may free it (a newer one supersedes)
        self.holder: weakref.ref | None = None


_imported: weakref.WeakValueDictionary = weakref.WeakValueDictionary()  # (backend, key)
_made: weakref.WeakValueDictionary = weakref.WeakValueDictionary()  # key -> ipc pool made here
_exported: weakref.WeakValueDictionary = weakref.WeakValueDictionary()  # token -> Allocation
_lock = threading.RLock()  # (a collection inside may run an import's free, which takes it)


# -- the pool -------------------------------------------------------------------------------


def share(pool) -> SharedPool:
    """A new descriptor of ``pool`` for another process (cuMemPoolExportToShareableHandle)."""
    shareable(pool, "share")
    fd = call(pool._backend, "cuMemPoolExportToShareableHandle", pool._handle, POSIX_FD, 0)
    pool._shared = True
    return SharedPool(int(fd), pool._ipc_key, pool)


def shareable(pool, operation: str, arr: DeviceArray | None = None) -> None:
    """Refuse to ``operation`` ("share", "pickle") ``pool`` (or ``arr`` of it) unless it is an
    ipc pool this process made."""
    if pool._imported:
        raise TypeError(
            f"cannot {operation} {pool!r}: it was imported from another "
            "process, and only the process that made a pool can share it"
        )
    if not pool._ipc:
        what = "the device's default pool" if pool._default else repr(pool)
        if arr is not None:
            raise sharing_refused(arr, f"memory of {what}", operation)
        raise TypeError(
            f"cannot {operation} memory of {what} with another process: "
            f"allocate it from a MemoryPool(device, ipc=True)"
        )


def import_pool(cls, device: Device, fd: int, key: str, origin: _handoff.Origin | None = None):
    """The pool another process shared (its descriptor ``fd``, its ``key``), on this
    process's ``device`` of the same GPU. One object per key while it is referenced; the
    descriptor stays the caller's to close. ``origin``: where it came from, so that it can
    be pickled on to a third process."""
    if isinstance(fd, bool) or not isinstance(fd, int) or fd < 0:
        raise TypeError(f"fd must be an open file descriptor (an int >= 0), not {fd!r}")
    if not isinstance(key, str):
        raise TypeError(f"key must be the SharedPool's key (a str), not {key!r}")
    backend = device._backend
    with _lock:
        pool = _imported.get((backend, key))
        if pool is None:
            with in_context(device.primary_context, "MemoryPool._import"):  # (see _init)
                err, handle = backend.driver.cuMemPoolImportFromShareableHandle(fd, POSIX_FD, 0)
            if err:
                fail(
                    backend,
                    err,
                    "cuMemPoolImportFromShareableHandle",
                    hint=(f"fd {fd} is not a pool another process shared (MemoryPool._share())"),
                )
            pool = object.__new__(cls)
            pool._init(device, handle, ipc=True, key=key, imported=True)
            _imported[(backend, key)] = pool
        if pool._origin is None:
            pool._origin = origin
    return pool


# -- arrays ---------------------------------------------------------------------------------


def describe(pool, arr: DeviceArray, operation: str = "share") -> IpcDescriptor:
    """``arr`` (an array of ``pool``) for `import_array` in another process; pickled, also an
    array an imported pool imported (as the descriptor it came as)."""
    if not (pool._imported and operation == "pickle"):
        shareable(pool, operation, arr)
    alloc = arr._alloc
    arr._check("DeviceArray._ipc_descriptor")
    if alloc is None:  # an empty array: no memory to export
        return IpcDescriptor(pool._ipc_key, 0, b"", 0, 0, arr.shape, arr.strides, arr.dtype)
    if alloc.shared is None:  # (an import's was set when it was imported)
        if not pool._shared:  # the driver exports pointers of shared pools only
            share(pool).close()
        with in_context(arr._ctx, "DeviceArray._ipc_descriptor"):
            data = call(pool._backend, "cuMemPoolExportPointer", alloc.ptr)
        alloc.shared = (next(_tokens), _export_bytes(data))
        _exported[alloc.shared[0]] = alloc
    token, data = alloc.shared
    return IpcDescriptor(
        pool._ipc_key,
        token,
        data,
        alloc.nbytes,
        arr.ptr - alloc.ptr,
        arr.shape,
        arr.strides,
        arr.dtype,
    )


def import_array(pool, desc: IpcDescriptor, stream: Stream | Any | None) -> DeviceArray:
    """A DeviceArray over the memory ``desc`` describes, in ``pool`` (imported); see
    `MemoryPool._import_array`."""
    if not isinstance(desc, IpcDescriptor):
        raise TypeError(f"_import_array takes an IpcDescriptor, not {type(desc).__name__}")
    if not pool._imported or desc.key != pool._ipc_key:
        raise ValueError(
            f"{desc.key} names another pool than {pool!r}: import it with "
            f"MemoryPool._import(device, fd, {desc.key!r})"
        )
    if desc.key in _made:  # the sim refuses it; an H100 maps the memory a second time
        raise ValueError(
            f"{pool!r} is a pool of this very process: use the array itself "
            "rather than an import of it"
        )
    ctx = context_for(pool._device)
    if not desc.token:
        return _empty(ctx, pool, desc)
    stream = resolve_stream(stream, ctx, "MemoryPool._import_array")
    with _lock:
        record = pool._imports.get(desc.token)
        alloc = record.holder() if record is not None and record.holder else None
        if alloc is None:
            if record is None:
                record = pool._imports[desc.token] = _Import(*_map(pool, ctx, desc))
            # else: its free is pending (deferred or held): the mapping is still there,
            # and the newer holder supersedes that free (`_release_import`).
            record.generation += 1
            alloc = Allocation(
                record.ptr,
                min(desc.nbytes, record.size),
                stream,
                pool,
                _release_import,
                pool._imports,
                desc.token,
                record,
                record.generation,
            )
            record.holder = weakref.ref(alloc)
            alloc.shared = (desc.token, desc.data)  # for pickling it on
            if _trace.sinks:
                _trace.emit(
                    "alloc", ctx, stream, (_trace.Access(record.ptr, alloc.nbytes, _trace.WRITE),)
                )
    _check_extent(desc, record.size, pool)  # (a refused one is freed with ``alloc``)
    return DeviceArray._make(
        ctx,
        alloc.ptr + desc.offset,
        tuple(desc.shape),
        np.dtype(desc.dtype),
        tuple(desc.strides),
        alloc,
    )


def _empty(ctx, pool, desc: IpcDescriptor) -> DeviceArray:
    if 0 not in tuple(desc.shape):
        raise ValueError(
            f"the descriptor names no allocation but an array of shape "
            f"{tuple(desc.shape)}, which is not empty: it was not made by "
            "DeviceArray._ipc_descriptor"
        )
    ctx._check("MemoryPool._import_array")
    return DeviceArray._make(
        ctx, 0, tuple(desc.shape), np.dtype(desc.dtype), tuple(desc.strides), None, pool
    )


def _check_extent(desc: IpcDescriptor, size: int, pool) -> None:
    """Refuse a descriptor whose bytes lie outside the allocation the driver mapped (``size``
    bytes): a forged or altered one would read and write past it on a GPU."""
    itemsize = np.dtype(desc.dtype).itemsize
    low = desc.offset + sum(min(0, (n - 1) * s) for n, s in zip(desc.shape, desc.strides))
    high = desc.offset + sum(max(0, (n - 1) * s) for n, s in zip(desc.shape, desc.strides))
    if desc.nbytes > size or low < 0 or high + itemsize > min(desc.nbytes, size):
        raise ValueError(
            f"the descriptor of an array of {pool!r} claims bytes [{low}, {high + itemsize}) "
            f"of an allocation of {desc.nbytes} bytes, but the allocation it names holds "
            f"{size} bytes (cuMemGetAddressRange): it was not made by "
            "DeviceArray._ipc_descriptor of an array of that allocation, or was altered"
        )


def _map(pool, ctx, desc: IpcDescriptor) -> tuple[int, int]:
    """(address, bytes) of the allocation ``desc`` names, mapped into this process."""
    data = CUmemPoolPtrExportData()
    _import_bytes(data, desc.data)
    backend = pool._backend
    with in_context(ctx, "MemoryPool._import_array"):
        err, ptr = backend.driver.cuMemPoolImportPointer(pool._handle, data)
        if err:
            fail(
                backend,
                err,
                "cuMemPoolImportPointer",
                ctx,
                "the exporting process may have freed the array or destroyed its pool",
            )
        err, base, size = backend.driver.cuMemGetAddressRange(ptr)
    if err:
        fail(backend, err, "cuMemGetAddressRange", ctx, "of an imported allocation")
    return int(ptr), int(size) - (int(ptr) - int(base))


# CUmemPoolPtrExportData is 64 opaque bytes; cuda.bindings exposes only its address.


def _export_bytes(data: CUmemPoolPtrExportData) -> bytes:
    return ctypes.string_at(data.getPtr(), 64)


def _import_bytes(data: CUmemPoolPtrExportData, raw: bytes) -> None:
    if len(raw) != 64:
        raise ValueError(f"an IpcDescriptor's data is 64 bytes, not {len(raw)}")
    ctypes.memmove(data.getPtr(), raw, 64)


def _release_import(
    ptr: int,
    nbytes: int,
    stream: Stream,
    recorded: list,
    pool: Any,
    imports: dict,
    token: int,
    record: _Import,
    generation: int,
) -> bool:
    """Free this process's import unless a newer holder took it over; then wait for the free,
    so the mapping is gone before the exporting process frees the memory."""
    with _lock:
        if record.generation != generation:
            return True  # imported again while this free waited: the newer one frees it
        if imports.get(token) is record:
            del imports[token]
    freed = _release(ptr, nbytes, stream, recorded, pool)
    if freed and stream._ctx._state is ACTIVE and not _lifetimes.capturing:
        stream._call(stream._backend.driver.cuStreamSynchronize, stream._handle)
    return freed


# -- pickling -------------------------------------------------------------------------------


def reduce_pool(pool) -> tuple:
    """``pool.__reduce__``: an ipc pool as its `PoolRef`; any other pool refuses."""
    if not pool._ipc:
        raise TypeError(
            f"cannot pickle {pool!r}: only a MemoryPool(device, ipc=True) can be "
            "used by another process; make the pool with ipc=True, or pickle "
            "arr.to_host() to send an array's contents"
        )
    origin = pool._origin if pool._imported else _handoff.serve(_shared_for_handoff)
    device = pool._device
    return pool_from_pickle, (
        PoolRef(pool._backend.name, pool._ipc_key, device.uuid, device.ordinal, origin),
    )


def _shared_for_handoff(key: str) -> SharedPool | None:
    pool = _made.get(key)
    return None if pool is None else share(pool)


def pool_from_pickle(ref: PoolRef):
    """The pool ``ref`` names, in this process: the original where it was made, the import
    where it was imported, else imported now from the process that made it."""
    backend = _driver.active()
    if backend.name != ref.backend:
        raise ValueError(
            f"an ipc pool of the {ref.backend} backend cannot be unpickled in a "
            f"process running the {backend.name} backend: select "
            f"{ref.backend} first (CUCTX_BACKEND={ref.backend} in the "
            "environment, or cuctx.set_backend)"
        )
    pool = _made.get(ref.key)
    if pool is not None and pool._backend is backend:
        return pool
    with _lock:
        pool = _imported.get((backend, ref.key))
    if pool is not None:
        return pool
    what = f"the ipc pool {ref.key} of device {ref.ordinal}"
    if ref.origin is None:
        raise RuntimeError(
            f"{what} came to the process that pickled it by another way (the "
            "worker executor), which does not say where it came from: it "
            "pickles only back to the process that made it"
        )
    device = Device._with_uuid(ref.device, f"{what} (GPU {ref.device})")
    fd = _handoff.fetch(ref.origin, ref.key, what)
    try:
        return import_pool(upper.memory_pool, device, fd, ref.key, ref.origin)
    finally:
        os.close(fd)


def reduce_array(arr: DeviceArray) -> tuple:
    """``arr.__reduce__`` for an array of an ipc pool: its pool and `IpcDescriptor`."""
    pool = arr.pool
    return array_from_pickle, (pool, describe(pool, arr, "pickle"))


def array_from_pickle(pool, desc: IpcDescriptor) -> DeviceArray:
    """The array ``desc`` describes: the same memory, imported or (where it was made) the
    original allocation."""
    if pool._imported:
        return pool._import_array(desc)
    ctx = context_for(pool._device)
    if not desc.token:
        return _empty(ctx, pool, desc)
    alloc = _exported.get(desc.token)
    if alloc is None or alloc.pool is not pool:
        raise RuntimeError(
            f"the array of {pool!r} was freed after it was pickled: keep it "
            "alive in the process that made it until the others are done"
        )
    _check_extent(desc, alloc.nbytes, pool)
    return DeviceArray._make(
        alloc.stream._ctx,
        alloc.ptr + desc.offset,
        tuple(desc.shape),
        np.dtype(desc.dtype),
        tuple(desc.strides),
        alloc,
    )
