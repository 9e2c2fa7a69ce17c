"""Stream-ordered memory pools (`MemoryPool`: cuMemPoolCreate) of device memory, page-locked
host memory or managed memory; each device's default pool; which devices may use a pool's
memory (cuMemPoolSetAccess); and, for ``ipc=True`` pools, sharing with another process
(`_ipc`).

A MemoryPool lives while it is referenced, by the user or by the arrays allocated from it
(each holds its pool), and outlives contexts; when it goes, `_pool_lifetime._destroy`
destroys it once the frees of its arrays have run (which drivers need; see there).
"""

from __future__ import annotations

import uuid
import weakref
from typing import Any

from cuda.bindings.driver import (
    CUmemAccess_flags,
    CUmemAccessDesc,
    CUmemAllocationHandleType,
    CUmemAllocationType,
    CUmemLocation,
    CUmemLocationType,
    CUmemPool_attribute,
    CUmemPoolProps,
    cuuint64_t,
)

from .. import _lifetimes
from .._resource import upper
from ..context import Context, in_context
from .._calls import call, fail
from ..device import Device
from ..errors import NOT_SUPPORTED, CudaError, NotSupportedError
from ..stream import Stream
from . import _alloc, _ipc
from ._array import DeviceArray
from ._ipc import IpcDescriptor, SharedPool
from ._pool_lifetime import _destroy, _supported

_A = CUmemPool_attribute
_F = CUmemAccess_flags
_L = CUmemLocationType
_U64 = 1 << 64
LOCATIONS = ("device", "host", "managed")
_ACCESS = {
    "rw": _F.CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    "r": _F.CU_MEM_ACCESS_FLAGS_PROT_READ,
    None: _F.CU_MEM_ACCESS_FLAGS_PROT_NONE,
}
_MODES = {int(flags): mode for mode, flags in _ACCESS.items()}


def _size(value: Any, name: str, *, positive: bool) -> int:
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"{name} must be a whole number of bytes, not {type(value).__name__}")
    value = value.__index__()
    if value < (1 if positive else 0) or value >= _U64:
        least = "at least 1" if positive else "0 or more"
        raise ValueError(
            f"{name} must be {least} and below 2**64 bytes, got {value}"
            + (" (None: no limit)" if positive else "")
        )
    return value


class MemoryPool:
    """A stream-ordered memory pool serving one device (cuMemPoolCreate): arrays allocated from
    it (``cuctx.empty(..., pool=pool)``) come from memory it reserves, and go back to it when
    freed; it gives memory back at a synchronize while it holds more than
    ``release_threshold`` bytes unused, or when `trim` asks.

    ``location`` is where its memory lives: ``"device"`` (device memory), ``"host"``
    (page-locked host memory, which ``arr.host`` views on the host) or ``"managed"`` (managed
    memory, preferring ``device``; ``arr.host`` too). Host pools need a CUDA 13 driver and a
    device that supports them, managed pools a driver newer than CUDA 13.0 (NotSupportedError
    otherwise). ``ipc=True`` makes
    a device pool whose arrays another process can use as the same memory (see
    docs/memory.md). ``max_size`` caps what it reserves (the driver rounds it up to its
    reservation granularity, 32 MiB on an H100); ``release_threshold`` (bytes, default 0) is
    how much unused memory it keeps across synchronizes. ``Device.memory_pool`` is the
    device's default pool, which plain ``cuctx.empty`` uses. Kernels of other devices use
    a pool's arrays once `set_access` allows them.

    The pool lives while it or any array from it is referenced (contexts may come and go);
    then it is destroyed, and the driver frees its memory once the arrays' frees have run.
    """

    __slots__ = (
        "_backend",
        "_device",
        "_handle",
        "_key",
        "_ipc",
        "_max_size",
        "_default",
        "_imported",
        "_ipc_key",
        "_shared",
        "_imports",
        "_origin",
        "_location",
        "_granted",
        "_freed_in",
        "_finalizer",
        "__weakref__",
    )

    def __init__(
        self,
        device: Device | int,
        *,
        location: str = "device",
        ipc: bool = False,
        max_size: int | None = None,
        release_threshold: int | None = None,
    ):
        device = upper.device(device)
        if not isinstance(ipc, bool):
            raise TypeError(f"ipc must be True or False, not {ipc!r}")
        if location not in LOCATIONS:
            raise ValueError(f"location must be one of {LOCATIONS}, not {location!r}")
        if ipc and location != "device":
            raise ValueError(
                f"ipc=True is for device pools: a {location} pool cannot be shared "
                "with another process by cuctx; share a MemoryPool(device, "
                "ipc=True) and copy to or from it"
            )
        limit = 0 if max_size is None else _size(max_size, "max_size", positive=True)
        if release_threshold is not None:
            release_threshold = _size(release_threshold, "release_threshold", positive=False)
        props = CUmemPoolProps()
        props.allocType = CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        props.location.type = _L.CU_MEM_LOCATION_TYPE_DEVICE
        props.location.id = device.ordinal
        if location != "device":
            _supported(device, location)
        if location == "host":  # the id of a host location is ignored
            props.location.type = _L.CU_MEM_LOCATION_TYPE_HOST
        elif location == "managed":  # the device is the memory's preferred location
            props.allocType = CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_MANAGED
        props.handleTypes = (
            _ipc.POSIX_FD if ipc else CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_NONE
        )
        props.maxSize = limit
        with in_context(device.primary_context, "MemoryPool"):  # (see `_init`)
            handle = call(device._backend, "cuMemPoolCreate", props)
        self._init(
            device, handle, ipc=ipc, max_size=max_size, key=uuid.uuid4().hex, location=location
        )
        if ipc:
            _ipc._made[self._ipc_key] = self
        if location == "host":  # host memory: the device it serves needs access too
            self._set_access(device, "rw")
            _alloc.host_pools = True  # copies look at their arrays from now on
        if release_threshold is not None:
            self.release_threshold = release_threshold

    def _init(
        self,
        device,
        handle,
        *,
        ipc=False,
        max_size=None,
        key=None,
        default=False,
        imported=False,
        location="device",
    ) -> None:
        self._backend = device._backend
        self._device = device
        self._handle = handle
        self._key = int(handle)
        self._ipc = ipc
        self._max_size = max_size
        self._default = default
        self._imported = imported
        self._ipc_key = key
        self._location = location
        self._shared = False  # exported to a handle once (the driver's condition for pointers)
        self._imports: dict[int, _ipc._Import] = {}  # token -> this process's import of it
        self._origin = None  # an imported pool's `_handoff.Origin`, when it came by pickle
        # A pool is made, imported and destroyed with the device's primary context current,
        # and keeps that context retained (its finalizer holds it): the pool is the device's,
        # and must not depend on whichever context was current. (One made while a created
        # context was current crashed the process once in cuMemPoolDestroy after that
        # context was destroyed: tests/test_reprs.py on an H100, not reproduced in 8 runs.)
        # The primary contexts of the other devices it granted access (ordinal -> Context):
        # their address spaces map its memory, which the driver still reaches when the pool
        # allocates or is destroyed, so they stay retained until then (as enable_peer_access
        # keeps both; held by the finalizer, which drops them after cuMemPoolDestroy).
        self._granted: dict[int, Context] = {}
        # The contexts in which frees of its memory were queued (by id; weakly: a destroyed
        # context's work has finished), which its destroy synchronizes first (`_destroy`).
        self._freed_in: dict[int, weakref.ref] = {}
        self._finalizer = (
            None
            if default
            else _lifetimes.finalize(
                self,
                _destroy,
                self._backend,
                handle,
                device.primary_context,
                self._granted,
                self._freed_in,
            )
        )

    @classmethod
    def _default_of(cls, device: Device) -> MemoryPool:
        """A MemoryPool for the default pool of ``device`` (cuDeviceGetDefaultMemPool);
        `Device.memory_pool` keeps the one object of each device."""
        handle = call(device._backend, "cuDeviceGetDefaultMemPool", device._handle)
        pool = object.__new__(cls)
        pool._init(device, handle, default=True)
        return pool

    def _queued_free(self, ctx: Context) -> None:
        """A free of its memory was queued in ``ctx`` (`_alloc._release`): its destroy waits
        for that context's work."""
        if self._finalizer is not None:  # (a device's default pool is never destroyed)
            ref = self._freed_in.get(id(ctx))
            if ref is None or ref() is not ctx:
                self._freed_in[id(ctx)] = weakref.ref(ctx)

    # -- what it is --------------------------------------------------------------------------

    @property
    def device(self) -> Device:
        return self._device

    @property
    def ipc(self) -> bool:
        """Whether its arrays can be shared with another process."""
        return self._ipc

    @property
    def location(self) -> str:
        """Where its memory lives: "device", "host" (page-locked) or "managed"."""
        return self._location

    @property
    def max_size(self) -> int | None:
        """The cap given at creation (None: none; the driver rounds it up)."""
        return self._max_size

    def _local(self, name: str) -> None:
        if self._imported:
            raise ValueError(
                f"{self!r} was imported from another process; its {name} is the "
                "exporting process's: ask the pool there"
            )

    def _attribute(self, attr: CUmemPool_attribute, name: str) -> int:
        self._local(name)
        return int(call(self._backend, "cuMemPoolGetAttribute", self._handle, attr))

    @property
    def used(self) -> int:
        """Bytes of live allocations (as asked for)."""
        return self._attribute(_A.CU_MEMPOOL_ATTR_USED_MEM_CURRENT, "used")

    @property
    def reserved(self) -> int:
        """Bytes of memory the pool holds, used or not."""
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
        call(
            self._backend,
            "cuMemPoolSetAttribute",
            self._handle,
            _A.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            cuuint64_t(value),
        )

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
        kind = (
            " (default)"
            if self._default
            else " ipc"
            if self._ipc
            else ""
            if self._location == "device"
            else f" {self._location}"
        )
        limit = f", max_size {self._max_size}" if self._max_size is not None else ""
        try:
            state = f"used {self.used} B, reserved {self.reserved} B"
        except CudaError as exc:  # a repr must not raise
            state = f"unreadable: {type(exc).__name__}"
        return f"{head}{kind}{limit}: {state}>"

    # -- which devices may use its memory ---------------------------------------------------

    def access(self, device: Device | int) -> str | None:
        """What kernels on ``device`` may do with this pool's memory: "rw" (read and write),
        "r" (read) or None (nothing: a kernel touching it faults) (cuMemPoolGetAccess). The
        pool's own device always has "rw"; a managed pool's memory is "rw" everywhere."""
        device = self._device_arg(device, "access")
        if self._location == "managed" or device is self._device:
            return "rw"
        location = CUmemLocation()
        location.type = _L.CU_MEM_LOCATION_TYPE_DEVICE
        location.id = device.ordinal
        return _MODES[int(call(self._backend, "cuMemPoolGetAccess", self._handle, location))]

    def set_access(self, device: Device | int, mode: str | None) -> None:
        """Let kernels on ``device`` read and write ("rw"), only read ("r"), or not use (None)
        this pool's memory, now and for arrays allocated later (cuMemPoolSetAccess). CUDA 13.0
        drivers refuse "r" for a pool (NotSupportedError, saying so). Copies
        between devices need no access. An imported pool's access is this process's own
        (the exporting process sets its own). Taking access away waits first for the work
        queued on ``device``, since a kernel still using the memory would fault. A grant keeps
        ``device``'s primary context retained; ``device.reset()`` takes the access away."""
        if mode not in _ACCESS:
            raise ValueError(f"mode must be 'rw', 'r' or None, not {mode!r}")
        device = self._device_arg(device, "set_access")
        if self._location == "managed":
            raise ValueError(
                f"{self!r} holds managed memory, which every device may use: "
                "there is no access to set"
            )
        if device is self._device:
            raise ValueError(
                f"{device!r} is the device {self!r} serves, which always has read-write access"
            )
        if self._location == "device" and not device.can_access_peer(self._device):
            raise NotSupportedError(
                NOT_SUPPORTED,
                "MemoryPool.set_access",
                "",
                f"{device!r} cannot access memory of {self._device!r} (cuDeviceCanAccessPeer "
                "is 0); copy the data with cuctx.copy instead (copies need no access)",
            )
        if mode == "r" and int(call(self._backend, "cuDriverGetVersion")) < 13010:
            # Measured on two H200s, driver 580 (CUDA 13.0): the driver refuses read-only
            # access (NOT_SUPPORTED), and a process whose second device has a context then
            # crashes in a later cuMemAllocFromPoolAsync or cuMemPoolDestroy (a floating
            # point exception, a segmentation fault). So the driver is never asked.
            raise NotSupportedError(
                NOT_SUPPORTED,
                "cuMemPoolSetAccess",
                "",
                "the driver gives no read-only access to a pool's memory (CUDA 13.0 and "
                "older; asking it crashed the process later, measured on H200s, driver 580): "
                "grant 'rw', or copy the data to the other device",
            )
        if mode != "rw" and self.access(device) is not None:
            device.synchronize()  # nothing of it may still use the memory
        self._set_access(device, mode)

    def _set_access(self, device: Device, mode: str | None) -> None:
        desc = CUmemAccessDesc()
        desc.location.type = _L.CU_MEM_LOCATION_TYPE_DEVICE
        desc.location.id = device.ordinal
        desc.flags = _ACCESS[mode]
        (err,) = self._backend.driver.cuMemPoolSetAccess(self._handle, [desc], 1)
        if err:
            fail(self._backend, err, "cuMemPoolSetAccess")
        if device is not self._device:
            self._note_grant(device, mode)

    def _note_grant(self, device: Device, mode: str | None) -> None:
        """Hold ``device``'s primary context while it has access (and let Device.reset find
        this pool), or let both go."""
        if mode is None:
            self._granted.pop(device.ordinal, None)
            device._granted_by.discard(self)
        else:
            self._granted[device.ordinal] = device.primary_context
            device._granted_by.add(self)

    def _revoke(self, device: Device) -> None:
        """Take ``device``'s access away before its primary context is reset (Device.reset),
        its work torn down already."""
        if device.ordinal not in self._granted:
            return
        try:
            self._set_access(device, None)
        except CudaError:  # (its own device reset before: the driver keeps what it mapped)
            self._note_grant(device, None)

    def _device_arg(self, device: Device | int, operation: str) -> Device:
        if isinstance(device, int) and not isinstance(device, bool):
            device = Device._for_backend(self._backend, device)
        if not isinstance(device, Device) or device._backend is not self._backend:
            raise TypeError(
                f"MemoryPool.{operation} needs a Device of the pool's backend "
                f"(or an ordinal), not {device!r}"
            )
        return device

    # -- IPC (the worker executor's seam, and pickling; see `_ipc`) ---------------------------

    def _share(self) -> SharedPool:
        """A new descriptor of this pool for another process (cuMemPoolExportToShareableHandle)."""
        return _ipc.share(self)

    @classmethod
    def _import(cls, device: Device | int, fd: int, key: str) -> MemoryPool:
        """The pool another process shared (its `SharedPool`'s ``fd`` and ``key``), on this
        process's ``device`` of the same GPU. One object per key while it is referenced; the
        descriptor stays the caller's to close."""
        return _ipc.import_pool(cls, upper.device(device), fd, key)

    def _describe(self, arr: DeviceArray) -> IpcDescriptor:
        """``arr`` (an array of this pool) for `_import_array` in another process."""
        return _ipc.describe(self, arr)

    def _import_array(self, desc: IpcDescriptor, stream: Stream | Any | None = None) -> DeviceArray:
        """A DeviceArray over the memory ``desc`` (from `DeviceArray._ipc_descriptor` in the
        exporting process) describes. Imports are cached while any array of one lives;
        when the last goes, it is freed on ``stream`` (default: the current stream) and that
        stream synchronized, so the exporter may free it after."""
        return _ipc.import_array(self, desc, stream)

    def _pickle_array(self, arr: DeviceArray) -> tuple:
        """``arr.__reduce__`` of an array of this (ipc) pool."""
        return _ipc.reduce_array(arr)

    def __reduce__(self):
        """An ipc pool pickles for another process of this machine (see `_ipc`); any other
        pool refuses with a TypeError."""
        return _ipc.reduce_pool(self)


upper.memory_pool = MemoryPool
