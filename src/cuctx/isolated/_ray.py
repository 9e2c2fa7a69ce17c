"""The Ray engine: one Ray actor per slot, on this machine or a Ray cluster.

Each actor runs the same `Runner` as a process worker. A thread per slot sends its calls
(``actor.run.remote``) and waits for each with the call's timeout. Ray restarts an actor
that dies (``max_restarts=-1``); a fault or a timeout kills the actor so that Ray restarts
it, and the slot waits until the new incarnation answers before it takes the next call.
Arrays travel by value: a `DeviceArray` argument arrives in the actor as a new array with
its contents (zero copy needs one machine: the process engine).
"""

from __future__ import annotations

import os
import pickle
import queue
import sys
import threading
import time
import uuid

from .. import _driver
from ..errors import WorkerDiedError, WorkerFaultError, WorkerTimeoutError
from ..memory import DeviceArray, to_device
from . import _wire
from ._core import Call, Core, Slot, resolve

_RESTART_LIMIT_S = 120.0  # how long a slot waits for Ray to bring an actor back


def _ray():
    try:
        import ray
    except ImportError:
        raise ImportError("IsolatedExecutor(engine='ray') needs Ray: pip install 'cuctx[ray]'"
                          ) from None
    return ray


class RayWorker:
    """The actor: a `Runner` for one device. On a GPU Ray gives the actor one device
    (``num_gpus=1``, its device 0 there); on the sim it runs the caller's slot's device."""

    def __init__(self, ordinal: int, env: dict[str, str], path: list[str]) -> None:
        os.environ.update(env)
        for entry in reversed(path):  # what the caller imports, where it exists here
            if entry not in sys.path:
                sys.path.insert(0, entry)
        _driver.select(env["CUCTX_BACKEND"])
        from ._worker import Runner
        self._runner = Runner(ordinal)
        self._token = uuid.uuid4().hex  # this incarnation (Ray restarts reuse the handle)

    def ready(self) -> tuple[int, str]:
        return os.getpid(), self._token

    def run(self, message: bytes) -> tuple[bytes, bytes]:
        return self._runner.run(memoryview(message))


def _device_array(host) -> DeviceArray:
    """An argument's DeviceArray, rebuilt in the actor from its contents."""
    return to_device(host)


def _by_value(array: DeviceArray) -> tuple:
    return _device_array, (array.to_host(),)


class RayEngine:
    def __init__(self, core: Core, standby: bool, address: str | None) -> None:
        ray = self._ray = _ray()
        if not ray.is_initialized():
            ray.init(address=address)
        backend = _driver.active()
        self._env = {"CUCTX_BACKEND": backend.name}
        if backend.sim is not None:
            self._env["CUCTX_SIM_DEVICES"] = str(backend.driver.cuDeviceGetCount()[1])
        self._gpu = backend.sim is None
        self._actor_class = ray.remote(RayWorker)
        self.core = core
        self._lock = threading.Lock()
        self._standby = standby
        self._standbys: dict[int, object] = {}
        self._closing = False
        self._queues = {id(slot): queue.SimpleQueue() for slot in core.slots}
        if standby:
            for device in sorted({s.device for s in core.slots}):
                self._standbys[device] = self._new_actor(device)
        for slot in core.slots:
            slot.thread = threading.Thread(target=self._serve, args=(slot,), daemon=True,
                                           name=f"cuctx-isolated-ray-{slot.device}")
            slot.thread.start()

    def _new_actor(self, device: int):
        options = {"max_restarts": -1, "num_gpus": 1 if self._gpu else 0}
        ordinal = 0 if self._gpu else device  # Ray's CUDA_VISIBLE_DEVICES: its one GPU
        return self._actor_class.options(**options).remote(ordinal, self._env, sys.path)

    def _kill(self, actor, restart: bool = False) -> None:
        try:
            self._ray.kill(actor, no_restart=not restart)
        except Exception:  # noqa: BLE001 - Ray already shut down (at exit): nothing to end
            pass

    def reductions(self, arrays: list) -> dict:
        return {DeviceArray: _by_value}

    def dispatch(self, slot: Slot, call: Call) -> None:
        self._queues[id(slot)].put(call)

    # -- a slot's thread --------------------------------------------------------------------

    def _serve(self, slot: Slot) -> None:
        try:
            actor, token = self._start(slot), None
            while True:
                ready = self._wait_ready(slot, actor, token)
                if ready is None:
                    return
                pid, token = ready
                if not self._run(slot, actor, self.core.ready(slot, actor, pid)):
                    self._kill(actor)
                    return
                if self._standby:  # the spare takes over; this actor ends
                    self._kill(actor)
                    actor, token = self._start(slot), None
        finally:
            self.core.closed(slot)

    def _start(self, slot: Slot):
        with self._lock:
            actor = self._standbys.pop(slot.device, None)
            if self._standby and not self._closing:
                self._standbys[slot.device] = self._new_actor(slot.device)
        return actor if actor is not None else self._new_actor(slot.device)

    def _wait_ready(self, slot: Slot, actor, old: str | None) -> tuple[int, str] | None:
        """(pid, token) of ``actor``'s live incarnation once it answers and is not ``old``
        (a restart is asynchronous: the old one may still answer). None if it cannot start:
        the executor is then broken."""
        ray, give_up = self._ray, time.monotonic() + _RESTART_LIMIT_S
        while True:
            try:
                pid, token = ray.get(actor.ready.remote(), timeout=_RESTART_LIMIT_S)
                if token != old:
                    return pid, token
            except ray.exceptions.RayActorError as exc:
                if exc.actor_init_failed or time.monotonic() > give_up:
                    self._break(slot, actor, exc)
                    return None
            except ray.exceptions.GetTimeoutError as exc:
                self._break(slot, actor, exc)
                return None
            time.sleep(0.01)

    def _break(self, slot: Slot, actor, exc: BaseException) -> None:
        self._kill(actor)
        for idle in self.core.break_(f"device {slot.device}: {exc}", slot.device, None):
            self._queues[id(idle)].put(None)

    def _run(self, slot: Slot, actor, call: Call | None) -> bool:
        """Serve calls until the actor is lost (True) or the slot closes (False)."""
        ray, core, pid = self._ray, self.core, slot.pid
        while True:
            if call is None:
                if slot.state == "closing":
                    return False
                call = self._queues[id(slot)].get()
                if call is None:  # shutdown: the slot was idle
                    return False
            ref = actor.run.remote(b"".join(_wire.call_message(call.fn_bytes,
                                                               call.args_bytes)))
            remaining = None if slot.deadline is None else max(0.0, slot.deadline
                                                               - time.monotonic())
            try:
                tag, message = ray.get(ref, timeout=remaining)
            except ray.exceptions.GetTimeoutError:
                self._kill(actor, restart=True)  # Ray brings it back
                core.lost(slot)
                resolve(call, error=WorkerTimeoutError(call.name, slot.device, pid,
                                                       call.timeout))
                return True
            except ray.exceptions.RayError as exc:
                core.lost(slot)
                resolve(call, error=WorkerDiedError(call.name, slot.device, pid,
                                                    f"Ray: {type(exc).__name__}"))
                return True
            if tag == _wire.FAULT:
                self._kill(actor, restart=True)
                core.lost(slot)
                report = pickle.loads(message)
                error = WorkerFaultError(report["code"], report["operation"],
                                         report["message"], report["hint"],
                                         device=slot.device, worker=pid, call=call.name)
                error.__cause__ = _wire.RemoteTraceback(report["traceback"])
                resolve(call, error=error)
                return True
            done, call = core.finished(slot)
            resolve(done, *_wire.outcome(memoryview(message)))
            done = message = ref = None  # the caller's arrays are the caller's to free

    # -- shutdown ---------------------------------------------------------------------------

    def shutdown(self, wait: bool, cancel_futures: bool) -> None:
        with self._lock:
            self._closing = True
            standbys, self._standbys = list(self._standbys.values()), {}
        for actor in standbys:
            self._kill(actor)
        for slot in self.core.shutdown(cancel_futures):
            self._queues[id(slot)].put(None)
        if wait:
            for slot in self.core.slots:
                slot.thread.join()
