"""Types generated from the driver's enums when cuctx is imported, so that a newer
cuda-bindings brings its new members without a cuctx release: `ContextFlags` (CUctx_flags)
and `DeviceProperties` (a property per CU_DEVICE_ATTRIBUTE_*, each alias included).

Apart from context.py and device.py, which hand them out: how a driver enum becomes cuctx's
type (which members to keep, how names are made, which attributes answer yes or no, which are
read each time) is one concern, and neither `Context` nor `Device` depends on it.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING

from cuda.bindings.driver import CUctx_flags, CUdevice_attribute

from ._calls import fail
from .errors import INVALID_VALUE, NOT_SUPPORTED, NotSupportedError

if TYPE_CHECKING:
    from .device import Device


ContextFlags = enum.IntFlag(
    "ContextFlags",
    {
        flag.name.removeprefix("CU_CTX_"): int(flag)
        for flag in CUctx_flags
        if flag.name not in ("CU_CTX_SCHED_MASK", "CU_CTX_FLAGS_MASK", "CU_CTX_BLOCKING_SYNC")
    },
)
ContextFlags.__doc__ = "Context creation flags, generated from the driver's CUctx_flags."
ContextFlags.__module__ = __name__


def _attribute_name(name: str) -> str:
    return name.removeprefix("CU_DEVICE_ATTRIBUTE_").lower()


# Attributes that answer yes or no (0/1), returned as bool: those named *_SUPPORTED, CAN_*,
# *_ENABLED, and these, whose names do not say so.
_YES_NO = frozenset(
    {
        "gpu_overlap",
        "kernel_exec_timeout",
        "integrated",
        "concurrent_kernels",
        "tcc_driver",
        "unified_addressing",
        "managed_memory",
        "multi_gpu_board",
        "pageable_memory_access",
        "concurrent_managed_access",
        "cooperative_launch",
        "cooperative_multi_device_launch",
        "pageable_memory_access_uses_host_page_tables",
        "direct_managed_mem_access_from_host",
        "cluster_launch",
        "unified_function_pointers",
    }
)


def is_yes_no(name: str) -> bool:
    return name.endswith(("_supported", "_enabled")) or name.startswith("can_") or name in _YES_NO


def _property_for(attribute: CUdevice_attribute, name: str) -> property:
    if is_yes_no(name):

        def read(self: DeviceProperties) -> bool | int:
            return bool(self._read(attribute))
    else:

        def read(self: DeviceProperties) -> bool | int:
            return self._read(attribute)

    read.__name__ = name
    read.__doc__ = f"The device's CU_DEVICE_ATTRIBUTE_{name.upper()}" + (
        " (a bool)." if is_yes_no(name) else "."
    )
    return property(read)


# Attributes read from the driver every time, because they can change while the process
# runs: an administrator sets the compute mode (nvidia-smi -c, nvmlDeviceSetComputeMode)
# without a reset, and it decides whether new contexts can be made. Every other attribute
# is the hardware's (sizes, limits, peak clocks, capabilities) or a setting that changes
# only with a device reset or reboot (ECC, TCC, MPS), so it is read once.
_UNCACHED = frozenset({CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_MODE})


class DeviceProperties:
    """Every CU_DEVICE_ATTRIBUTE_* of a device, under its lower-case name without the prefix
    (``max_threads_per_block`` for CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK), each alias
    of the enum included (``virtual_memory_management_supported`` and
    ``virtual_address_management_supported`` are one attribute). Yes/no attributes are
    ``bool``, the others ``int``. The properties are generated from the driver's enum, so a
    newer cuda-bindings brings new ones. Values are read once and cached, except
    ``compute_mode``, which can change while the process runs and is read each time; an
    attribute the installed driver does not know raises `NotSupportedError`.
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
                if int(err) == INVALID_VALUE:  # the driver predates this attribute
                    raise NotSupportedError(
                        NOT_SUPPORTED,
                        "cuDeviceGetAttribute",
                        "",
                        f"this driver does not know {attribute.name}",
                    )
                fail(backend, err, "cuDeviceGetAttribute")
            value = int(value)
            if attribute not in _UNCACHED:
                self._cache[attribute] = value
        return value

    def as_dict(self) -> dict[str, bool | int]:
        """Every attribute the driver knows, by each of its names."""
        values = {}
        for name in ATTRIBUTE_NAMES:
            try:
                values[name] = getattr(self, name)
            except Exception as exc:  # noqa: BLE001 - only the driver's "unknown" is skipped
                if type(exc).__name__ != "NotSupportedError":
                    raise
        return values

    def __repr__(self) -> str:
        try:
            what = (
                f": compute capability {self.compute_capability_major}."
                f"{self.compute_capability_minor}, {self.multiprocessor_count} SMs, "
                f"{len(ATTRIBUTE_NAMES)} attributes (as_dict() lists them)"
            )
        except Exception:  # noqa: BLE001 - a repr never raises; the driver's error shows on use
            what = ""
        return (
            f"<DeviceProperties of device {self._device.ordinal} "
            f"({self._device._backend.name}){what}>"
        )


# __members__, not iteration: iterating an enum skips the aliases (a second name for a value).
_ATTRIBUTES = {
    _attribute_name(name): attribute
    for name, attribute in CUdevice_attribute.__members__.items()
    if name != "CU_DEVICE_ATTRIBUTE_MAX"
}
ATTRIBUTE_NAMES = tuple(_ATTRIBUTES)
for _name, _attribute in _ATTRIBUTES.items():
    setattr(DeviceProperties, _name, _property_for(_attribute, _name))
