"""The process engine: one worker process per slot, on this machine.

Workers (`_spawn.ProcessWorker`) each have one end of a Unix socket pair and the read end
of the executor's lifeline pipe. A thread per slot owns its worker: it starts it (or takes
the device's warm standby), reads what it sends, and replaces it when it dies. Calls are
sent by whichever thread hands them out (the caller's, in `submit`, when a worker is idle),
and a caller waiting in ``future.result()`` reads its answer itself (`_attend`), so a round
trip wakes no thread of the caller: the slot's thread reads what no caller waits for, and
every loss. That thread sleeps on a pipe the worker rings only for answers no caller said
it reads (`_wire`'s "who reads an answer"), not on the socket's data, which would wake it
for every answer too.
"""

from __future__ import annotations

import functools
import os
import pickle
import threading
import time

from .. import _driver
from ..errors import WorkerDiedError, WorkerTimeoutError
from ..memory import DeviceArray
from . import _wire, _worker
from ._core import Call, CallFuture, Core, Slot, Watchdog, cancelled, fault_error, resolve
from ._spawn import EXIT_GRACE_S, ProcessWorker, StartFailed, worker_env


class ProcessEngine:
    def __init__(self, core: Core, standby: bool) -> None:
        self.core = core
        self._backend = _driver.active()  # the one the workers run (`worker_env`)
        self._env = worker_env()
        self._lifeline_r, self._lifeline_w = os.pipe()  # workers read; EOF when we are gone
        self._lock = threading.Lock()
        self._standby = standby
        self._standbys: dict[int, ProcessWorker] = {}
        self._closing = False
        self.watchdog = Watchdog(core, ProcessWorker.kill)
        if standby:
            for device in sorted({s.device for s in core.slots}):
                self._standbys[device] = self._spawn(device)
        for slot in core.slots:
            slot.thread = threading.Thread(
                target=self._serve,
                args=(slot,),
                daemon=True,
                name=f"cuctx-isolated-device-{slot.device}",
            )
            slot.thread.start()

    def _spawn(self, device: int) -> ProcessWorker:
        return ProcessWorker(device, self._lifeline_r, self._env, self._backend)

    # -- handing out calls ------------------------------------------------------------------

    def reductions(self, arrays: list) -> dict:
        """How a call's arguments pickle DeviceArrays: arrays of an ``ipc=True`` pool as their
        IPC descriptors (collected in ``arrays``); any other is refused."""

        def share(array: DeviceArray) -> tuple:
            try:
                desc = array._ipc_descriptor()
            except TypeError as exc:
                raise TypeError(
                    f"{exc}; or pass array.to_host() to send its contents by value"
                ) from None
            arrays.append((array, desc.key))
            return _worker.shared_array, (desc,)

        return {DeviceArray: share}

    def dispatch(self, slot: Slot, call: Call) -> None:
        """Send ``call`` to ``slot``'s worker (the core marked it busy with it), after the
        pools of its shared arrays that the worker does not have yet."""
        worker = slot.worker
        for array, key in call.arrays:
            if key not in worker.pools:
                try:
                    shared = array.pool._share()
                except Exception:  # noqa: BLE001 - the worker's import says it has no pool
                    continue
                with shared:
                    worker.send_pool(shared.key, shared.device, shared.fd)
                worker.pools.add(key)
        worker.calls = number = _wire.next_number(worker.calls)
        call.future.sent(functools.partial(self._attend, slot, worker, number))
        worker.send_call(call.fn_bytes, call.args_bytes)
        deadline = slot.deadline
        if deadline is not None:
            self.watchdog.watch(deadline)

    def _attend(
        self,
        slot: Slot,
        worker: ProcessWorker,
        number: int,
        future: CallFuture,
        timeout: float | None,
    ) -> None:
        """A caller waits for ``future`` (call ``number`` of ``worker``): read the worker's
        answer in its thread (or until ``timeout`` passed), having told the worker so, so
        that the slot's thread is not woken for it. A message that is not a result, or the
        end of the socket, is left to the slot's thread, which replaces the worker."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            if not worker.reader.acquire(timeout=-1 if left is None else max(left, 0)):
                return
            done, told = None, False
            try:
                # A result once taken, by either thread, clears its future's ``attend``.
                if future.attend is None or worker.stash is not None or worker.closed:
                    return
                worker.number[0], told = number, True  # the worker need not ring for it
                if not worker.channel.wait(left):
                    return
                try:
                    tag, message = worker.channel.recv()
                except (EOFError, OSError):
                    return  # the end stays there for the slot's thread to read
                except BaseException:  # Ctrl-C within a message: the next cannot be found
                    worker.stash = (None, None)
                    worker.kill()
                    raise
                if tag != _wire.RESULT:
                    worker.stash = (tag, message)
                    return
                done = self._answered(slot)
            finally:
                if told and done is None:
                    worker.hand_back()  # not read here: the slot's thread is to see it
                worker.reader.release()
            self._deliver(slot, worker, *done, message)

    def _answered(self, slot: Slot) -> tuple[Call | None, Call | None]:
        """Under the worker's reader lock, as its result was read: (the call, or None if it
        timed out; the slot's next call)."""
        call, following = self.core.finished(slot)
        if call is not None:
            call.future.attend = None  # a caller about to attend it must not wait to read
        return call, following

    def _deliver(
        self,
        slot: Slot,
        worker: ProcessWorker,
        call: Call | None,
        following: Call | None,
        message: memoryview,
    ) -> None:
        """Outside the reader lock (a done-callback may wait for another call): send the
        slot's next call, resolve this one."""
        if call is None:
            return  # it timed out: the watchdog is killing the worker
        self._next(slot, worker, following)
        resolve(call, *_wire.outcome(message))

    # -- a slot's thread --------------------------------------------------------------------

    def _serve(self, slot: Slot) -> None:
        # A faulted worker is reaped once its replacement was sent its first call: its exit
        # (a GPU context's teardown) takes time. Unless that call shared arrays, which the
        # faulted one may map till it has exited: the caller may free them once it has the
        # next call's answer, and the driver wants importers gone first.
        faulted: tuple[ProcessWorker, Call | None] | None = None
        first = True  # the slot's first worker starts beside the standby, not from it
        try:
            while True:
                worker, first = self._start(slot, standby=not first), False
                if faulted is not None and (
                    worker is None or faulted[1] is not None and faulted[1].arrays
                ):
                    faulted[0].retire()
                    faulted = None
                if worker is not None:
                    self._next(slot, worker, self.core.ready(slot, worker, worker.pid))
                if faulted is not None:
                    faulted[0].retire()
                    faulted = None
                if worker is None:
                    return
                self._refill(slot.device)
                go_on, faulted = self._run(slot, worker)
                if not go_on:
                    return
        finally:
            if faulted is not None:
                faulted[0].retire()
            if self.core.closed(slot):
                self._release()

    def _refill(self, device: int) -> None:
        """With ``standby``: a new standby for ``device`` if it has none (its last took a
        slot's place), started after that slot's next call was sent."""
        if not self._standby:
            return
        with self._lock:
            if self._closing or device in self._standbys:
                return
            try:
                self._standbys[device] = self._spawn(device)
            except OSError:  # no standby for now; the next loss starts one cold
                pass

    def _start(self, slot: Slot, standby: bool = True) -> ProcessWorker | None:
        """A ready worker for ``slot``: the device's standby if there is a live one (and
        ``standby``), else a new process. None if a worker cannot start (the executor is
        then broken)."""
        with self._lock:
            worker = self._standbys.pop(slot.device, None) if standby else None
        if worker is not None:
            try:
                worker.wait_ready()
                return worker
            except StartFailed:
                pass  # a standby that died waiting: start one cold instead
        if self.core.broken:
            return None
        try:
            worker = self._spawn(slot.device)
        except OSError as exc:  # too many processes or descriptors, say
            return self._break(slot, StartFailed(str(exc)), None)
        try:
            worker.wait_ready()
            return worker
        except StartFailed as exc:
            return self._break(slot, exc, worker.pid)

    def _break(self, slot: Slot, failed: StartFailed, pid: int | None) -> None:
        for idle in self.core.break_(failed.why, slot.device, pid, failed.traceback):
            idle.worker.send(_wire.EXIT)

    def _next(self, slot: Slot, worker: ProcessWorker, call: Call | None) -> None:
        if call is not None:
            self.dispatch(slot, call)
        elif slot.state == "closing":
            worker.send(_wire.EXIT)

    def _run(
        self, slot: Slot, worker: ProcessWorker
    ) -> tuple[bool, tuple[ProcessWorker, Call | None] | None]:
        """Serve calls until the worker ends: (whether the slot needs a new worker; after a
        fault, the worker and its call, for `_serve` to retire; after a death, None: the
        worker is reaped already, as how it died is in the call's error)."""
        core = self.core
        while True:
            if worker.watch():  # then read, unless a waiting caller reads it
                continue
            with worker.reader:
                taken = worker.take()
                if taken is None:
                    continue
                tag, message = taken
                if tag == _wire.RESULT:
                    done = self._answered(slot)
            if tag == _wire.RESULT:
                self._deliver(slot, worker, *done, message)
                # Not kept while waiting for the next message: a finished call's arrays
                # are the caller's to free.
                taken = message = done = None
                continue
            call = core.lost(slot)
            if tag == _wire.FAULT:
                if call is not None:
                    resolve(
                        call,
                        error=fault_error(pickle.loads(message), call, slot.device, worker.pid),
                    )
                faulted = (worker, call)
            else:
                # Its end of the socket closes before the process has quite exited: a kill
                # now would hide how it ended (sys.exit(4) in a call: "exit status 4").
                how = worker.retire(grace=EXIT_GRACE_S)
                if call is not None:
                    resolve(
                        call,
                        error=cancelled(call)
                        if core.aborted
                        else _death_error(call, slot, worker, how),
                    )
                faulted = None
            if slot.state == "closing":
                if faulted is not None:
                    worker.retire()
                return False, None
            return True, faulted

    def _release(self) -> None:
        """The last slot closed: end the standbys, the watchdog and the lifeline."""
        self._retire_standbys()
        self.watchdog.stop()
        os.close(self._lifeline_w)
        os.close(self._lifeline_r)

    def _retire_standbys(self) -> None:
        with self._lock:
            self._closing = True
            standbys, self._standbys = list(self._standbys.values()), {}
        for worker in standbys:
            worker.retire()

    # -- shutdown ---------------------------------------------------------------------------

    def abort(self, wait: bool) -> None:
        """Ctrl-C: kill every worker now, in the middle of its call or not."""
        self._retire_standbys()
        workers = self.core.abort()
        for worker in workers:
            worker.kill()
        for worker in workers:  # none is left a zombie, whether its slot's thread runs on
            worker.reap()
        if wait:
            for slot in self.core.slots:
                slot.thread.join()

    def shutdown(self, wait: bool, cancel_futures: bool) -> None:
        self._retire_standbys()
        for slot in self.core.shutdown(cancel_futures):
            slot.worker.send(_wire.EXIT)
        if wait:
            for slot in self.core.slots:
                slot.thread.join()


def _death_error(call: Call, slot: Slot, worker: ProcessWorker, how: str) -> BaseException:
    if call.timed_out:
        return WorkerTimeoutError(call.name, slot.device, worker.pid, call.timeout)
    return WorkerDiedError(call.name, slot.device, worker.pid, how)
