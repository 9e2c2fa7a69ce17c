"""The fuzzer's model of the live objects, and `attempt`, the one way it calls the API.

Every device array has a NumPy *mirror*: each allocation (`Base`) keeps its bytes as a flat
uint8 array plus a mask of the bytes whose value is known (``empty`` gives unknown bytes),
and every view (`Arr`) is a NumPy view of those bytes with the same offset, shape, strides
and dtype as the device view. NumPy's own view semantics then mirror cuctx's: a write
through any view shows in the base and in every overlapping view.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import cuctx

# The exceptions a user of cuctx may see from a call. Everything else (SystemError,
# KeyError, AttributeError, AssertionError, ...) is a bug. KernelArgumentError is a
# TypeError, LaunchConfigError a ValueError.
ALLOWED = (cuctx.CudaError, cuctx.HostFunctionError, TypeError, ValueError, IndexError)

FAULTS = (cuctx.StickyFaultError, cuctx.ContextPoisonedError)


class Maybe(tuple):
    """An expectation: the call may succeed or raise one of these types."""


ANY = Maybe(ALLOWED)


@dataclass
class Stats:
    """What the fuzzer did, for the counts the run prints (shared by threads)."""

    examples: int = 0
    steps: int = 0
    rules: Counter = field(default_factory=Counter)
    errors: Counter = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def rule(self, name: str) -> None:
        with self.lock:
            self.steps += 1
            self.rules[name] += 1

    def error(self, exc: BaseException) -> None:
        with self.lock:
            self.errors[type(exc).__name__] += 1


STATS = Stats()


class Failed:
    """What `attempt` returns when the call raised (as expected)."""

    __slots__ = ("exc",)

    def __init__(self, exc: BaseException):
        self.exc = exc

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return f"Failed({self.exc!r})"


def check_allowed(what: str, exc: BaseException) -> None:
    """An exception a user may see: an allowed type, with a message."""
    if not isinstance(exc, ALLOWED):  # the verdict is an AssertionError, as pytest's
        raise AssertionError(  # noqa: TRY004
            f"{what} raised {type(exc).__name__}, which is not a cuctx error nor a "
            f"TypeError/ValueError/IndexError: {exc!r}"
        ) from exc
    if not str(exc).strip():
        raise AssertionError(f"{what} raised {type(exc).__name__} without a message") from exc


def attempt(what: str, expect, fn: Callable, *args, **kwargs) -> Any:
    """Call ``fn``; check the outcome against ``expect``: None (must succeed), a `Maybe`
    (may raise one of its types) or a tuple of exception types (must raise one of them).
    Returns the result, or a `Failed` (falsy) holding the exception."""
    try:
        result = fn(*args, **kwargs)
    except Exception as exc:
        check_allowed(what, exc)
        STATS.error(exc)
        if expect is None:
            raise AssertionError(f"{what} should succeed but raised {exc!r}") from exc
        if not isinstance(exc, expect):
            raise AssertionError(  # noqa: TRY004
                f"{what} raised {exc!r}; expected one of {[t.__name__ for t in expect]}"
            ) from exc
        return Failed(exc)
    if expect is not None and not isinstance(expect, Maybe):
        raise AssertionError(
            f"{what} should raise one of {[t.__name__ for t in expect]} but returned {result!r}"
        )
    return result


# -- the records --------------------------------------------------------------------------


class CtxRec:
    """A context the fuzzer knows: ``state`` is "active", "destroyed" or "faulted" (a sticky
    fault was injected: calls in it may fail with the fault, and its data is unreliable)."""

    def __init__(self, ctx: cuctx.Context, kind: str, name: str):
        self.ctx = ctx
        self.kind = kind  # "primary" or "created"
        self.name = name
        self.state = "active"
        self.legacy: StreamRec | None = None

    @property
    def alive(self) -> bool:
        return self.state == "active"

    def __repr__(self) -> str:
        return f"<{self.name} {self.kind} {self.state}>"


class StreamRec:
    def __init__(self, stream: cuctx.Stream, ctx: CtxRec, kind: str):
        self.stream = stream
        self.ctx = ctx
        self.kind = kind  # "created" or "legacy"
        # Host functions that raised, not yet reported by a synchronize (None: maybe some).
        self.host_failures: int | None = 0
        self.host_expected = 0  # host functions queued that must have run after a synchronize

    def __repr__(self) -> str:
        return f"<stream {self.kind} of {self.ctx.name}>"


class EventRec:
    def __init__(self, event: cuctx.Event, ctx: CtxRec, timing: bool):
        self.event = event
        self.ctx = ctx
        self.timing = timing
        self.recorded = False

    def __repr__(self) -> str:
        return f"<event {'timing' if self.timing else 'sync'} of {self.ctx.name}>"


class Base:
    """One allocation: the device array made by empty/zeros/full/to_device, its bytes' mirror,
    and the streams whose queued work may still touch it."""

    def __init__(self, dev: cuctx.DeviceArray, ctx: CtxRec, alloc: StreamRec):
        self.dev = dev
        self.ctx = ctx
        self.alloc = alloc
        self.bytes = np.zeros(dev.nbytes, np.uint8)
        self.known = np.zeros(dev.nbytes, bool)
        self.pending: set[StreamRec] = {alloc}
        self.trusted = True  # False once a fault may have dropped work on it
        self.refs = 0  # live Arr records viewing it

    def typed(self, dtype: np.dtype, offset: int, shape, strides) -> tuple[np.ndarray, np.ndarray]:
        """The mirror view and its per-element byte mask for a device view."""
        mirror = np.ndarray(shape, dtype, buffer=self.bytes, offset=offset, strides=strides)
        mask = np.ndarray(
            tuple(shape) + (dtype.itemsize,),
            bool,
            buffer=self.known,
            offset=offset,
            strides=tuple(strides) + (1,),
        )
        return mirror, mask


class Arr:
    """A device array (a base or a view) and its mirror. An empty view has no bytes to
    mirror: its mirror is NumPy's own (empty) view."""

    def __init__(
        self,
        base: Base,
        dev: cuctx.DeviceArray,
        offset: int,
        empty_mirror: np.ndarray | None = None,
    ):
        self.base = base
        self.dev = dev
        self.offset = offset  # bytes from the base's start to the view's first element
        if dev.size:
            self.mirror, self.mask = base.typed(dev.dtype, offset, dev.shape, dev.strides)
        else:
            self.mirror = (
                empty_mirror if empty_mirror is not None else np.empty(dev.shape, dev.dtype)
            )
            self.mask = np.zeros(dev.shape + (dev.dtype.itemsize,), bool)
        base.refs += 1

    @property
    def ctx(self) -> CtxRec:
        return self.base.ctx

    def span(self) -> tuple[int, int]:
        """The bytes of the base the view covers, as [start, end) (for overlap checks)."""
        if self.dev.size == 0:
            return (self.offset, self.offset)
        lo = hi = self.offset
        for n, s in zip(self.dev.shape, self.dev.strides):
            if s < 0:
                lo += (n - 1) * s
            else:
                hi += (n - 1) * s
        return (lo, hi + self.dev.dtype.itemsize)

    def __repr__(self) -> str:
        return f"<arr {self.dev.shape} {self.dev.dtype} of {self.ctx.name}>"


def overlap(a: Arr, b: Arr) -> bool:
    if a.base is not b.base:
        return False
    (a0, a1), (b0, b1) = a.span(), b.span()
    return a0 < b1 and b0 < a1


def write(arr: Arr, values: np.ndarray | Any, known: np.ndarray | bool = True) -> None:
    """Record in the mirror that ``values`` were written through ``arr``."""
    arr.mirror[...] = values
    arr.mask[...] = known if isinstance(known, bool) else known.reshape(known.shape)


def same_values(got: np.ndarray, want: np.ndarray, mask: np.ndarray) -> bool:
    """``got`` equals ``want`` wherever every byte of the element is known (NaNs compare equal:
    a GPU and NumPy may produce NaNs with different bits)."""
    known = mask.all(axis=-1) if mask.ndim else mask
    if got.dtype.kind in "fc":
        return np.array_equal(got[known], want[known], equal_nan=True)
    return np.array_equal(got[known], want[known])
