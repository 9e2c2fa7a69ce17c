"""Kernel twins: the Python functions the sim runs for kernels.

A launch copies the parameter bytes and queues `run_twin` on the stream, which calls
``twin(grid, block, *args)`` with each argument decoded from its bytes (`decoders`): by the
parameter's type where cuctx knows it from the PTX (``simSetKernelTwin``'s ``kinds``), by
the twin's annotation, and else by the parameter's size. Twins reach memory only through
`SimPointer`, whose views are checked against the live allocations and, for another
device's memory, against the peer access of the context the twin runs in.

A twin that faults (`_Fault`: an illegal or misaligned address) or raises fails the launch
with the sticky code, as a GPU kernel does. The first such failure of a context is kept
(`remember_fault`: ``ctx.resources["fault_cause"]``, the exception and a sentence naming the
twin's file and line) for ``backend.sim.fault_cause``, so the error the user sees can say
what went wrong.
"""

from __future__ import annotations

import inspect
import struct
import traceback
import warnings

import numpy as np
from cuda.bindings.driver import CUresult

from ...devcode._layout import Param
from ...devcode._twin_check import where
from ._common import LAUNCH_FAILED, MISALIGNED_ADDRESS

_FLOAT = {2: "<e", 4: "<f", 8: "<d"}
_SIGNED = {1: "<b", 2: "<h", 4: "<i", 8: "<q"}
_COMPLEX = {8: "<2f", 16: "<2d"}


class SimTwinWarning(RuntimeWarning):
    """A kernel twin raised; the launch failed with CUDA_ERROR_LAUNCH_FAILED."""


class _Fault(Exception):
    def __init__(self, code: CUresult, why: str | None = None):
        self.code = code
        self.why = why  # what made the access illegal, where more than "no allocation there"


class SimPointer(int):
    """An 8-byte kernel argument as a twin sees it: the integer value, plus `view` for
    bounds-checked access when it is a pointer."""

    def __new__(cls, value: int, driver):
        self = super().__new__(cls, value)
        self._driver = driver
        return self

    def view(self, dtype, count: int | None = None) -> np.ndarray:
        """A NumPy view of ``count`` elements of ``dtype`` at this address (default: up to
        the end of its allocation). Outside every live allocation: an illegal-address
        fault (no elements: an empty array, whatever the address); an address not aligned
        to the element size: a misaligned-address fault."""
        dtype = np.dtype(dtype)
        if int(self) % dtype.alignment:
            raise _Fault(MISALIGNED_ADDRESS)
        if count is None:
            count = self._driver._extent(int(self)) // dtype.itemsize
        if not count:  # no element: no access, wherever it points (as on a GPU)
            return np.empty(0, dtype)
        err, raw = self._driver._kernel_view(int(self), int(count) * dtype.itemsize)
        if err:
            raise _Fault(err, raw)  # raw: None, or why in words
        self._driver._touched += raw.nbytes  # the kernel's cost (`_timing`)
        return raw.view(dtype)

    def __repr__(self) -> str:
        return f"SimPointer({int(self):#x})"


def decoders(fn, params: tuple[Param, ...], kinds: tuple | None) -> list[str]:
    """How each parameter reaches the twin. An annotation decides first: ``float`` -> a
    float of the parameter's size (half, float, double); ``complex`` -> two floats or two
    doubles; ``bytes`` -> the raw bytes; ``int`` -> a signed integer. Without one, the
    parameter's kind (cuctx checked at load that annotations do not contradict it):
    "float" -> a float, "struct" -> the raw bytes, "int" (and unknown) -> by size: a
    `SimPointer` for 8 bytes, a signed integer for 1, 2 and 4, the raw bytes otherwise."""
    try:
        positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        annotated = [p for p in inspect.signature(fn).parameters.values() if p.kind in positional][
            2:
        ]
    except (TypeError, ValueError):
        annotated = []
    out = []
    for i, param in enumerate(params):
        note = annotated[i].annotation if i < len(annotated) else inspect.Parameter.empty
        note = None if note is inspect.Parameter.empty else getattr(note, "__name__", note)
        kind = kinds[i] if kinds else None
        if note == "bytes":
            out.append("bytes")
        elif (note == "float" or (note is None and kind == "float")) and param.size in _FLOAT:
            out.append(_FLOAT[param.size])
        elif note == "complex" and param.size in _COMPLEX:
            out.append("complex" + _COMPLEX[param.size])
        elif (note is None and kind == "struct") or param.size not in _SIGNED:
            out.append("bytes")
        elif param.size == 8 and note != "int":
            out.append("pointer")
        else:
            out.append(_SIGNED[param.size])
    return out


def decode_args(driver, kinds: list[str], raw: list[bytes]) -> list:
    out = []
    for kind, data in zip(kinds, raw):
        if kind == "pointer":
            out.append(SimPointer(int.from_bytes(data, "little"), driver))
        elif kind == "bytes":
            out.append(data)
        elif kind.startswith("complex"):
            out.append(complex(*struct.unpack(kind[len("complex") :], data)))
        else:
            out.append(struct.unpack(kind, data)[0])
    return out


def run_twin(driver, ctx, name: str, twin, grid, block, kinds, raw):
    """Run one launch's twin; None, or the sticky CUresult its failure gives."""
    driver._twin_ctx = ctx  # what its views may reach depends on it (`_kernel_view`)
    try:
        args = decode_args(driver, kinds, raw)
        twin(grid, block, *args)
        declared = getattr(twin, "cost_ns", None)  # the twin's own time (`_timing`)
        if declared is not None:
            driver._declared = int(declared(grid, block, *args) if callable(declared) else declared)
    except _Fault as fault:
        what = fault.why or "memory it may not"
        remember_fault(
            ctx,
            None,
            f"the sim twin of kernel {name!r} ({where(twin)}) accessed "
            f"{what} at {_line_of(fault, twin)}",
        )
        return fault.code
    except Exception as exc:  # noqa: BLE001 - a twin's bug fails the launch, as a trap
        at = _line_of(exc, twin)
        remember_fault(ctx, exc, f"the sim twin of kernel {name!r} raised {exc!r} at {at}")
        warnings.warn(
            f"the sim twin of kernel {name!r} raised {exc!r} at {at}; the launch "
            f"fails with CUDA_ERROR_LAUNCH_FAILED\n{traceback.format_exc()}",
            SimTwinWarning,
            stacklevel=2,
        )
        return LAUNCH_FAILED
    finally:
        driver._twin_ctx = None
    return None


def remember_fault(ctx, exc: BaseException | None, text: str) -> None:
    """Keep what made ``ctx`` fault, for `SimControls.fault_cause` (the first is the cause)."""
    ctx.resources.setdefault("fault_cause", (exc, text))


def _line_of(exc: BaseException, twin) -> str:
    """``file:line`` of the twin's own frame where ``exc`` came from (the innermost frame in
    the twin's file), else where the twin is defined."""
    home = where(twin).rsplit(":", 1)[0]
    frames = traceback.extract_tb(exc.__traceback__)
    mine = [f for f in frames if f.filename == home]
    frame = mine[-1] if mine else (frames[-1] if frames else None)
    return f"{frame.filename}:{frame.lineno}" if frame else where(twin)
