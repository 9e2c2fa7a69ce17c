"""cuctx: the CUDA host side for Python (devices, contexts, streams, memory, kernels, graphs),
on the real driver or on a simulated GPU."""

from __future__ import annotations

from . import _driver
from .context import Context, ContextFlags, current_context, current_device, ensure_context
from .device import ComputeCapability, Device, DeviceProperties, MemInfo, devices
from .errors import (BackendUnavailableError, ContextDestroyedError, ContextPoisonedError,
                     CudaError, InvalidContextError, InvalidDeviceError, InvalidValueError,
                     NotSupportedError, OutOfMemoryError, StickyFaultError)

__version__ = "0.1.0"


def backend() -> _driver.Backend:
    """The active backend: ``.name`` is "cuda" or "sim", ``.reason`` says why it was chosen;
    ``str()`` gives both (e.g. "sim: no NVIDIA driver found ...")."""
    return _driver.active()


def set_backend(name: str) -> _driver.Backend:
    """Switch the backend that new objects use ("auto", "cuda" or "sim"). Objects made
    before keep the backend they were made on."""
    return _driver.select(name)


__all__ = [
    "BackendUnavailableError", "ComputeCapability", "Context", "ContextDestroyedError",
    "ContextFlags", "ContextPoisonedError", "CudaError", "Device", "DeviceProperties",
    "InvalidContextError", "InvalidDeviceError", "InvalidValueError", "MemInfo",
    "NotSupportedError", "OutOfMemoryError", "StickyFaultError", "backend", "current_context",
    "current_device", "devices", "ensure_context", "set_backend",
]
