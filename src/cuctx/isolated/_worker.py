"""The worker's side: a process that runs calls on one device and exits at its first fault.

`Runner` runs one call (the process engine's worker and the Ray actor share it): with the
device's primary context current, then a synchronize of the device, so a fault a kernel
hits asynchronously is seen before the result is reported and the caller finds the call's
device writes complete. A sticky fault anywhere in the process ends the worker: on a GPU no
more CUDA work is possible in it.

`main` is the process engine's worker (started as ``python -c`` by `_process`): it reads
calls from its socket, one at a time, and watches a lifeline pipe so that it ends with the
caller even when a call hangs.
"""

from __future__ import annotations

import os
import pickle
import signal
import socket
import sys
import threading
import traceback
from typing import TYPE_CHECKING, NoReturn

from .._resource import POISONED
from ..context import Context
from ..device import Device
from ..errors import ContextPoisonedError, CudaError, StickyFaultError
from ..memory import DeviceArray, MemoryPool, empty
from . import _wire

if TYPE_CHECKING:
    from ..memory._pool import IpcDescriptor


class Runner:
    """Runs calls with device ``ordinal``'s primary context current. Building one makes the
    context and a first allocation, so the first call does not pay for them."""

    def __init__(self, ordinal: int) -> None:
        self.device = Device(ordinal)
        self.context: Context = self.device.primary_context
        with self.context:
            empty(1)  # the first allocation sets up the device's memory pool
            self.context.synchronize()
        self.functions = _wire.FunctionCache()
        self._contexts = self.device._backend.contexts  # every Context of this process

    def run(self, message: memoryview) -> tuple[bytes, bytes]:
        """Run the call in ``message``; (RESULT, outcome), (FAULT, report) or (ENDING, how
        the worker must end) when ``fn`` raised SystemExit or KeyboardInterrupt."""
        fn_bytes, args_bytes = _wire.split_call(message)
        with self.context:  # arguments are rebuilt here: shared arrays are imported into it
            try:
                fn = self.functions.get(fn_bytes)
                args, kwargs = pickle.loads(args_bytes)
            except Exception as exc:  # noqa: BLE001 - the call's error, the worker is fine
                return _wire.RESULT, _wire.raised(exc)
            value = error = None
            try:
                value = fn(*args, **kwargs)
            except (SystemExit, KeyboardInterrupt) as exc:
                return _wire.ENDING, pickle.dumps(ending(exc))
            except BaseException as exc:  # noqa: BLE001 - sent to the caller
                error = exc
            try:  # asynchronous faults surface here
                self._synchronize()
            except Exception as exc:  # noqa: BLE001 - sent to the caller
                if error is None or sticky(exc) is not None:
                    error = exc
            # Only now: the call's shared arrays are freed (unmapped) on the stream they were
            # imported on, which is not ordered after the streams the call made. Dropped
            # before the synchronize, a copy still queued on one of them could read memory
            # already unmapped (CUDA_ERROR_LAUNCH_FAILED on a GPU, now and then).
            del args, kwargs
        fault = sticky(error) if error is not None else None
        if fault is None:
            fault = self._poisoned()
        if fault is not None:
            return _wire.FAULT, fault_report(fault, error)
        try:
            return _wire.RESULT, (
                _wire.returned(value, fn) if error is None else _wire.raised(error)
            )
        finally:
            # Before the answer goes: the call's views of shared arrays die here, not at a
            # later garbage collection (an exception's traceback holds this frame).
            value = error = None

    def _synchronize(self) -> None:
        if len(self._contexts) == 1:  # the usual case: only the primary context is alive
            self.context.synchronize()
        else:  # contexts the call made (or keeps) on the device too
            self.device.synchronize()

    def _poisoned(self) -> CudaError | None:
        """The fault of any poisoned context of this process: a call that catches its
        fault and returns leaves the process just as unusable."""
        if len(self._contexts) == 1:
            return self.context.fault
        for ctx in list(self._contexts.values()):
            if ctx._state is POISONED:
                return ctx.fault
        return None


def ending(exc: SystemExit | KeyboardInterrupt) -> tuple[int, str]:
    """How ``fn`` raising ``exc`` ends its worker, as it would end a Python program: (the
    exit status, or minus the signal, and that in words). SystemExit's message, if it has
    one, goes to stderr as Python prints it."""
    if isinstance(exc, KeyboardInterrupt):
        return -signal.SIGINT, "signal SIGINT"
    code = exc.code
    if code is None:
        code = 0
    elif isinstance(code, bool) or not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    code &= 0xFF  # what the parent sees, as for any exit status
    return code, f"exit status {code}"


def end(status: int) -> NoReturn:
    """End this process with ``status`` (minus a signal: by that signal), at once."""
    sys.stdout.flush()
    sys.stderr.flush()
    if status < 0:
        signal.signal(-status, signal.SIG_DFL)
        signal.raise_signal(-status)
    os._exit(status & 0xFF)


def sticky(exc: BaseException) -> CudaError | None:
    """The sticky fault behind ``exc`` (itself, its cause or context), if any."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, ContextPoisonedError):
            return exc.fault
        if isinstance(exc, StickyFaultError):
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


def fault_report(fault: CudaError, error: BaseException | None) -> bytes:
    """What the caller needs to raise `WorkerFaultError`: the fault's fields, and the
    traceback where the call met it."""
    shown = error if error is not None else fault
    text = "".join(traceback.format_exception(shown))
    return pickle.dumps(
        {
            "code": fault.code,
            "operation": fault.operation,
            "message": fault.message,
            "hint": fault.hint,
            "traceback": text,
        }
    )


# The caller's ipc pools, by key, imported once and kept for the worker's life (an import
# that failed is kept as its exception, raised by the calls that use the pool).
_pools: dict[str, MemoryPool | Exception] = {}


def _import_pool(key: str, device: int, fd: int) -> None:
    try:
        _pools[key] = MemoryPool._import(device, fd, key)
    except Exception as exc:  # noqa: BLE001 - the calls that use it say so
        _pools[key] = exc
    finally:
        os.close(fd)  # the pool keeps what it needs


def shared_array(desc: IpcDescriptor) -> DeviceArray:
    """A caller's array of an ipc pool, in this worker: the same memory, mapped for the
    call (freed when the call's last view of it goes, before its answer is sent)."""
    pool = _pools.get(desc.key)
    if pool is None:
        raise RuntimeError(f"the caller could not send its pool {desc.key} to this worker")
    if isinstance(pool, Exception):
        raise RuntimeError(
            f"the worker could not import the caller's pool {desc.key}: {pool}"
        ) from pool
    return pool._import_array(desc)


def _watch_lifeline(fd: int) -> None:
    # Reads return only at EOF: the caller closed its end, or died. A hung call cannot
    # keep the worker alive after that.
    while os.read(fd, 1):
        pass
    os._exit(0)


GRACE_S = 0.001  # how long an answer may wait for a caller that reads it itself
EAGER_UNTIL = 8


def _read_soon(channel: _wire.Channel, attended: memoryview, number: int) -> bool:
    """Whether a caller reads answer ``number`` itself, though it had not said so when the
    answer went: it says so within GRACE_S, or the next message comes (sent only once the
    answer was read). A caller descheduled between its send and its word would otherwise
    cost the slot's thread a wakeup, and that thread's GIL the next call's caller."""
    return channel.wait(GRACE_S) or attended[0] == number


def main(fd: int, lifeline: int, ordinal: int, ring: int, word: int) -> None:
    """The process engine's worker: setup, READY, then calls until EXIT or EOF (``ordinal``
    is the setup's device too, for `_spawn._BOOT`'s early context). ``ring``:
    the bell of its slot's thread; ``word``: the number of the call whose answer a caller
    reads itself (no ring for it; _wire's protocol)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the caller's to handle
    threading.Thread(target=_watch_lifeline, args=(lifeline,), daemon=True).start()
    channel = _wire.Channel(socket.socket(fileno=fd), takes_fds=True)
    _, attended = _wire.map_word(word)
    os.close(word)
    try:
        tag, message = channel.recv()
        setup = pickle.loads(message)
        sys.path[:] = setup["path"]  # what the caller can import, the worker can
        runner = Runner(setup["device"])
        for key, device in setup["pools"]:  # the caller's ipc pools, each with its descriptor
            _import_pool(key, device, channel.recv_fd())
        try:  # what a function sent by value needs (a standby's first call pays nothing)
            import cloudpickle  # noqa: F401
        except ImportError:
            pass
    except EOFError:
        return
    except BaseException:  # noqa: BLE001 - told to the caller, which gives up on this device
        channel.send(_wire.FAILED, traceback.format_exc().encode())
        return
    channel.send(_wire.READY)
    # eager: ring at once, for callers that read few answers themselves; left once they
    # read EAGER_UNTIL answers in a row themselves.
    number, eager, read = 0, True, 0
    while True:
        try:
            channel.wait(None)  # (looks a moment before it sleeps: the next call may be near)
            tag, message = channel.recv()
        except EOFError:
            return
        if tag == _wire.EXIT:
            return
        if tag == _wire.POOL:
            _import_pool(*pickle.loads(message), channel.recv_fd())
            continue
        if number and attended[0] == number:  # a caller read the last answer itself
            read += 1
            eager = eager and read < EAGER_UNTIL
        else:
            read = 0
        number = _wire.next_number(number)
        tag, outcome = runner.run(message)
        if tag == _wire.ENDING:  # the caller learns how when it reaps this process
            end(pickle.loads(outcome)[0])
        channel.send(tag, outcome)
        # After the send: a caller that stops waiting clears the word, then looks (a ring
        # of its own); read before that, the word saw an answer already there.
        if tag != _wire.RESULT:
            _wire.ring(ring)
        elif attended[0] != number and (eager or not _read_soon(channel, attended, number)):
            _wire.ring(ring)
            eager = True
        if tag == _wire.FAULT:
            end(1)  # at once: nothing more can run in this process's contexts
