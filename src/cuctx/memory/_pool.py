"""Stream-ordered memory pools (`MemoryPool`: cuMemPoolCreate), each device's default pool,
and sharing a pool's arrays with another process (IPC).

A pool outlives contexts (measured on an H100: neither a context's destruction nor a reset
frees a pool's allocation). A MemoryPool lives while it is referenced, by the user or by the
arrays allocated from it (each holds its pool), and is destroyed (cuMemPoolDestroy) when the
last reference goes; the frees of its arrays were queued by then, and the driver gives the
pool's memory back once they have run.

IPC, the internal seam of the worker executor (see docs/memory.md): ``pool._share()`` exports
an ``ipc=True`` pool as a file descriptor; ``MemoryPool._import(device, fd, key)`` maps it in
another process; ``arr._ipc_descriptor()`` describes an array of it (picklable, small);
``imported._import_array(desc)`` is a DeviceArray over the same memory there. The driver
does not reference-count imports of one allocation (a second import returns the same pointer,
and one free unmaps it for both), so imports are cached per allocation and freed once.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import threading
import uuid
import weakref
from typing import Any, NamedTuple

import numpy as np
from cuda.bindings.driver import (CUmemAllocationHandleType, CUmemAllocationType,
                                  CUmemLocationType, CUmemPool_attribute, CUmemPoolProps,
                                  CUmemPoolPtrExportData, cuuint64_t)

from .. import _lifetimes, _trace
from .._resource import upper
from ..context import ACTIVE, call, context_for, fail, in_context
from ..device import Device
from ..errors import CudaError
from ..stream import Stream, resolve_stream
from ._alloc import Allocation, _release
from ._array import DeviceArray

_A = CUmemPool_attribute
_POSIX_FD = CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
_U64 = 1 << 64
_tokens = itertools.count(1)  # names each exported allocation of this process


def _size(value: Any, name: str, *, positive: bool) -> int:
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"{name} must be a whole number of bytes, not {type(value).__name__}")
    value = value.__index__()
    if value < (1 if positive else 0) or value >= _U64:
        least = "at least 1" if positive else "0 or more"
        raise ValueError(f"{name} must be {least} and below 2**64 bytes, got {value}"
                         + (" (None: no limit)" if positive else ""))
    return value


class SharedPool:
    """A pool exported for another process: ``fd`` (an OS file descriptor, this object's;
    send it over a Unix socket, never by pickle) and ``key`` (names the pool there). The
    descriptor is closed by `close()`, at the end of a ``with`` block, or when this goes;
    until then it keeps the pool, so no pool is destroyed with a descriptor of it open."""

    __slots__ = ("fd", "key", "device", "_pool", "_closer", "__weakref__")

    def __init__(self, fd: int, key: str, pool: MemoryPool):
        self.fd = fd
        self.key = key
        self.device = pool.device.ordinal
        self._pool: MemoryPool | None = pool
        self._closer = weakref.finalize(self, os.close, fd)

    def close(self) -> None:
        self._closer()
        self._pool = None

    def __enter__(self) -> SharedPool:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def __reduce__(self):
        raise TypeError("a SharedPool's file descriptor travels over a Unix socket "
                        "(socket.send_fds), not by pickle; send its key by pickle")

    def __repr__(self) -> str:
        state = "closed" if not self._closer.alive else f"fd {self.fd}"
        return f"<SharedPool {self.key} of device {self.device}, {state}>"


class IpcDescriptor(NamedTuple):
    """An array of an ``ipc=True`` pool, for another process (picklable, small)."""

    key: str  # the pool's (`SharedPool.key`)
    token: int  # the allocation's, unique in the exporting process
    data: bytes  # the driver's export data (CUmemPoolPtrExportData)
    nbytes: int  # of the allocation
    offset: int  # of the array in the allocation
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: np.dtype


class _Import:
    """One driver import of an allocation in this process, whoever holds it now."""

    __slots__ = ("ptr", "generation", "holder")

    def __init__(self, ptr: int):
        self.ptr = ptr
        self.generation = 0  # which Allocation may free it (a newer one supersedes)
        self.holder: weakref.ref | None = None


_imported: weakref.WeakValueDictionary = weakref.WeakValueDictionary()  # (backend, key)
_made: weakref.WeakValueDictionary = weakref.WeakValueDictionary()  # key -> ipc pool made here
_lock = threading.RLock()  # (a collection inside may run an import's free, which takes it)


class MemoryPool:
    """A stream-ordered memory pool of one device (cuMemPoolCreate): arrays allocated from it
    (``cuctx.empty(..., pool=pool)``) come from memory it reserves, and go back to it when
    freed; it gives memory back to the device at a synchronize while it holds more than
    ``release_threshold`` bytes unused, or when `trim` asks.

    ``ipc=True`` makes a pool whose arrays another process can use as the same memory (see
    docs/memory.md). ``max_size`` caps what it reserves (the driver rounds it up to its
    reservation granularity, 32 MiB on an H100); ``release_threshold`` (bytes, default 0) is
    how much unused memory it keeps across synchronizes. ``Device.memory_pool`` is the
    device's default pool, which plain ``cuctx.empty`` uses.

    The pool lives while it or any array from it is referenced (contexts may come and go);
    then it is destroyed, and the driver frees its memory once the arrays' frees have run.
    """

    __slots__ = ("_backend", "_device", "_handle", "_key", "_ipc", "_max_size", "_default",
                 "_imported", "_ipc_key", "_shared", "_imports", "_finalizer", "__weakref__")

    def __init__(self, device: Device | int, *, ipc: bool = False,
                 max_size: int | None = None, release_threshold: int | None = None):
        device = upper.device(device)
        if not isinstance(ipc, bool):
            raise TypeError(f"ipc must be True or False, not {ipc!r}")
        limit = 0 if max_size is None else _size(max_size, "max_size", positive=True)
        if release_threshold is not None:
            release_threshold = _size(release_threshold, "release_threshold", positive=False)
        props = CUmemPoolProps()
        props.allocType = CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        props.location.type = CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        props.location.id = device.ordinal
        props.handleTypes = _POSIX_FD if ipc else \
            CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_NONE
        props.maxSize = limit
        handle = call(device._backend, "cuMemPoolCreate", props)
        self._init(device, handle, ipc=ipc, max_size=max_size, key=uuid.uuid4().hex)
        if ipc:
            _made[self._ipc_key] = self
        if release_threshold is not None:
            self.release_threshold = release_threshold

    def _init(self, device, handle, *, ipc=False, max_size=None, key=None, default=False,
              imported=False) -> None:
        self._backend = device._backend
        self._device = device
        self._handle = handle
        self._key = int(handle)
        self._ipc = ipc
        self._max_size = max_size
        self._default = default
        self._imported = imported
        self._ipc_key = key
        self._shared = False  # exported to a handle once (the driver's condition for pointers)
        self._imports: dict[int, _Import] = {}  # token -> this process's import of it
        self._finalizer = None if default else _lifetimes.finalize(
            self, _destroy, self._backend, handle)

    @classmethod
    def _default_of(cls, device: Device) -> MemoryPool:
        """A MemoryPool for the default pool of ``device`` (cuDeviceGetDefaultMemPool);
        `Device.memory_pool` keeps the one object of each device."""
        handle = call(device._backend, "cuDeviceGetDefaultMemPool", device._handle)
        pool = object.__new__(cls)
        pool._init(device, handle, default=True)
        return pool

    # -- what it is --------------------------------------------------------------------------

    @property
    def device(self) -> Device:
        return self._device

    @property
    def ipc(self) -> bool:
        """Whether its arrays can be shared with another process."""
        return self._ipc

    @property
    def max_size(self) -> int | None:
        """The cap given at creation (None: none; the driver rounds it up)."""
        return self._max_size

    def _local(self, name: str) -> None:
        if self._imported:
            raise ValueError(f"{self!r} was imported from another process; its {name} is the "
                             "exporting process's: ask the pool there")

    def _attribute(self, attr: CUmemPool_attribute, name: str) -> int:
        self._local(name)
        return int(call(self._backend, "cuMemPoolGetAttribute", self._handle, attr))

    @property
    def used(self) -> int:
        """Bytes of live allocations (as asked for)."""
        return self._attribute(_A.CU_MEMPOOL_ATTR_USED_MEM_CURRENT, "used")

    @property
    def reserved(self) -> int:
        """Bytes of device memory the pool holds, used or not."""
        return self._attribute(_A.CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, "reserved")

    @property
    def high_water(self) -> int:
        """The most bytes in use at once since the pool was made."""
        return self._attribute(_A.CU_MEMPOOL_ATTR_USED_MEM_HIGH, "high_water")

    @property
    def release_threshold(self) -> int:
        """Unused bytes the pool keeps across synchronizes (default 0: it gives back all)."""
        return self._attribute(_A.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, "release_threshold")

    @release_threshold.setter
    def release_threshold(self, value: int) -> None:
        value = _size(value, "release_threshold", positive=False)
        self._local("release_threshold")
        call(self._backend, "cuMemPoolSetAttribute", self._handle,
             _A.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, cuuint64_t(value))

    def trim(self, keep: int = 0) -> None:
        """Give unused memory back to the device, keeping at least ``keep`` bytes reserved
        (cuMemPoolTrimTo). Only memory whose frees have run is unused: synchronize first."""
        keep = _size(keep, "keep", positive=False)
        self._local("memory")
        call(self._backend, "cuMemPoolTrimTo", self._handle, keep)

    def __repr__(self) -> str:
        head = f"<MemoryPool {self._key:#x} of device {self._device.ordinal}"
        if self._imported:
            return f"{head} imported, key {self._ipc_key}>"
        kind = " (default)" if self._default else " ipc" if self._ipc else ""
        limit = f", max_size {self._max_size}" if self._max_size is not None else ""
        try:
            state = f"used {self.used} B, reserved {self.reserved} B"
        except CudaError as exc:  # a repr must not raise
            state = f"unreadable: {type(exc).__name__}"
        return f"{head}{kind}{limit}: {state}>"

    # -- IPC (the worker executor's seam; see the module's docstring) ----------------------

    def _share(self) -> SharedPool:
        """A new descriptor of this pool for another process (cuMemPoolExportToShareableHandle)."""
        self._shareable("share")
        fd = call(self._backend, "cuMemPoolExportToShareableHandle", self._handle, _POSIX_FD, 0)
        self._shared = True
        return SharedPool(int(fd), self._ipc_key, self)

    def _shareable(self, operation: str) -> None:
        if self._imported:
            raise TypeError(f"cannot {operation} {self!r}: it was imported from another "
                            "process, and only the process that made a pool can share it")
        if not self._ipc:
            raise TypeError(f"cannot {operation} memory of {self!r} with another process: "
                            f"allocate it from a MemoryPool(device, ipc=True)")

    @classmethod
    def _import(cls, device: Device | int, fd: int, key: str) -> MemoryPool:
        """The pool another process shared (its `SharedPool`'s ``fd`` and ``key``), on this
        process's ``device`` of the same GPU. One object per key while it is referenced; the
        descriptor stays the caller's to close."""
        device = upper.device(device)
        if isinstance(fd, bool) or not isinstance(fd, int) or fd < 0:
            raise TypeError(f"fd must be an open file descriptor (an int >= 0), not {fd!r}")
        if not isinstance(key, str):
            raise TypeError(f"key must be the SharedPool's key (a str), not {key!r}")
        backend = device._backend
        with _lock:
            pool = _imported.get((backend, key))
            if pool is None:
                err, handle = backend.driver.cuMemPoolImportFromShareableHandle(
                    fd, _POSIX_FD, 0)
                if err:
                    fail(backend, err, "cuMemPoolImportFromShareableHandle", hint=(
                        f"fd {fd} is not a pool another process shared (MemoryPool._share())"))
                pool = object.__new__(cls)
                pool._init(device, handle, ipc=True, key=key, imported=True)
                _imported[(backend, key)] = pool
        return pool

    def _describe(self, arr: DeviceArray) -> IpcDescriptor:
        """``arr`` (an array of this pool) for `_import_array` in another process."""
        self._shareable("share")
        alloc = arr._alloc
        arr._check("DeviceArray._ipc_descriptor")
        if alloc.shared is None:
            if not self._shared:  # the driver exports pointers of shared pools only
                self._share().close()
            with in_context(arr._ctx, "DeviceArray._ipc_descriptor"):
                data = call(self._backend, "cuMemPoolExportPointer", alloc.ptr)
            alloc.shared = (next(_tokens), _export_bytes(data))
        token, data = alloc.shared
        return IpcDescriptor(self._ipc_key, token, data, alloc.nbytes, arr.ptr - alloc.ptr,
                             arr.shape, arr.strides, arr.dtype)

    def _import_array(self, desc: IpcDescriptor, stream: Stream | Any | None = None
                      ) -> DeviceArray:
        """A DeviceArray over the memory ``desc`` (from `DeviceArray._ipc_descriptor` in the
        exporting process) describes. Imports are cached while any array of one lives;
        when the last goes, it is freed on ``stream`` (default: the current stream) and that
        stream synchronized, so the exporter may free it after."""
        if not isinstance(desc, IpcDescriptor):
            raise TypeError(f"_import_array takes an IpcDescriptor, not {type(desc).__name__}")
        if not self._imported or desc.key != self._ipc_key:
            raise ValueError(f"{desc.key} names another pool than {self!r}: import it with "
                             f"MemoryPool._import(device, fd, {desc.key!r})")
        if desc.key in _made:  # the sim refuses it; an H100 maps the memory a second time
            raise ValueError(f"{self!r} is a pool of this very process: use the array itself "
                             "rather than an import of it")
        ctx = context_for(self._device)
        stream = resolve_stream(stream, ctx, "MemoryPool._import_array")
        with _lock:
            record = self._imports.get(desc.token)
            alloc = record.holder() if record is not None and record.holder else None
            if alloc is None:
                if record is None:
                    record = self._imports[desc.token] = _Import(self._map(ctx, desc))
                # else: its free is pending (deferred or held): the mapping is still there,
                # and the newer holder supersedes that free (`_release_import`).
                record.generation += 1
                alloc = Allocation(record.ptr, desc.nbytes, stream, self, _release_import,
                                   self._imports, desc.token, record, record.generation)
                record.holder = weakref.ref(alloc)
                if _trace.sinks:
                    _trace.emit("alloc", ctx, stream,
                                (_trace.Access(record.ptr, desc.nbytes, _trace.WRITE),))
        return DeviceArray._make(ctx, alloc.ptr + desc.offset, tuple(desc.shape),
                                 np.dtype(desc.dtype), tuple(desc.strides), alloc)

    def _map(self, ctx, desc: IpcDescriptor) -> int:
        data = CUmemPoolPtrExportData()
        _import_bytes(data, desc.data)
        with in_context(ctx, "MemoryPool._import_array"):
            err, ptr = self._backend.driver.cuMemPoolImportPointer(self._handle, data)
        if err:
            fail(self._backend, err, "cuMemPoolImportPointer", ctx,
                 "the exporting process may have freed the array or destroyed its pool")
        return int(ptr)


# CUmemPoolPtrExportData is 64 opaque bytes; cuda.bindings exposes only its address.

def _export_bytes(data: CUmemPoolPtrExportData) -> bytes:
    return ctypes.string_at(data.getPtr(), 64)


def _import_bytes(data: CUmemPoolPtrExportData, raw: bytes) -> None:
    if len(raw) != 64:
        raise ValueError(f"an IpcDescriptor's data is 64 bytes, not {len(raw)}")
    ctypes.memmove(data.getPtr(), raw, 64)


def _release_import(ptr: int, nbytes: int, stream: Stream, recorded: list, imports: dict,
                    token: int, record: _Import, generation: int) -> bool:
    """Free this process's import unless a newer holder took it over; then wait for the free,
    so the mapping is gone before the exporting process frees the memory."""
    with _lock:
        if record.generation != generation:
            return True  # imported again while this free waited: the newer one frees it
        if imports.get(token) is record:
            del imports[token]
    freed = _release(ptr, nbytes, stream, recorded)
    if freed and stream._ctx._state is ACTIVE and not _lifetimes.capturing:
        stream._call(stream._backend.driver.cuStreamSynchronize, stream._handle)
    return freed


def _destroy(backend, handle) -> None:
    backend.driver.cuMemPoolDestroy(handle)  # arrays of it hold it: none is left


upper.memory_pool = MemoryPool
