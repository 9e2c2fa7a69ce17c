"""The CudaError family.

Every failure of a driver call becomes a `CudaError` that carries the driver's numeric code,
its name, the driver's message and the operation that failed, whichever backend produced
it. Subclasses exist for the cases users catch; they also derive from the matching Python
builtin (``InvalidValueError`` is a ``ValueError``) so generic handlers keep working.
"""

from __future__ import annotations

from functools import partial
from typing import Callable

from cuda.bindings.driver import CUresult

# The faults after which the driver refuses all further work in the context (the CUDA
# programming guide's "sticky" errors): illegal address (700), launch timeout (702), assert
# (710), hardware stack error (714), illegal instruction (715), misaligned address (716),
# invalid address space (717), invalid PC (718), launch failed (719). Cooperative launch too
# large (720) is not sticky.
STICKY_CODES = frozenset({700, 702, 710, 714, 715, 716, 717, 718, 719})

# The result codes cuctx tests for, named once (CUresult values as plain ints, to compare
# with ``int(err)``).
INVALID_VALUE = int(CUresult.CUDA_ERROR_INVALID_VALUE)  # 1
OUT_OF_MEMORY = int(CUresult.CUDA_ERROR_OUT_OF_MEMORY)  # 2
INVALID_DEVICE = int(CUresult.CUDA_ERROR_INVALID_DEVICE)  # 101
INVALID_CONTEXT = int(CUresult.CUDA_ERROR_INVALID_CONTEXT)  # 201
PEER_ACCESS_UNSUPPORTED = int(CUresult.CUDA_ERROR_PEER_ACCESS_UNSUPPORTED)  # 217
NOT_FOUND = int(CUresult.CUDA_ERROR_NOT_FOUND)  # 500
NOT_READY = int(CUresult.CUDA_ERROR_NOT_READY)  # 600
PEER_ACCESS_ALREADY_ENABLED = int(CUresult.CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED)  # 704
PEER_ACCESS_NOT_ENABLED = int(CUresult.CUDA_ERROR_PEER_ACCESS_NOT_ENABLED)  # 705
CONTEXT_IS_DESTROYED = int(CUresult.CUDA_ERROR_CONTEXT_IS_DESTROYED)  # 709
HOST_MEMORY_ALREADY_REGISTERED = int(CUresult.CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED)  # 712
NOT_PERMITTED = int(CUresult.CUDA_ERROR_NOT_PERMITTED)  # 800
NOT_SUPPORTED = int(CUresult.CUDA_ERROR_NOT_SUPPORTED)  # 801
# Stream capture (900-908): an operation a capture cannot hold (900), a capture already
# broken (901), a merge of unrelated captures (902), an unmatched or unjoined fork (903, 904),
# a dependency across a capture's boundary (905), the legacy stream's implicit dependency
# (906), a query of an event recorded in a capture (907), another thread's capture in
# thread-local mode (908). 910: the graph exec update's refusal.
CAPTURE_UNSUPPORTED = int(CUresult.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)  # 900
CAPTURE_CODES = frozenset(range(900, 909))  # 909 is CUDA_ERROR_TIMEOUT
GRAPH_EXEC_UPDATE_FAILURE = int(CUresult.CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE)  # 910


def error_name(code: int) -> str:
    try:
        return CUresult(code).name
    except ValueError:
        return f"CUDA_ERROR_{code}"


class CudaError(RuntimeError):
    """A CUDA driver call failed.

    ``code`` is the driver's CUresult value, ``name`` its symbolic name, ``message`` the
    driver's description and ``operation`` the call (or cuctx operation) that failed.
    """

    def __init__(self, code: int, operation: str, message: str = "", hint: str = ""):
        self.code = int(code)
        self.name = error_name(self.code)
        self.message = message
        self.operation = operation
        self.hint = hint
        super().__init__(str(self))

    @property
    def sticky(self) -> bool:
        """True for faults that leave the context unusable."""
        return self.code in STICKY_CODES

    def __str__(self) -> str:
        text = f"{self.operation} failed: {self.name} ({self.code})"
        if self.message:
            text += f": {self.message}"
        if self.hint:
            text += f"; {self.hint}"
        return text

    def __reduce__(self):
        return (type(self), (self.code, self.operation, self.message, self.hint))


class InvalidValueError(CudaError, ValueError):
    """The driver rejected an argument (CUDA_ERROR_INVALID_VALUE)."""


class OutOfMemoryError(CudaError, MemoryError):
    """An allocation did not fit (CUDA_ERROR_OUT_OF_MEMORY)."""


class NotSupportedError(CudaError):
    """The device or driver does not support the operation (CUDA_ERROR_NOT_SUPPORTED)."""


class InvalidDeviceError(CudaError, ValueError):
    """No device has that ordinal (CUDA_ERROR_INVALID_DEVICE)."""


class InvalidContextError(CudaError):
    """No usable context for the call: none current, or the stack is empty."""


class ContextDestroyedError(CudaError):
    """The context, or the context an object belongs to, was destroyed or reset."""

    def __init__(
        self,
        code: int = CONTEXT_IS_DESTROYED,
        operation: str = "",
        message: str = "",
        hint: str = "",
    ):
        super().__init__(code, operation, message or "context is destroyed", hint)


class StickyFaultError(CudaError):
    """A sticky fault (illegal address, trap, assert, ...): the context is now poisoned."""


class ContextPoisonedError(CudaError):
    """The context saw a sticky fault earlier; it refuses all further work.

    ``fault`` is the original `StickyFaultError`. Destroy the context (or reset the device
    for a primary context) and start again; other contexts are not affected by cuctx.
    """

    def __init__(self, fault: CudaError, operation: str):
        self.fault = fault
        super().__init__(
            fault.code,
            operation,
            fault.message,
            f"the context was poisoned by an earlier {fault.name} in {fault.operation}; "
            "destroy it (or reset the device) and create a new one",
        )

    def __reduce__(self):
        return (type(self), (self.fault, self.operation))


def _worker_words(call: str, device: int, worker: int) -> str:
    return f"{call} in the worker process {worker} on device {device}"


class WorkerFaultError(StickyFaultError):
    """A call run by `cuctx.IsolatedExecutor` hit a sticky fault (illegal address, trap,
    assert, ...): its worker process reported it and exited, and a new worker takes its place.

    ``code``, ``name``, ``message`` and ``operation`` are the fault's, as the worker saw it;
    ``device`` is the device's ordinal, ``worker`` the process id of the worker that died,
    ``call`` the function that was running. The worker's traceback is the ``__cause__``.
    Memory the worker could reach may hold partial writes (docs/isolation.md says which)."""

    def __init__(
        self,
        code: int,
        operation: str,
        message: str = "",
        hint: str = "",
        *,
        device: int = -1,
        worker: int = 0,
        call: str = "",
    ):
        self.device = device
        self.worker = worker
        self.call = call
        where = (
            f"raised by {_worker_words(call, device, worker)}, which exited; a new "
            "worker takes its place and the call was not retried"
        )
        self._fault_hint = hint  # the fault's own, as __reduce__ gives it back
        super().__init__(code, operation, message, f"{hint}; {where}" if hint else where)

    def __reduce__(self):
        return (
            partial(type(self), device=self.device, worker=self.worker, call=self.call),
            (self.code, self.operation, self.message, self._fault_hint),
        )


class WorkerTimeoutError(TimeoutError):
    """A call run by `cuctx.IsolatedExecutor` ran past its timeout: its worker process was
    killed (a hung kernel cannot be stopped otherwise) and a new one takes its place.
    ``device``, ``worker`` (the killed process's id), ``call`` and ``timeout`` (seconds)
    say which."""

    def __init__(self, call: str, device: int, worker: int, timeout: float):
        self.call, self.device, self.worker, self.timeout = call, device, worker, timeout
        super().__init__(
            f"{_worker_words(call, device, worker)} ran past its timeout of {timeout:g} s: the "
            "worker was killed and a new one takes its place; the call was not retried"
        )

    def __reduce__(self):
        return (type(self), (self.call, self.device, self.worker, self.timeout))


class WorkerDiedError(RuntimeError):
    """The worker process of `cuctx.IsolatedExecutor` running a call died of something other
    than a CUDA fault or a timeout: a signal, ``os._exit``, ``sys.exit``, the out-of-memory
    killer. A new worker takes its place. ``device``, ``worker`` (the process id), ``call``
    and ``how`` (``"exit status 3"``, ``"signal SIGKILL"``, ...) say which and how.

    ``started`` is False for a call that waited for a worker that could not start (a broken
    environment): ``how`` is the worker's own error, its traceback the ``__cause__``, and
    the executor takes no more calls."""

    def __init__(self, call: str, device: int, worker: int, how: str, started: bool = True):
        self.call, self.device, self.worker, self.how = call, device, worker, how
        self.started = started
        if started:
            text = (
                f"{_worker_words(call, device, worker)} died ({how}): a new worker takes "
                "its place; the call was not retried"
            )
        else:
            text = (
                f"{call} did not run: the worker process {worker} on device {device} could "
                f"not start ({how}), so the executor is broken; fix what the workers "
                "inherit (the environment, sys.path) and make a new IsolatedExecutor"
            )
        super().__init__(text)

    def __reduce__(self):
        return (type(self), (self.call, self.device, self.worker, self.how, self.started))


class HostFunctionError(RuntimeError):
    """Host functions launched on a stream raised. ``failures`` lists ``(fn, exception)``;
    the first exception is also the ``__cause__``."""

    def __init__(self, where: str, failures: list[tuple[Callable, BaseException]]):
        self.failures = failures
        parts = "; ".join(
            f"{getattr(fn, '__qualname__', repr(fn))} raised {exc!r}" for fn, exc in failures
        )
        super().__init__(f"{len(failures)} host function(s) launched on {where} failed: {parts}")


class NotPermittedError(CudaError):
    """The operation is not permitted where it was called (CUDA_ERROR_NOT_PERMITTED), for
    example any cuctx call made from inside a host function (`Stream.launch_host_func`)."""


HOST_FUNCTION_HINT = (
    "it was called from inside a host function (Stream.launch_host_func), and host functions "
    "must not call CUDA (the driver may refuse or deadlock). Do the CUDA work on the stream "
    "before or after the host function from the thread that launched it, or hand the data to "
    "another thread (e.g. through a queue.Queue) that makes the call"
)


def called_from_host_function(operation: str) -> NotPermittedError:
    """The error for a cuctx call made from inside a host function."""
    return NotPermittedError(
        NOT_PERMITTED, operation, "operation not permitted", HOST_FUNCTION_HINT
    )


class GraphCaptureError(CudaError):
    """A call broke a stream capture (a synchronize, a query, a pageable copy, the legacy
    stream in global mode, ...). The message names the call and the user's line; the
    capture has been ended and the stream is usable again."""


class GraphUpdateError(CudaError):
    """An executable graph refused an update (`GraphExec.update`, `GraphExec.update_node`):
    the message names the node (and the line that made it) and the driver's reason in
    words. The executable is unchanged and can still be launched."""


class BackendUnavailableError(RuntimeError):
    """The backend asked for (CUCTX_BACKEND or set_backend) cannot run on this machine."""


class RaceError(RuntimeError):
    """`cuctx.racecheck` found two operations on the same bytes that nothing orders (or a
    use after free). ``findings`` lists them (`cuctx.tools.Finding`: kind, array, both
    operations with their streams and lines, the missing edge, the fix); the message says
    it all in words. The operation that raised it was enqueued."""

    def __init__(self, findings: list) -> None:
        self.findings = findings
        super().__init__("\n\n".join(str(f) for f in findings))


class RaceWarning(RuntimeWarning):
    """What `cuctx.racecheck(mode="warn")` warns with: one finding, in words."""


_CLASS_FOR_CODE: dict[int, type[CudaError]] = {
    INVALID_VALUE: InvalidValueError,
    OUT_OF_MEMORY: OutOfMemoryError,
    INVALID_DEVICE: InvalidDeviceError,
    INVALID_CONTEXT: InvalidContextError,
    PEER_ACCESS_UNSUPPORTED: NotSupportedError,
    CONTEXT_IS_DESTROYED: ContextDestroyedError,
    NOT_PERMITTED: NotPermittedError,
    NOT_SUPPORTED: NotSupportedError,
    GRAPH_EXEC_UPDATE_FAILURE: GraphUpdateError,
    **{code: GraphCaptureError for code in CAPTURE_CODES},
    **{code: StickyFaultError for code in STICKY_CODES},
}


def error_for(code: int, operation: str, message: str = "", hint: str = "") -> CudaError:
    """The exception of the right class for a driver result code."""
    return _CLASS_FOR_CODE.get(int(code), CudaError)(int(code), operation, message, hint)
