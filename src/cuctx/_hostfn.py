"""Host functions: one C trampoline for the driver, a table of pending Python calls, the
failures kept until a synchronize reports them, and the guard that makes cuctx calls inside
a host function raise `NotPermittedError` (see `_driver.HostFunctionState`)."""

from __future__ import annotations

import atexit
import ctypes
import itertools
import sys
import threading
import time
from typing import TYPE_CHECKING, Callable

from cuda.bindings.driver import CUhostFn

from . import _driver
from ._driver import HOST_FUNCTION_STATE, in_host_function
from .errors import HostFunctionError

if TYPE_CHECKING:
    from .context import Context

# -- one C trampoline, a table of pending Python calls -------------------------------------
#
# The driver gets the address of one ctypes callback and an integer key as its userData. The
# table keeps each function and its arguments alive until it ran; failures are filed under
# (context key, stream handle) until a synchronize reports them.

_pending: dict[int, tuple[Callable, tuple, tuple[int, int], bool]] = {}  # ..., on a GPU
_failures: dict[tuple[int, int], list[tuple[Callable, BaseException]]] = {}
_failures_lock = threading.Lock()
_keys = itertools.count(1)


def _run_host_func(key: int, _finalizing=sys.is_finalizing) -> None:
    # The C entry point: runs on the driver's thread (on the sim: the thread that
    # synchronizes), so nothing may escape into it. Only cuctx's own bookkeeping can raise
    # here, and only while the interpreter tears down (module globals gone): then the host
    # function is dropped.
    try:
        _call_pending(key)
    except BaseException:
        if not _finalizing():
            raise


def _call_pending(key: int) -> None:
    entry = _pending.pop(key, None)
    if entry is None:  # already dropped (its context went away)
        return
    fn, args, where, _ = entry
    guard = _enter_host_function()
    try:
        fn(*args)
    except BaseException as exc:  # noqa: BLE001 - reported at the next synchronize
        with _failures_lock:
            _failures.setdefault(where, []).append((fn, exc))
    finally:
        _leave_host_function(guard)


def _enter_host_function() -> tuple:
    """Until `_leave_host_function`, every cuctx call of this thread raises: its state (of
    each backend) becomes HOST_FUNCTION_STATE, and the thread is marked for the entries that
    read no state."""
    ident = threading.get_ident()
    saved = [(backend, backend.tls.state) for backend in list(_driver._loaded.values())]
    for backend, _ in saved:
        backend.tls.state = HOST_FUNCTION_STATE
    nested = ident in in_host_function
    in_host_function.add(ident)
    return ident, nested, saved


def _leave_host_function(guard: tuple) -> None:
    ident, nested, saved = guard
    for backend, state in saved:
        backend.tls.state = state
    if not nested:
        in_host_function.discard(ident)


_TRAMPOLINE = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(_run_host_func)
_TRAMPOLINE_FN = CUhostFn(ctypes.cast(_TRAMPOLINE, ctypes.c_void_p).value)
_EXIT_WAIT_S = 5.0


@atexit.register
def _wait_for_host_functions() -> None:
    """At interpreter exit, give host functions still queued on a GPU a few seconds to run:
    the driver would otherwise call the trampoline from its thread while Python tears down."""
    deadline = time.monotonic() + _EXIT_WAIT_S
    while (any(on_gpu for *_, on_gpu in list(_pending.values())) or in_host_function) \
            and time.monotonic() < deadline:
        time.sleep(0.001)


def forget_host_funcs(ctx_key: int) -> None:
    """Drop the host functions of a context that is gone (they will never run) and its
    failures (nobody can ask for them any more)."""
    with _failures_lock:
        for key in [k for k, (_, _, where, _) in _pending.items() if where[0] == ctx_key]:
            del _pending[key]
        for key in [k for k in _failures if k[0] == ctx_key]:
            del _failures[key]


def _take_failures(match: Callable[[tuple[int, int]], bool]) -> list:
    with _failures_lock:
        keys = [k for k in _failures if match(k)]
        return [f for k in keys for f in _failures.pop(k)]


def raise_host_func_errors(ctx: Context) -> None:
    """Raise `HostFunctionError` for host functions of any stream of ``ctx`` that failed
    since they were last reported (what Context.synchronize reports)."""
    if _failures:
        failures = _take_failures(lambda k: k[0] == ctx._key)
        if failures:
            raise HostFunctionError(f"streams of {ctx!r}", failures) from failures[0][1]
