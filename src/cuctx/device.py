"""Devices: one object per ordinal and backend, their properties, their primary context."""

from __future__ import annotations

import threading
import weakref
from typing import NamedTuple

from cuda.bindings.driver import CUdevice_attribute

from . import _driver
from .context import ACTIVE, DESTROYED, Context, call, exit_block, fail


class ComputeCapability(NamedTuple):
    major: int
    minor: int

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}"


class MemInfo(NamedTuple):
    free: int
    total: int


def _attribute_name(attribute: CUdevice_attribute) -> str:
    return attribute.name.removeprefix("CU_DEVICE_ATTRIBUTE_").lower()


def _property_for(attribute: CUdevice_attribute) -> property:
    def read(self: DeviceProperties) -> int:
        return self._read(attribute)
    read.__name__ = _attribute_name(attribute)
    read.__doc__ = f"The device's {attribute.name}."
    return property(read)


class DeviceProperties:
    """Every CU_DEVICE_ATTRIBUTE_* of a device, under its lower-case name without the prefix
    (``max_threads_per_block`` for CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK). The
    properties are generated from the driver's enum, so a newer cuda-bindings brings new ones.
    Values are read once and cached; an attribute the installed driver does not know raises
    `NotSupportedError`.
    """

    __slots__ = ("_device", "_cache")

    def __init__(self, device: Device):
        self._device = device
        self._cache: dict[CUdevice_attribute, int] = {}

    def _read(self, attribute: CUdevice_attribute) -> int:
        value = self._cache.get(attribute)
        if value is None:
            backend = self._device._backend
            err, value = backend.driver.cuDeviceGetAttribute(attribute, self._device._handle)
            if err:
                if int(err) == 1:  # INVALID_VALUE: the driver predates this attribute
                    from .errors import NotSupportedError
                    raise NotSupportedError(801, "cuDeviceGetAttribute", "",
                                            f"this driver does not know {attribute.name}")
                fail(backend, err, "cuDeviceGetAttribute")
            value = self._cache[attribute] = int(value)
        return value

    def as_dict(self) -> dict[str, int]:
        """Every attribute the driver knows, by name."""
        values = {}
        for name in ATTRIBUTE_NAMES:
            try:
                values[name] = getattr(self, name)
            except Exception as exc:  # noqa: BLE001 - only the driver's "unknown" is skipped
                if type(exc).__name__ != "NotSupportedError":
                    raise
        return values

    def __repr__(self) -> str:
        return f"<DeviceProperties of {self._device!r}>"


ATTRIBUTE_NAMES = tuple(_attribute_name(a) for a in CUdevice_attribute
                        if a.name != "CU_DEVICE_ATTRIBUTE_MAX")
for _attribute in CUdevice_attribute:
    if _attribute.name != "CU_DEVICE_ATTRIBUTE_MAX":
        setattr(DeviceProperties, _attribute_name(_attribute), _property_for(_attribute))


class Device:
    """A CUDA device. ``Device(i)`` returns the one object for ordinal ``i`` of the active
    backend. ``with device:`` makes its primary context current for the block."""

    __slots__ = ("_backend", "ordinal", "_handle", "_primary", "_runtime_primary",
                 "_properties", "_lock", "__weakref__")

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
                fail(backend, err, f"Device({ordinal})",
                     hint=f"the {backend.name} backend has {count} device(s): valid ordinals "
                          f"are 0 to {count - 1}" if count else "there is no device")
            device = object.__new__(cls)
            device._backend = backend
            device.ordinal = ordinal
            device._handle = handle
            device._primary = None
            device._runtime_primary = None
            device._properties = None
            device._lock = threading.Lock()
            backend.devices[ordinal] = device
        return device

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
        other = Device._for_backend(self._backend, other) if isinstance(other, int) else other
        if not isinstance(other, Device) or other._backend is not self._backend:
            raise TypeError(f"can_access_peer needs a Device of the same backend, got {other!r}")
        return bool(self._query("cuDeviceCanAccessPeer", self._handle, other._handle))

    def mem_info(self) -> MemInfo:
        """Free and total memory of the device, as seen from its primary context (or the
        current context when that is on this device and usable)."""
        ctx = self._current_or_primary()
        if ctx._state is not ACTIVE:
            ctx = self.primary_context
        with ctx._current("Device.mem_info"):
            return MemInfo(*self._query("cuMemGetInfo"))

    def _current_or_primary(self) -> Context:
        """The context work on this device goes in: the current context when it is on this
        device, else the device's primary context."""
        err, handle = self._backend.driver.cuCtxGetCurrent()
        ctx = self._backend.contexts.get(int(handle)) if not err and int(handle) else None
        return ctx if ctx is not None and ctx._device is self else self.primary_context

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
                ctx = Context._wrap(self._backend, handle, self, "primary",
                                    (drv.cuDevicePrimaryCtxRelease, self._handle))
                self._primary = weakref.ref(ctx)
            return ctx

    def set_current(self) -> Context:
        """Make this device current for the calling thread, as cudaSetDevice does: its
        primary context replaces the top of the stack and stays retained."""
        ctx = self._runtime_primary = self.primary_context
        ctx.set_current()
        return ctx

    def reset(self) -> None:
        """Reset the primary context (cuDevicePrimaryCtxReset): all its memory and work are
        gone, and every object bound to it raises `ContextDestroyedError` from now on."""
        with self._lock:
            call(self._backend, "cuDevicePrimaryCtxReset", self._handle)
            ctx = self._primary() if self._primary is not None else None
            if ctx is not None:
                ctx._mark_destroyed("by device.reset()")
                # The handle stays the device's primary context: the next lookup of it (a
                # lazy init, current_context()) must find a new, active Context object.
                if self._backend.contexts.get(ctx._key) is ctx:
                    del self._backend.contexts[ctx._key]
            self._runtime_primary = None

    def create_stream(self, priority: int | None = None, non_blocking: bool = True):
        """A new `cuctx.Stream` on this device: ``cuctx.Stream(self, priority, non_blocking)``."""
        from .stream import Stream
        return Stream(self, priority, non_blocking)

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
