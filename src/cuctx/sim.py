"""Controls that exist only on the simulated GPU, for testing error handling in CI."""

from __future__ import annotations

from cuda.bindings.driver import CUresult

from .context import Context
from .errors import STICKY_CODES


def inject_fault(context: Context, error: int | str = "CUDA_ERROR_ILLEGAL_ADDRESS") -> None:
    """Make ``context`` behave as if a kernel in it had hit a sticky fault: the next call
    that does work in it fails with ``error`` and poisons it, as on a real GPU."""
    if context._backend.name != "sim":
        raise RuntimeError("inject_fault works on the sim backend only; on a GPU, faults "
                           "come from real kernels")
    code = getattr(CUresult, error) if isinstance(error, str) else CUresult(error)
    if int(code) not in STICKY_CODES:
        raise ValueError(f"{code.name} is not a sticky fault; choose one of "
                         f"{sorted(CUresult(c).name for c in STICKY_CODES)}")
    context._check("inject_fault")
    err, = context._backend.driver.simInjectFault(context._handle, code)
    if err:
        raise RuntimeError(f"simInjectFault failed with {err.name}")
