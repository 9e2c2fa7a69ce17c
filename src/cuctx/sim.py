"""Controls that exist only on the simulated GPU, for testing error handling and timing in CI.

- `inject_fault(context, error)`: the context behaves as if a kernel in it hit a sticky fault.
- `stream_busy(stream, ns)`: queue work that takes ``ns`` nanoseconds of virtual time.
- `clock()`: the host's virtual clock, in nanoseconds.

Each raises `RuntimeError` on a backend that is not the sim (``backend.sim`` is None there):
on a GPU, faults come from real kernels and time from the real clock.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cuda.bindings.driver import CUresult

from . import _driver
from .errors import STICKY_CODES

if TYPE_CHECKING:
    from ._driver.sim import SimControls
    from .context import Context
    from .stream import Stream


def _controls(backend: _driver.Backend, what: str) -> SimControls:
    if backend.sim is None:
        raise RuntimeError(f"{what} works on the sim backend only, not on {backend.name}")
    return backend.sim


def inject_fault(context: Context, error: int | str = "CUDA_ERROR_ILLEGAL_ADDRESS") -> None:
    """Make ``context`` behave as if a kernel in it had hit a sticky fault: the next call
    that does work in it fails with ``error`` and poisons it, as on a real GPU."""
    sim = _controls(context._backend, "inject_fault")
    code = getattr(CUresult, error) if isinstance(error, str) else CUresult(error)
    if int(code) not in STICKY_CODES:
        raise ValueError(
            f"{code.name} is not a sticky fault; choose one of "
            f"{sorted(CUresult(c).name for c in STICKY_CODES)}"
        )
    context._check("inject_fault")
    (err,) = sim.inject_fault(context._handle, code)
    if err:
        raise RuntimeError(f"inject_fault failed with {err.name}")


def stream_busy(stream: Stream, ns: int) -> None:
    """Queue an operation on ``stream`` that does nothing for ``ns`` nanoseconds of virtual
    time: a stand-in for a long kernel, to test event timings and races between streams."""
    sim = _controls(stream._backend, "stream_busy")
    with stream.context:  # a default stream's handle means the current context's
        (err,) = sim.stream_busy(stream._handle, ns)
    if err:
        raise RuntimeError(f"stream_busy failed with {err.name}")


def clock() -> int:
    """The host's virtual clock of the active backend, in nanoseconds: it moves when the host
    synchronizes with work (as event times do), never with wall time."""
    return _controls(_driver.active(), "clock").clock()
