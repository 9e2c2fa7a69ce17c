"""Devices: one object per ordinal and backend, their properties, their primary context."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence
from typing import NamedTuple

from cuda.bindings.driver import CUmemAccess_flags, CUmemAccessDesc, CUmemLocationType

from . import _driver
from ._calls import call, fail, refuse_in_host_function
from ._enums import DeviceProperties
from ._green import Partition, partition
from ._resource import upper
from .context import ACTIVE, DESTROYED, Context, context_for, exit_block, in_context
from .errors import (
    PEER_ACCESS_ALREADY_ENABLED,
    PEER_ACCESS_NOT_ENABLED,
    PEER_ACCESS_UNSUPPORTED,
    NotSupportedError,
)


class ComputeCapability(NamedTuple):
    major: int
    minor: int

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}"


class MemInfo(NamedTuple):
    free: int
    total: int


class Device:
    """A CUDA device. ``Device(i)`` returns the one object for ordinal ``i`` of the active
    backend. ``with device:`` makes its primary context current for the block."""

    __slots__ = (
        "_backend",
        "ordinal",
        "_handle",
        "_primary",
        "_runtime_primary",
        "_properties",
        "_lock",
        "_peers",
        "_peer_holds",
        "_granted_by",
        "_memory_pool",
        "__weakref__",
    )

    def __new__(cls, ordinal: int | Device = 0) -> Device:
        if isinstance(ordinal, Device):
            return ordinal
        if isinstance(ordinal, bool) or not hasattr(ordinal, "__index__"):
            raise TypeError(f"a device ordinal must be an int, not {type(ordinal).__name__}")
        backend = _driver.active()
        with backend.lock:
            return cls._for_backend(backend, ordinal.__index__())

    @classmethod
    def _for_backend(cls, backend: _driver.Backend, ordinal: int) -> Device:
        device = backend.devices.get(ordinal)
        if device is None:
            err, handle = backend.driver.cuDeviceGet(ordinal)
            if err:
                count = backend.driver.cuDeviceGetCount()[1]
                fail(
                    backend,
                    err,
                    f"Device({ordinal})",
                    hint=f"the {backend.name} backend has {count} device(s): valid ordinals "
                    f"are 0 to {count - 1}"
                    if count
                    else "there is no device",
                )
            device = object.__new__(cls)
            device._backend = backend
            device.ordinal = ordinal
            device._handle = handle
            device._primary = None
            device._runtime_primary = None
            device._properties = None
            device._lock = threading.Lock()
            device._peers = set()  # devices whose memory kernels on this one may use
            device._peer_holds = {}  # peer -> the two primary contexts the access lives in
            device._granted_by = weakref.WeakSet()  # MemoryPools of others this one may use
            device._memory_pool = None  # its default pool's MemoryPool, once asked for
            backend.devices[ordinal] = device
        return device

    @classmethod
    def _with_uuid(cls, uuid: str, what: str) -> Device:
        """This process's device of the GPU ``uuid`` (as `uuid` prints it), for ``what``
        another process sent: the GPU may have another ordinal here, or none."""
        backend = _driver.active()
        count = call(backend, "cuDeviceGetCount")
        for ordinal in range(count):
            device = cls._for_backend(backend, ordinal)
            if device.uuid == uuid:
                return device
        raise ValueError(
            f"{what} is on a GPU this process does not see (its {count} "
            "device(s) have other UUIDs): make that GPU visible here "
            "(CUDA_VISIBLE_DEVICES; Ray's num_gpus)"
        )

    def _query(self, operation: str, *args):
        return call(self._backend, operation, *args)

    @property
    def name(self) -> str:
        return self._query("cuDeviceGetName", 256, self._handle).split(b"\0", 1)[0].decode()

    @property
    def uuid(self) -> str:
        """As nvidia-smi prints it: GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx."""
        h = bytes(self._query("cuDeviceGetUuid", self._handle).bytes).hex()
        return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"

    @property
    def pci_bus_id(self) -> str:
        return self._query("cuDeviceGetPCIBusId", 64, self._handle).split(b"\0", 1)[0].decode()

    @property
    def total_memory(self) -> int:
        return int(self._query("cuDeviceTotalMem", self._handle))

    @property
    def properties(self) -> DeviceProperties:
        if self._properties is None:
            self._properties = DeviceProperties(self)
        return self._properties

    @property
    def compute_capability(self) -> ComputeCapability:
        p = self.properties
        return ComputeCapability(p.compute_capability_major, p.compute_capability_minor)

    def can_access_peer(self, other: Device | int) -> bool:
        """Whether kernels on this device can be given access to ``other``'s memory
        (cuDeviceCanAccessPeer); False for the device itself, whose memory needs no access."""
        other = self._other(other, "can_access_peer")
        return bool(self._query("cuDeviceCanAccessPeer", self._handle, other._handle))

    def _other(self, other: Device | int, operation: str) -> Device:
        if isinstance(other, int) and not isinstance(other, bool):
            other = Device._for_backend(self._backend, other)
        if not isinstance(other, Device) or other._backend is not self._backend:
            raise TypeError(f"{operation} needs a Device of the same backend, got {other!r}")
        return other

    # -- peer access -----------------------------------------------------------------------

    def enable_peer_access(self, other: Device | int) -> None:
        """Let kernels on this device read and write memory of ``other``. Enabling twice, or
        what other code already enabled, is fine. Copies between devices need no access.

        Two grants, because cuctx allocates from each device's default memory pool, which
        cuCtxEnablePeerAccess does not cover: cuMemPoolSetAccess on ``other``'s default pool
        (memory cuctx allocates, in any context of this device) and cuCtxEnablePeerAccess
        from this device's primary context to ``other``'s (memory allocated with cuMemAlloc,
        such as other libraries'). Both primary contexts stay retained while it is enabled.
        An explicit `MemoryPool` has its own access list: `MemoryPool.set_access`.
        """
        other = self._peer_of(other, "enable_peer_access")
        if other in self._peers:
            return
        if not self.can_access_peer(other):
            raise NotSupportedError(
                PEER_ACCESS_UNSUPPORTED,
                "Device.enable_peer_access",
                "peer access is not supported between these two devices",
                f"{self!r} cannot access memory of {other!r} (cuDeviceCanAccessPeer is 0); "
                "copy the data with cuctx.copy instead (copies between devices need no peer "
                "access)",
            )
        mine, theirs = self.primary_context, other.primary_context
        with in_context(mine, "Device.enable_peer_access"):
            (err,) = self._backend.driver.cuCtxEnablePeerAccess(theirs._handle, 0)
        if err and int(err) != PEER_ACCESS_ALREADY_ENABLED:
            fail(self._backend, err, "cuCtxEnablePeerAccess", mine)
        try:
            self._grant_pool(other, CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
        except BaseException:
            if not err:  # undo what this call did, so a failure changes nothing
                with in_context(mine, "Device.enable_peer_access"):
                    self._backend.driver.cuCtxDisablePeerAccess(theirs._handle)
            raise
        self._peers.add(other)
        self._peer_holds[other] = (mine, theirs)

    def disable_peer_access(self, other: Device | int) -> None:
        """Undo `enable_peer_access` (also what other code enabled); disabling what is not
        enabled is fine. Waits first for the work queued in this device's contexts, since a
        kernel still using ``other``'s memory would fault."""
        other = self._peer_of(other, "disable_peer_access")
        if not self.can_access_peer(other):
            return  # nothing can have been enabled
        for ctx in [
            c
            for c in list(self._backend.contexts.values())
            if c._device is self and c._state is ACTIVE
        ]:
            with in_context(ctx, "Device.disable_peer_access"):
                self._backend.driver.cuCtxSynchronize()  # a fault stays for its next use
        self._grant_pool(other, CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_NONE)
        mine, theirs = self.primary_context, other.primary_context
        with in_context(mine, "Device.disable_peer_access"):
            (err,) = self._backend.driver.cuCtxDisablePeerAccess(theirs._handle)
        self._peers.discard(other)
        self._peer_holds.pop(other, None)
        if err and int(err) != PEER_ACCESS_NOT_ENABLED:
            fail(self._backend, err, "cuCtxDisablePeerAccess", mine)

    def _peer_of(self, other: Device | int, operation: str) -> Device:
        other = self._other(other, operation)
        if other is self:
            raise ValueError(
                f"{operation}: {self!r} is the device itself; kernels always have access to "
                "their own device's memory, in any of its contexts, so there is nothing to "
                "enable or disable"
            )
        return other

    def _grant_pool(self, other: Device, flags: CUmemAccess_flags) -> None:
        """Set this device's access to ``other``'s default memory pool."""
        pool = call(self._backend, "cuDeviceGetDefaultMemPool", other._handle)
        desc = CUmemAccessDesc()
        desc.location.type = CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        desc.location.id = self.ordinal
        desc.flags = flags
        call(self._backend, "cuMemPoolSetAccess", pool, [desc], 1)

    def synchronize(self) -> None:
        """Wait for all work queued on this device: in every context of it that cuctx knows
        (its primary context, created and adopted ones). Raises what `Context.synchronize`
        raises (a fault, `HostFunctionError`) after waiting for all of them."""
        refuse_in_host_function("Device.synchronize")
        contexts = [
            c
            for c in list(self._backend.contexts.values())
            if c._device is self and c._state is ACTIVE
        ]
        errors = []
        for ctx in contexts:
            try:
                ctx.synchronize()
            except Exception as exc:  # noqa: BLE001 - raised below, once all contexts waited
                errors.append(exc)
        if errors:
            for other in errors[1:]:
                errors[0].add_note(f"also: {type(other).__name__}: {other}")
            raise errors[0]

    @property
    def memory_pool(self):
        """The device's default memory pool as a `cuctx.MemoryPool` (where ``cuctx.empty``
        allocates unless given ``pool=``): its ``used``, ``reserved``, ``high_water``,
        ``release_threshold`` and ``trim()``."""
        if self._memory_pool is None:
            self._memory_pool = upper.memory_pool._default_of(self)
        return self._memory_pool

    def mem_info(self) -> MemInfo:
        """Free and total memory of the device, as seen from its primary context (or the
        current context when that is on this device and usable)."""
        ctx = context_for(self)
        if ctx._state is not ACTIVE:
            ctx = self.primary_context
        with in_context(ctx, "Device.mem_info"):
            return MemInfo(*self._query("cuMemGetInfo"))

    # -- the primary context --------------------------------------------------------------

    @property
    def primary_context(self) -> Context:
        """The device's primary context, retained while this object (or anything made in
        it) is referenced, and released after (cuDevicePrimaryCtxRetain/Release)."""
        with self._lock:
            ctx = self._primary() if self._primary is not None else None
            if ctx is None or ctx._state == DESTROYED:  # reset here, or by other code
                drv = self._backend.driver
                handle = call(self._backend, "cuDevicePrimaryCtxRetain", self._handle)
                ctx = Context._wrap(
                    self._backend,
                    handle,
                    self,
                    "primary",
                    (drv.cuDevicePrimaryCtxRelease, self._handle),
                )
                self._primary = weakref.ref(ctx)
            return ctx

    def set_current(self) -> Context:
        """Make this device current for the calling thread, as cudaSetDevice does: its
        primary context replaces the top of the stack and stays retained."""
        ctx = self._runtime_primary = self.primary_context
        ctx.set_current()
        return ctx

    def partition(self, sm_counts: Sequence[int]) -> Partition:
        """Split the device's SMs into green contexts (cuGreenCtxCreate), one per count in
        the list ``sm_counts`` (positive ints): their kernels run side by side on separate
        SMs, where kernels of ordinary contexts take turns. Each is a `Context` (kind
        ``"green"``); the driver rounds counts up to its granularity (the result's
        ``sm_counts`` says what it gave).
        ``with device.partition([64, 64]) as (a, b):`` destroys them after the block."""
        return partition(self, sm_counts)

    def reset(self) -> None:
        """Reset the primary context (cuDevicePrimaryCtxReset): all its memory and work are
        gone, and every object bound to it raises `ContextDestroyedError` from now on.

        Other libraries share the primary context (PyTorch, CuPy, Numba, cuda.core): the
        reset takes their memory too, as cudaDeviceReset does. Let them give back what they
        cache first (``cupy.get_default_memory_pool().free_all_blocks()``,
        ``torch.cuda.empty_cache()``), or their pools free dead pointers later, at the
        latest at interpreter exit."""
        with self._lock:
            live = self._primary() if self._primary is not None else None
            if live is not None and live._state is ACTIVE:
                live._tear_down_first()
            # Pools map their memory into the address spaces of the devices they granted
            # access, which a reset ends under them (a pool destroyed or allocating after is
            # the suspect of crashes on two H200s): the grants to this device, and those of
            # this device's pools, go first, as peer access goes with the reset.
            for device in self._backend.devices.values():
                for pool in list(device._granted_by):
                    if device is self or pool._device is self:
                        pool._revoke(device)
            call(self._backend, "cuDevicePrimaryCtxReset", self._handle)
            ctx = self._primary() if self._primary is not None else None
            if ctx is not None:
                ctx._mark_destroyed("by device.reset()")
                # The handle stays the device's primary context: the next lookup of it (a
                # lazy init, current_context()) must find a new, active Context object.
                if self._backend.contexts.get(ctx._key) is ctx:
                    del self._backend.contexts[ctx._key]
            self._runtime_primary = None
        # Peer access lives in primary contexts: the reset ended this device's, and others'
        # access to this device's memory, and pools' grants to it. Enable again after a reset.
        self._peers.clear()
        self._peer_holds.clear()
        for device in self._backend.devices.values():
            device._peers.discard(self)
            device._peer_holds.pop(self, None)

    def create_stream(self, priority: int | None = None, non_blocking: bool = True):
        """A new `cuctx.Stream` on this device: ``cuctx.Stream(self, priority, non_blocking)``."""
        return upper.stream(self, priority, non_blocking)

    def __enter__(self) -> Context:
        return self.primary_context.__enter__()

    def __exit__(self, *exc_info) -> None:
        exit_block(self._backend)

    def __repr__(self) -> str:
        return f"<Device {self.ordinal} ({self._backend.name})>"

    def __reduce__(self):
        return (Device, (self.ordinal,))


def devices() -> list[Device]:
    """All devices of the active backend."""
    backend = _driver.active()
    count = call(backend, "cuDeviceGetCount")
    return [Device(i) for i in range(count)]


upper.device = Device  # Context.create(0) and adopted contexts find their Device here
