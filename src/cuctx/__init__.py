"""cuctx: the CUDA host side for Python (devices, contexts, streams, memory, kernels),
on the real driver or on a simulated GPU."""

from __future__ import annotations

from . import _driver
from .context import Context, current_context, current_device, ensure_context, synchronize
from .device import ComputeCapability, Device, MemInfo, devices
from ._enums import ContextFlags, DeviceProperties
from .errors import (
    BackendUnavailableError,
    ContextDestroyedError,
    ContextPoisonedError,
    CudaError,
    GraphCaptureError,
    GraphUpdateError,
    InvalidContextError,
    InvalidDeviceError,
    InvalidValueError,
    NotPermittedError,
    NotSupportedError,
    OutOfMemoryError,
    StickyFaultError,
    WorkerDiedError,
    WorkerFaultError,
    WorkerTimeoutError,
)
from .event import Event
from .graphs import Graph, GraphExec, GraphNode, autograph
from .kernels import (
    BlockSizeSuggestion,
    CompileError,
    CompileResult,
    Kernel,
    KernelArgumentError,
    KernelAttributes,
    LaunchConfigError,
    Launcher,
    Library,
    LinkError,
    Module,
    compile_source,
)
from ._native_hooks import current_stream, empty, launch  # the compiled paths', where built
from .memory import (
    DeviceArray,
    MemoryPool,
    asarray,
    copy,
    defer_cleanup,
    full,
    managed_empty,
    pinned_empty,
    register_host,
    to_device,
    zeros,
)
from .stream import HostFunctionError, Stream, legacy_stream, per_thread_stream
from .errors import RaceError, RaceWarning
from .tools import racecheck, timeline
from .isolated import IsolatedExecutor
from .tools._racecheck_run import from_env as _racecheck_from_env

__version__ = "0.1.0"

# The race checker watches the whole run on the sim ("warn"), or as CUCTX_RACECHECK=raise|
# warn|off says (docs/checks.md).
_racecheck_from_env()


def backend() -> _driver.Backend:
    """The active backend: ``.name`` is "cuda" or "sim", ``.reason`` says why it was chosen;
    ``str()`` gives both (e.g. "sim: no NVIDIA driver found ...")."""
    return _driver.active()


def set_backend(name: str) -> _driver.Backend:
    """Switch the backend that new objects use ("auto", "cuda" or "sim"). Objects made
    before keep the backend they were made on."""
    return _driver.select(name)


__all__ = [
    "BackendUnavailableError",
    "BlockSizeSuggestion",
    "CompileError",
    "CompileResult",
    "ComputeCapability",
    "Context",
    "ContextDestroyedError",
    "ContextFlags",
    "ContextPoisonedError",
    "CudaError",
    "GraphCaptureError",
    "GraphUpdateError",
    "Device",
    "DeviceArray",
    "DeviceProperties",
    "Event",
    "Graph",
    "GraphExec",
    "GraphNode",
    "HostFunctionError",
    "InvalidContextError",
    "InvalidDeviceError",
    "InvalidValueError",
    "IsolatedExecutor",
    "Kernel",
    "KernelArgumentError",
    "KernelAttributes",
    "LaunchConfigError",
    "Launcher",
    "Library",
    "LinkError",
    "MemInfo",
    "MemoryPool",
    "Module",
    "NotPermittedError",
    "NotSupportedError",
    "OutOfMemoryError",
    "RaceError",
    "RaceWarning",
    "StickyFaultError",
    "Stream",
    "asarray",
    "autograph",
    "backend",
    "copy",
    "current_context",
    "current_device",
    "current_stream",
    "defer_cleanup",
    "devices",
    "empty",
    "compile_source",
    "ensure_context",
    "full",
    "launch",
    "legacy_stream",
    "managed_empty",
    "per_thread_stream",
    "pinned_empty",
    "racecheck",
    "register_host",
    "set_backend",
    "synchronize",
    "timeline",
    "to_device",
    "WorkerDiedError",
    "WorkerFaultError",
    "WorkerTimeoutError",
    "zeros",
]
