"""Driver initialisation, error strings and device queries of the sim."""

from __future__ import annotations

import hashlib
import types

from cuda.bindings.driver import CUdevice, CUdevice_attribute

from ._common import INVALID_DEVICE, INVALID_VALUE, NOT_INITIALIZED, OK


class SimDevice:
    """One modelled H100. Its attributes are the recorded ones of a real H100."""

    def __init__(self, ordinal: int, spec: dict):
        self.ordinal = ordinal
        self.name = spec["name"] + " (cuctx sim)"
        self.total_mem = spec["total_mem"]
        self.attributes = {
            getattr(CUdevice_attribute, k): v
            for k, v in spec["attributes"].items()
            if hasattr(CUdevice_attribute, k)
        }
        self.uuid = hashlib.sha256(f"cuctx-sim-gpu-{ordinal}".encode()).digest()[:16]
        self.pci_bus_id = f"0000:{0x18 + 0x10 * ordinal:02x}:00.0"
        # Memory other than ours in use on a fresh GPU (the driver's own reservation).
        self.reserved = 512 << 20


class DeviceQueries:
    """cuInit, cuDriverGetVersion, cuGetError*, cuDevice*."""

    def cuInit(self, flags):
        if flags != 0:
            return (INVALID_VALUE,)
        self._initialized = True
        return (OK,)

    def cuDriverGetVersion(self):
        return (OK, self._spec["driver_version"])

    def cuGetErrorString(self, error):
        text = self._spec["error_strings"].get(str(int(error)))
        return (OK, text.encode()) if text else (INVALID_VALUE, None)

    def cuDeviceGetCount(self):
        if not self._initialized:
            return (NOT_INITIALIZED, None)
        return (OK, len(self._devices))

    def _device(self, dev) -> SimDevice | None:
        ordinal = int(dev)
        return self._devices[ordinal] if 0 <= ordinal < len(self._devices) else None

    def cuDeviceGet(self, ordinal):
        if not self._initialized:
            return (NOT_INITIALIZED, None)
        if self._device(ordinal) is None:
            return (INVALID_DEVICE, None)
        return (OK, CUdevice(ordinal))

    def _device_query(self, dev, read):
        if not self._initialized:
            return (NOT_INITIALIZED, None)
        device = self._device(dev)
        if device is None:
            return (INVALID_DEVICE, None)
        return (OK, read(device))

    def cuDeviceGetName(self, length, dev):
        return self._device_query(dev, lambda d: d.name.encode()[: length - 1] + b"\0")

    def cuDeviceGetUuid(self, dev):
        return self._device_query(dev, lambda d: types.SimpleNamespace(bytes=d.uuid))

    def cuDeviceGetPCIBusId(self, length, dev):
        return self._device_query(dev, lambda d: d.pci_bus_id.encode()[: length - 1] + b"\0")

    def cuDeviceTotalMem(self, dev):
        return self._device_query(dev, lambda d: d.total_mem)

    def cuDeviceGetAttribute(self, attrib, dev):
        result = self._device_query(dev, lambda d: d.attributes.get(attrib))
        if result[0] == OK and result[1] is None:  # an attribute this driver does not know
            return (INVALID_VALUE, None)
        return result
