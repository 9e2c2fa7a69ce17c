"""The seam between cuctx and a driver.

A backend's ``driver`` offers the functions of ``cuda.bindings.driver`` that cuctx uses, with
the same names, arguments and return convention: a tuple whose first item is a ``CUresult``.
For the ``cuda`` backend it *is* the ``cuda.bindings.driver`` module, so calls cost exactly
what cuda.bindings costs; for ``sim`` it is a `SimDriver`, which has only functions that
cuda.bindings.driver has. The layers above call ``backend.driver.cuXxx(...)`` and translate
failures into exceptions in one place (`cuctx._calls.fail`), so both backends raise the same
exceptions for the same situations.

Two more slots say what else a backend can do, so no code above the seam tests its name:
``sim`` holds the controls only the simulated GPU has (fault injection, work of a given
duration, kernel twins, the virtual clock; `SimControls`), None on ``cuda``; ``native`` is
the compiled fast path's driver (`cuctx._driver.native`; None where it is not built or is
turned off, ``native_reason`` says why).

A `Backend` also holds the per-backend state of the layers above (the context registry, the
device objects, the per-thread shadow stacks), so objects of two backends never mix.
"""

from __future__ import annotations

import os
import sys
import threading
import weakref
from dataclasses import dataclass, field

from typing import TYPE_CHECKING, Any, Callable

from cuda.bindings.driver import CU_STREAM_LEGACY, CU_STREAM_PER_THREAD

from ..errors import BackendUnavailableError, called_from_host_function
from . import native

if TYPE_CHECKING:
    from ..device import Device
    from ..stream import Stream
    from .sim import SimControls

NAMES = ("auto", "cuda", "sim")


class ThreadState:
    """Per-thread state of the layers above: the shadow context stack (`cuctx.context`),
    the entry depth of each open ``with`` block, the current stream per device."""

    __slots__ = ("stack", "blocks", "streams")

    def __init__(self) -> None:
        self.stack: list = []
        self.blocks: list[int] = []
        self.streams: dict = {}


# Threads running a host function now (their idents). Entries that read no thread state
# (record, wait, synchronize, ...) test this set; it is empty except while one runs.
in_host_function: set[int] = set()

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class HostFunctionState:
    """Stands in for a thread's `ThreadState` while a host function runs on that thread:
    every cuctx call that reads thread state raises `NotPermittedError` from that read, so
    the check costs the normal path nothing."""

    __slots__ = ()

    def __getattr__(self, name: str):
        raise called_from_host_function(public_entry(sys._getframe(1)))


HOST_FUNCTION_STATE = HostFunctionState()


def public_entry(frame) -> str:
    """The cuctx function or method the user called, seen from a frame inside it: the
    outermost cuctx frame below the caller's code (or below the host-function trampoline)."""
    entry = None
    while (
        frame is not None
        and frame.f_code.co_filename.startswith(_PACKAGE)
        and frame.f_code.co_name != "_call_pending"
    ):  # the host-function trampoline
        entry = frame.f_code
        frame = frame.f_back
    if entry is None:
        return "a cuctx call"
    name = entry.co_qualname.removesuffix(".__init__")  # Stream.__init__ -> cuctx.Stream
    return name if "." in name else f"cuctx.{name}"


class _Local(threading.local):
    # One thread-local read per operation (``backend.tls.state``), then plain attributes:
    # each read of a threading.local attribute costs more than the rest of a push.
    def __init__(self) -> None:
        self.state = ThreadState()


# Stream handles with one meaning on every backend: 0 and LEGACY name the current context's
# legacy default stream, PER_THREAD the calling thread's per-thread one. `_handle_of` reads a
# handle from what another library hands over; `_stack` is the thread's stack of current
# streams on a device (``with stream:``).
LEGACY, PER_THREAD = int(CU_STREAM_LEGACY), int(CU_STREAM_PER_THREAD)  # 1, 2


def _handle_of(obj: Any) -> int:
    protocol = getattr(obj, "__cuda_stream__", None)
    if protocol is not None:
        value = protocol() if callable(protocol) else protocol
        return int(value[1])
    if isinstance(obj, bool):
        raise TypeError("a stream handle must be an int or a CUstream, not a bool")
    try:
        return int(obj)
    except (TypeError, ValueError):
        raise TypeError(
            f"cannot adopt {type(obj).__name__} as a stream: it has no __cuda_stream__ and is "
            "not a handle (for PyTorch pass the torch.cuda.Stream, for CuPy the cupy.cuda."
            "Stream, or pass stream.cuda_stream / stream.ptr as an int)"
        ) from None


def _stack(backend: Backend, device: Device) -> list[Stream]:
    return backend.tls.state.streams.setdefault(device, [])


@dataclass(eq=False, slots=True)  # (slots: the compiled paths read `native` and `tls` there)
class Backend:
    name: str  # "cuda" or "sim": for people (messages, `info`); code asks the slots below
    driver: object  # cuda.bindings.driver, or a SimDriver with the same names
    reason: str  # why this backend was chosen
    sim: SimControls | None = None  # the simulated GPU's controls; None on a real GPU
    native: object = None  # the compiled fast path's driver (truthy), None: Python paths only
    native_reason: str = ""  # what `native` is, or why it is None
    contexts: weakref.WeakValueDictionary = field(default_factory=weakref.WeakValueDictionary)
    devices: dict = field(default_factory=dict)
    tls: _Local = field(default_factory=_Local)
    lock: threading.RLock = field(default_factory=threading.RLock)

    def __str__(self) -> str:
        return f"{self.name}: {self.reason}"

    def __repr__(self) -> str:
        return f"<cuctx backend {self}>"


_lock = threading.Lock()
_loaded: dict[str, Backend] = {}
_active: Backend | None = None
# Told of each backend `select` makes active, from above the seam (the race checker, which
# is on by default on the sim): see `on_select`.
_listeners: list[Callable[[Backend], None]] = []


def on_select(listener: Callable[[Backend], None]) -> None:
    """Call ``listener`` with the active backend now, if one is chosen, and with each one
    `select` makes active from now on (a switch, or the first use choosing one), just before
    it becomes active: an exception it raises leaves the backend unchosen, and is raised by
    the use that chose it (and by each later one)."""
    _listeners.append(listener)
    if _active is not None:
        listener(_active)


def active() -> Backend:
    """The backend new objects use; chosen from CUCTX_BACKEND on first use."""
    return _active or select(os.environ.get("CUCTX_BACKEND", ""), "CUCTX_BACKEND")


def select(name: str, source: str = "") -> Backend:
    """Make ``name`` ("auto", "cuda" or "sim"; any case, surrounding blanks ignored, empty
    means "auto") the active backend and return it. ``source`` names where the name came
    from, for the error message."""
    global _active
    if not isinstance(name, str):
        raise TypeError(f"a backend name must be a str, not {type(name).__name__}")
    given, name = name, name.strip().lower() or "auto"
    if name not in NAMES:
        where = f" in {source}" if source else ""
        raise ValueError(
            f"unknown cuctx backend {given!r}{where}: choose one of "
            f"{', '.join(NAMES)} (set CUCTX_BACKEND or call cuctx.set_backend)"
        )
    with _lock:
        if name == "auto":
            backend = _load_cuda(required=False) or _load_sim(_cuda_missing_reason)
        elif name == "cuda":
            backend = _load_cuda(required=True)
        else:
            backend = _load_sim("selected by CUCTX_BACKEND=sim or set_backend('sim')")
    for listener in _listeners:  # before it is active: one may refuse (a bad CUCTX_RACECHECK)
        listener(backend)
    _active = backend
    return backend


_cuda_missing_reason = ""


def _load_cuda(required: bool) -> Backend | None:
    global _cuda_missing_reason
    if "cuda" in _loaded:
        return _loaded["cuda"]
    from .cuda import probe

    driver, reason = probe()
    if driver is None:
        _cuda_missing_reason = reason
        if required:
            raise BackendUnavailableError(
                f"the cuda backend was asked for but cannot run here: {reason}. "
                "Use CUCTX_BACKEND=sim (or auto) to run on the simulated GPU."
            )
        return None
    _loaded["cuda"] = Backend("cuda", driver, reason, None, *native.load(driver, None))
    return _loaded["cuda"]


def _load_sim(reason: str) -> Backend:
    if "sim" not in _loaded:
        from .sim import SimControls, from_env

        driver = from_env()
        driver.cuInit(0)
        controls = SimControls(driver)
        _loaded["sim"] = Backend("sim", driver, reason, controls, *native.load(driver, controls))
    _loaded["sim"].reason = reason
    return _loaded["sim"]
