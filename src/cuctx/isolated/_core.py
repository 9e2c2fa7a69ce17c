"""The executor's bookkeeping, shared by both engines: calls, slots, the queue of calls
waiting for a worker, and the rules that hand a call to a slot.

A *slot* is one worker's place (a device and a position); its worker may be replaced many
times. A slot is ``starting`` (no worker ready yet), ``idle``, ``busy`` (running one call),
``closing`` (told to exit at shutdown) or ``closed``. One lock guards all of it; nothing
slow runs under it (sends and kills happen after it is released).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from concurrent.futures import BrokenExecutor, CancelledError, Future
from typing import Any, Callable, NamedTuple

from ..errors import WorkerDiedError, WorkerFaultError
from ._wire import RemoteTraceback


class WorkerInfo(NamedTuple):
    """One worker of an `IsolatedExecutor` (``ex.workers``): its device's ordinal, its
    process id (None while a replacement starts), how many times it was replaced."""

    device: int
    pid: int | None
    replaced: int


class CallFuture(Future):
    """A call's Future. While the call runs, the engine sets ``attend(future, timeout)``
    (`sent`): `result` and `exception` call it first, so that the waiting thread reads the
    worker's answer itself (the process engine's round trip then wakes no other thread). A
    thread that waits for a call not sent yet (no worker was free) waits until it is sent,
    then attends it: a replacement worker's first answer does not wait for the slot's thread,
    which starts the next standby then."""

    def __init__(self) -> None:
        super().__init__()
        self.attend: Callable[[CallFuture, float | None], None] | None = None
        self._awaited = 0  # threads that wait for the call to be sent (under _condition)

    def sent(self, attend: Callable[[CallFuture, float | None], None]) -> None:
        """The engine sent the call: ``attend`` reads its answer."""
        self.attend = attend
        if self._awaited:  # counted before the waiter looked at ``attend``: wake it
            with self._condition:
                self._condition.notify_all()

    def result(self, timeout: float | None = None) -> Any:
        return super().result(self._attended(timeout))

    def exception(self, timeout: float | None = None) -> BaseException | None:
        return super().exception(self._attended(timeout))

    def _attended(self, timeout: float | None) -> float | None:
        """Attend (if the engine says how), then what is left of ``timeout``."""
        attend = self.attend
        if attend is None:
            if self.done():
                return timeout
            deadline = None if timeout is None else time.monotonic() + timeout
            attend = self._until_sent(deadline)
            if attend is None:  # done, or past the timeout
                return None if deadline is None else max(0.0, deadline - time.monotonic())
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        if timeout is None:
            attend(self, None)
            return None
        deadline = time.monotonic() + timeout
        attend(self, timeout)
        return max(0.0, deadline - time.monotonic())

    def _until_sent(self, deadline: float | None):
        """Wait until the call is sent (its ``attend``), done, or ``deadline`` passed."""
        with self._condition:
            self._awaited += 1
            try:
                while self.attend is None and not self.done():
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        return None
                    self._condition.wait(left)
            finally:
                self._awaited -= 1
            return self.attend


class Call:
    """One submitted call: its future, its name for messages, its pickles, where it may run
    and for how long. ``timed_out`` is set (under the core's lock) by the watchdog."""

    __slots__ = (
        "future",
        "name",
        "fn_bytes",
        "args_bytes",
        "arrays",
        "device",
        "timeout",
        "timed_out",
    )

    def __init__(
        self,
        future: CallFuture,
        name: str,
        fn_bytes: bytes,
        args_bytes: bytes,
        arrays: list,
        device: int | None,
        timeout: float | None,
    ) -> None:
        self.future = future
        self.name = name
        self.fn_bytes = fn_bytes
        self.args_bytes = args_bytes
        self.arrays = arrays  # DeviceArrays the call shares with its worker (ipc pools)
        self.device = device  # None: any device of the executor
        self.timeout = timeout
        self.timed_out = False


class Slot:
    __slots__ = ("device", "worker", "pid", "call", "deadline", "replaced", "state", "thread")

    def __init__(self, device: int) -> None:
        self.device = device
        self.worker = None  # the engine's handle of the current worker
        self.pid: int | None = None
        self.call: Call | None = None
        self.deadline: float | None = None  # when the running call times out
        self.replaced = 0
        self.state = "starting"
        self.thread: threading.Thread | None = None


def _run_on(slot: Slot, call: Call) -> None:  # under the core's lock
    slot.call, slot.state = call, "busy"
    slot.deadline = None if call.timeout is None else time.monotonic() + call.timeout


def resolve(call: Call, value=None, error: BaseException | None = None) -> None:
    call.future.attend = None  # nothing more to read for it
    if error is None:
        call.future.set_result(value)
    else:
        call.future.set_exception(error)


def last_line(traceback: str) -> str:
    """The exception a traceback ends with (its last line that is not blank)."""
    lines = [line for line in traceback.splitlines() if line.strip()]
    return lines[-1].strip() if lines else "no error text"


def cancelled(call: Call) -> CancelledError:
    """What a call that was running when Ctrl-C killed its worker raises."""
    return CancelledError(
        f"{call.name} was running when Ctrl-C (KeyboardInterrupt) ended "
        "the executor: its worker was killed"
    )


def fault_error(report: dict, call: Call, device: int, worker: int | None) -> WorkerFaultError:
    """The `WorkerFaultError` of a worker's fault report (`_worker.fault_report`)."""
    error = WorkerFaultError(
        report["code"],
        report["operation"],
        report["message"],
        report["hint"],
        device=device,
        worker=worker,
        call=call.name,
    )
    error.__cause__ = RemoteTraceback(report["traceback"])
    return error


class Core:
    """Slots, the waiting calls and the shutdown state of one executor. The engine calls
    `ready` when a slot's worker can take a call and `finished` when its call is over;
    both return the slot's next call (already marked running), or None."""

    def __init__(self, devices: list[int], workers_per_device: int) -> None:
        self.lock = threading.Lock()
        self.slots = [Slot(d) for d in devices for _ in range(workers_per_device)]
        self.pending: deque[Call] = deque()
        self.shutting_down = False
        self.aborted = False  # Ctrl-C ended the calls: a running call's loss is no fault
        self.broken = ""  # why no worker can start, once one could not
        self.broken_cause = ""  # the worker's traceback, if it told one
        self.all_closed = threading.Event()

    # -- under the lock ---------------------------------------------------------------------

    def _take(self, slot: Slot) -> Call | None:
        """The first waiting call ``slot`` may run, marked running; None if there is none
        (the slot is then idle, or closing at shutdown)."""
        for call in list(self.pending):
            if call.device is None or call.device == slot.device:
                self.pending.remove(call)
                if call.future.set_running_or_notify_cancel():
                    _run_on(slot, call)
                    return call
        slot.call = slot.deadline = None
        slot.state = "closing" if self.shutting_down else "idle"
        return None

    # -- what callers and engines call ------------------------------------------------------

    def submit(self, call: Call) -> Slot | None:
        """Queue ``call``; the slot to send it to now (marked busy), or None: it waits."""
        with self.lock:
            if self.broken:
                error = BrokenExecutor(
                    f"{self.broken}; make a new IsolatedExecutor once that is fixed"
                )
                raise error from (RemoteTraceback(self.broken_cause) if self.broken_cause else None)
            if self.shutting_down:
                raise RuntimeError("cannot schedule new futures after shutdown")
            for slot in self.slots:
                if slot.state == "idle" and call.device in (None, slot.device):
                    call.future.set_running_or_notify_cancel()
                    _run_on(slot, call)
                    return slot
            self.pending.append(call)
            return None

    def ready(self, slot: Slot, worker, pid: int | None) -> Call | None:
        """``slot``'s new worker can take calls."""
        with self.lock:
            slot.worker, slot.pid = worker, pid
            return self._take(slot)

    def finished(self, slot: Slot, expected: Call | None = None) -> tuple[Call | None, Call | None]:
        """``slot``'s call is over: (that call, or None if the watchdog timed it out first,
        or if it is not ``expected``, which another thread finished already; the next call
        for the slot, or None)."""
        with self.lock:
            call = slot.call
            if call is not None and call.timed_out or expected not in (None, call):
                return None, None
            return call, self._take(slot)

    def lost(self, slot: Slot, expected: Call | None = None) -> Call | None:
        """``slot``'s worker is gone: the call it was running (now the engine's to fail), or
        None. The slot starts a new worker unless it was closing. With ``expected``: None,
        and nothing done, if the slot runs another call now (that one was answered)."""
        with self.lock:
            if expected is not None and slot.call is not expected:
                return None
            call, slot.call, slot.deadline = slot.call, None, None
            slot.worker, slot.pid = None, None
            if slot.state != "closing":
                slot.state = "starting"
                slot.replaced += 1
            return call

    def closed(self, slot: Slot) -> bool:
        """``slot`` has no worker any more and never will; True for the last slot to close
        (its thread then releases what the engine holds)."""
        with self.lock:
            slot.state, slot.worker, slot.pid = "closed", None, None
            if all(s.state == "closed" for s in self.slots):
                self.all_closed.set()
                return True
            return False

    def break_(self, why: str, device: int, pid: int | None, cause: str = "") -> list[Slot]:
        """A worker could not start (``why``: its own error in one line; ``cause``: its
        traceback, if it told one): the executor takes no more calls, the waiting ones
        fail. Returns the idle slots, which the engine tells to close."""
        with self.lock:
            if not self.broken:
                self.broken = f"no worker could start on device {device}: {why}"
                self.broken_cause = cause
            self.shutting_down = True
            waiting, self.pending = list(self.pending), deque()
            idle = [s for s in self.slots if s.state == "idle"]
            for slot in idle:
                slot.state = "closing"
        for call in waiting:
            if call.future.set_running_or_notify_cancel():
                error = WorkerDiedError(call.name, device, pid or 0, why, started=False)
                error.__cause__ = RemoteTraceback(cause) if cause else None
                resolve(call, error=error)
        return idle

    def shutdown(self, cancel_futures: bool) -> list[Slot]:
        """Stop taking calls; cancel the waiting ones if asked. Returns the idle slots, which
        the engine tells to close (busy ones close after their last call)."""
        with self.lock:
            self.shutting_down = True
            if cancel_futures:
                for call in self.pending:
                    call.future.cancel()
                self.pending.clear()
            idle = [s for s in self.slots if s.state == "idle"]
            for slot in idle:
                slot.state = "closing"
            return idle

    def abort(self) -> list:
        """Ctrl-C: take no more calls, cancel the waiting ones, close every slot. Returns
        the engine's handles of the live workers, which the engine kills, calls and all."""
        with self.lock:
            self.shutting_down = self.aborted = True
            for call in self.pending:
                call.future.cancel()
            self.pending.clear()
            for slot in self.slots:
                if slot.state != "closed":
                    slot.state = "closing"
            return [s.worker for s in self.slots if s.worker is not None]

    def workers(self) -> list[WorkerInfo]:
        with self.lock:
            return [WorkerInfo(s.device, s.pid, s.replaced) for s in self.slots]


class Watchdog:
    """One thread per executor that ends calls past their timeout: it sleeps until the
    earliest deadline of the running calls, marks those past theirs as timed out and calls
    ``kill(worker)`` for each. Started with the first call that has a timeout."""

    def __init__(self, core: Core, kill: Callable) -> None:
        self._core = core
        self._kill = kill
        self._cond = threading.Condition()  # taken before the core's lock, never after
        self._target: float | None = None  # when the thread wakes next (None: not before
        self._thread: threading.Thread | None = None  # it is notified)
        self._stopped = False

    def watch(self, deadline: float) -> None:
        """A call with this deadline started (its slot's ``deadline`` is set)."""
        with self._cond:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, daemon=True, name="cuctx-isolated-watchdog"
                )
                self._thread.start()
            elif self._target is None or deadline < self._target:
                self._cond.notify()

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        core = self._core
        while True:
            with self._cond:
                if self._stopped:
                    return
                now = time.monotonic()
                expired, later = [], []
                with core.lock:
                    for slot in core.slots:
                        call = slot.call
                        if call is None or slot.deadline is None or call.timed_out:
                            continue
                        if slot.deadline <= now:
                            call.timed_out = True
                            expired.append(slot.worker)
                        else:
                            later.append(slot.deadline)
                self._target = min(later) if later else None
                if not expired:
                    self._cond.wait(None if self._target is None else self._target - now)
            for worker in expired:
                self._kill(worker)
