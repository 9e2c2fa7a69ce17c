"""The process engine: one worker process per slot, on this machine.

Workers are fresh interpreters (``python -c``, started by subprocess: no fork of a process
that holds CUDA state), each with one end of a Unix socket pair and the read end of the
executor's lifeline pipe. A thread per slot owns its worker: it starts it (or takes the
device's warm standby), reads every message it sends, and replaces it when it dies. Calls
are sent by whichever thread hands them out (the caller's, in `submit`, when a worker is
idle), so a round trip wakes no thread of the caller but the one that reads the result.
"""

from __future__ import annotations

import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

from .. import _driver
from ..errors import WorkerDiedError, WorkerTimeoutError
from ..memory import DeviceArray
from . import _wire, _worker
from ._core import (Call, Core, Slot, Watchdog, cancelled, fault_error, last_line,
                    resolve)

# The cuctx the caller runs is the one its workers import. On a GPU the worker starts
# making its device's primary context in a thread (cuda.bindings releases the GIL in driver
# calls) while the main thread imports cuctx: a start costs the longer of the two, not
# their sum. That retain is never released: it lasts as long as the worker.
_SOURCE = str(Path(__file__).resolve().parents[2])
_BOOT = f"""
import os, sys, threading
def warm(ordinal):
    from cuda.bindings import driver
    if not driver.cuInit(0)[0]:
        err, device = driver.cuDeviceGet(ordinal)
        if not err:
            driver.cuDevicePrimaryCtxRetain(device)
if os.environ.get("CUCTX_BACKEND") == "cuda":
    threading.Thread(target=warm, args=(int(sys.argv[3]),), daemon=True).start()
sys.path.insert(0, {_SOURCE!r})
try:
    from cuctx.isolated._worker import main
except BaseException:
    # Told to the caller as the worker's FAILED message (framed as _wire.Channel frames
    # it), so that the error the caller raises carries it, not only this process's stderr.
    import struct, traceback
    text = traceback.format_exc().encode()
    os.write(int(sys.argv[1]), struct.pack({_wire.HEADER.format!r}, {_wire.FAILED!r},
                                           len(text)) + text)
    raise
main(int(sys.argv[1]), int(sys.argv[2]))
"""


_EXIT_GRACE_S = 2.0  # how long a worker that closed its socket has to exit by itself


class _StartFailed(Exception):
    """A worker could not start: its error in one line, and its traceback if it sent one."""

    def __init__(self, why: str, traceback: str = "") -> None:
        super().__init__(why)
        self.why, self.traceback = why, traceback



class ProcessWorker:
    """One worker process: its Popen and the caller's end of its socket."""

    __slots__ = ("device", "proc", "channel", "pools")

    def __init__(self, device: int, lifeline: int, env: dict[str, str]) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            fds = (theirs.fileno(), lifeline)
            self.proc = subprocess.Popen(
                [sys.executable, "-c", _BOOT, *map(str, fds), str(device)], pass_fds=fds,
                env=env,
                stdin=subprocess.DEVNULL)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self.device = device
        self.pools: set[str] = set()  # keys of the ipc pools the worker has
        self.channel = _wire.Channel(ours)
        # Sent at once: the worker reads it once its imports are done.
        self.channel.send(_wire.SETUP, pickle.dumps({"path": sys.path, "device": device}))

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_ready(self) -> None:
        """Return once the worker is ready; `_StartFailed` with its own error if it cannot
        start (an import that fails, say), or how it ended if it said nothing."""
        try:
            tag, message = self.channel.recv()
        except (EOFError, OSError):
            raise _StartFailed(f"it exited before saying why ({self.retire(_EXIT_GRACE_S)}; "
                               "its stderr may say more)") from None
        if tag != _wire.READY:
            text = bytes(message).decode(errors="replace")
            self.retire(_EXIT_GRACE_S)
            raise _StartFailed(last_line(text), text)

    def send(self, tag: bytes, *parts: bytes) -> None:
        """Send, or nothing if the worker is gone (its slot's thread sees the end of the
        socket and says why)."""
        try:
            self.channel.send(tag, *parts)
        except OSError:
            pass

    def send_pool(self, key: str, device: int, fd: int) -> None:
        """An ipc pool for the worker to import: its key, then its descriptor beside."""
        try:
            self.channel.send(_wire.POOL, pickle.dumps((key, device)))
            self.channel.send_fd(fd)
        except OSError:
            pass

    def kill(self) -> None:
        self.proc.kill()  # a no-op once it was reaped

    def reap(self) -> str:
        """Wait for the process to end (it is not left a zombie); how it ended, in words."""
        code = self.proc.wait()
        if code < 0:
            try:
                return f"signal {signal.Signals(-code).name}"
            except ValueError:
                return f"signal {-code}"
        return f"exit status {code}"

    def retire(self, grace: float = 0.0) -> str:
        """Kill (after ``grace`` seconds for it to end by itself), reap, close: nothing of
        this worker is left."""
        if grace:
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                pass
        self.kill()
        how = self.reap()
        self.channel.close()
        return how


def worker_env() -> dict[str, str]:
    """The caller's environment, with the backend it runs on (and the sim's device count):
    workers see the devices the caller sees."""
    backend = _driver.active()
    env = dict(os.environ, CUCTX_BACKEND=backend.name)
    if backend.sim is not None:
        env["CUCTX_SIM_DEVICES"] = str(backend.driver.cuDeviceGetCount()[1])
    return env


class ProcessEngine:
    def __init__(self, core: Core, standby: bool) -> None:
        self.core = core
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
            slot.thread = threading.Thread(target=self._serve, args=(slot,), daemon=True,
                                           name=f"cuctx-isolated-device-{slot.device}")
            slot.thread.start()

    def _spawn(self, device: int) -> ProcessWorker:
        return ProcessWorker(device, self._lifeline_r, self._env)

    # -- handing out calls ------------------------------------------------------------------

    def reductions(self, arrays: list) -> dict:
        """How a call's arguments pickle DeviceArrays: arrays of an ``ipc=True`` pool as their
        IPC descriptors (collected in ``arrays``); any other is refused."""
        def share(array: DeviceArray) -> tuple:
            try:
                desc = array._ipc_descriptor()
            except TypeError as exc:
                raise TypeError(f"{exc}; or pass array.to_host() to send its contents by "
                                "value") from None
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
        worker.send(_wire.CALL, *_wire.call_message(call.fn_bytes, call.args_bytes))
        deadline = slot.deadline
        if deadline is not None:
            self.watchdog.watch(deadline)

    # -- a slot's thread --------------------------------------------------------------------

    def _serve(self, slot: Slot) -> None:
        try:
            while True:
                worker = self._start(slot)
                if worker is None:
                    return
                self._next(slot, worker, self.core.ready(slot, worker, worker.pid))
                if not self._run(slot, worker):
                    return
        finally:
            if self.core.closed(slot):
                self._release()

    def _start(self, slot: Slot) -> ProcessWorker | None:
        """A ready worker for ``slot``: the device's standby if there is a live one, else a
        new process. None if a worker cannot start (the executor is then broken)."""
        with self._lock:
            worker = self._standbys.pop(slot.device, None)
            if worker is not None and not self._closing:
                try:
                    self._standbys[slot.device] = self._spawn(slot.device)
                except OSError:  # no standby for now; the next loss starts one cold
                    pass
        if worker is not None:
            try:
                worker.wait_ready()
                return worker
            except _StartFailed:
                pass  # a standby that died waiting: start one cold instead
        if self.core.broken:
            return None
        try:
            worker = self._spawn(slot.device)
        except OSError as exc:  # too many processes or descriptors, say
            return self._break(slot, _StartFailed(str(exc)), None)
        try:
            worker.wait_ready()
            return worker
        except _StartFailed as exc:
            return self._break(slot, exc, worker.pid)

    def _break(self, slot: Slot, failed: _StartFailed, pid: int | None) -> None:
        for idle in self.core.break_(failed.why, slot.device, pid, failed.traceback):
            idle.worker.send(_wire.EXIT)

    def _next(self, slot: Slot, worker: ProcessWorker, call: Call | None) -> None:
        if call is not None:
            self.dispatch(slot, call)
        elif slot.state == "closing":
            worker.send(_wire.EXIT)

    def _run(self, slot: Slot, worker: ProcessWorker) -> bool:
        """Serve calls until the worker ends; True if the slot needs a new one."""
        core = self.core
        while True:
            try:
                tag, message = worker.channel.recv()
            except (EOFError, OSError):
                tag = message = None
            if tag == _wire.RESULT:
                call, following = core.finished(slot)
                if call is None:
                    continue  # it timed out: the watchdog is killing the worker
                self._next(slot, worker, following)
                resolve(call, *_wire.outcome(message))
                # Not kept while waiting for the next message: a finished call's arrays
                # are the caller's to free.
                call = following = message = None
                continue
            call = core.lost(slot)
            if tag == _wire.FAULT:
                if call is not None:
                    resolve(call, error=fault_error(pickle.loads(message), call, slot.device,
                                                     worker.pid))
                worker.retire()
            else:
                # Its end of the socket closes before the process has quite exited: a kill
                # now would hide how it ended (sys.exit(4) in a call: "exit status 4").
                how = worker.retire(grace=_EXIT_GRACE_S)
                if call is not None:
                    resolve(call, error=cancelled(call) if core.aborted
                            else _death_error(call, slot, worker, how))
            return slot.state != "closing"

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

