"""Calling the driver: what every layer does around a call to ``backend.driver``, whatever
object it is made for. A call is refused first where CUDA forbids it (inside a host function;
work on the legacy stream while a global-mode capture runs), made by name and checked
(`call`), and a failed one raises cuctx's exception (`fail`: the one place where result codes
become exceptions, poisoning the context on a sticky fault, marking it destroyed on 709).

Apart from context.py and stream.py, whose objects it serves: nothing here needs the Context
or Stream class (a failure only asks the context to poison or mark itself), so the modules
that define them, and every layer above, share one translation from below.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, NoReturn

from . import _driver, _lifetimes
from ._driver import LEGACY, in_host_function
from ._resource import ACTIVE
from .errors import (
    CAPTURE_CODES,
    CONTEXT_IS_DESTROYED,
    NOT_PERMITTED,
    STICKY_CODES,
    called_from_host_function,
    error_for,
)

if TYPE_CHECKING:
    from .context import Context
    from .stream import Stream


def refuse_in_host_function(operation: str) -> None:
    """Raise `NotPermittedError` inside a host function, for the entries that read no thread
    state (`_driver.HostFunctionState` covers the others)."""
    if in_host_function and threading.get_ident() in in_host_function:
        raise called_from_host_function(operation)


def refuse_legacy_in_global_capture(stream: Stream, operation: str) -> None:
    """Work queued on the legacy stream while a global-mode capture is active in its context
    would run at once, outside the graph (the driver accepts it beside a non-blocking
    capturing stream): refuse it. Call under ``if _lifetimes.capturing:``."""
    if stream._key in (0, LEGACY):
        _lifetimes.refuse_in_capture(operation, legacy=stream)


def fail(
    backend: _driver.Backend, err, operation: str, ctx: Context | None = None, hint: str = ""
) -> NoReturn:
    """Raise the exception for a failed driver call, poisoning the context (``ctx``, else the
    thread's current one, where the driver reports them) on a sticky fault."""
    code = int(err)
    if code == NOT_PERMITTED:  # the driver refuses CUDA calls from host functions (when it notices)
        refuse_in_host_function(operation)
    status, text = backend.driver.cuGetErrorString(err)
    message = text.decode() if not status and text else ""
    if code in CAPTURE_CODES and _lifetimes.capturing:  # end what the driver invalidated
        where = _lifetimes.capture_failed(operation, code)
        hint = f"{hint}; {where}" if hint else where
    cause, where = None, ""
    if code in STICKY_CODES:
        ctx = ctx or _registered_current(backend)
        if ctx is not None and ctx._state is ACTIVE and backend.sim:
            # the sim says what faulted: a kernel twin that raised, a WHILE node it stopped
            _, cause, where = backend.sim.fault_cause(ctx._handle)
            hint = f"{hint}; {where}" if hint and where else hint or where
    exc = error_for(code, operation, message, hint)
    if where:
        exc.__cause__ = cause  # a twin's exception (None for a stopped WHILE node)
    if code in STICKY_CODES and ctx is not None:
        ctx._poison(exc)
    elif code == CONTEXT_IS_DESTROYED and ctx is not None:
        ctx._mark_destroyed("(the driver reports it destroyed)")
    raise exc


def _registered_current(backend: _driver.Backend) -> Context | None:
    err, handle = backend.driver.cuCtxGetCurrent()
    return None if err else backend.contexts.get(int(handle))


def call(backend: _driver.Backend, operation: str, *args, ctx: Context | None = None):
    """Call a driver function by name; return its results (one value, a tuple, or None)."""
    refuse_in_host_function(operation)
    result = getattr(backend.driver, operation)(*args)
    if result[0]:
        fail(backend, result[0], operation, ctx)
    return result[1] if len(result) == 2 else (result[1:] or None)
