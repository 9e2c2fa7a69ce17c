"""The Ray engine: one Ray actor per slot, on this machine or a Ray cluster.

Each actor runs the same `Runner` as a process worker. Ray places, restarts and kills the
actors; calls and answers go over a TCP connection to each actor incarnation (`_channel`),
which costs tens of microseconds where a Ray actor call costs about a millisecond (Ray
actor calls where the caller cannot reach the actor's node: `RayCalls`). A thread per slot
waits for each answer with the call's timeout. Ray restarts an actor that dies
(``max_restarts=-1``); a fault, a timeout or a lost connection kills the actor so that Ray
restarts it, and the slot waits until the new incarnation answers before it takes the next
call. Arrays travel by value: a `DeviceArray` argument arrives in the actor as a new array
with its contents (zero copy needs one machine: the process engine).
"""

from __future__ import annotations

import os
import pickle
import queue
import socket
import sys
import threading
import time
import uuid
from multiprocessing import AuthenticationError

from .. import _driver
from ..errors import WorkerDiedError, WorkerTimeoutError
from ..memory import DeviceArray, to_device
from . import _channel, _wire
from ._core import Call, Core, Slot, cancelled, fault_error, last_line, resolve

_RESTART_LIMIT_S = 120.0  # how long a slot waits for Ray to bring an actor back


def _ray():
    try:
        import ray
    except ImportError:
        raise ImportError(
            "IsolatedExecutor(engine='ray') needs Ray: pip install 'cuctx[ray]'"
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

    def channel(self, authkey: bytes) -> tuple[str, int]:
        """Serve calls on a new TCP listener of this node (`_channel`); its address."""
        import ray

        return _channel.serve(ray.util.get_node_ip_address(), authkey, self._answer)

    def run(self, message: bytes) -> bytes:
        """A call sent as a Ray actor call (`RayCalls`)."""
        return self._answer(memoryview(message))

    def _answer(self, message: memoryview) -> bytes:
        """The call's answer: its tag, then its body, in one bytes object."""
        tag, body = self._runner.run(message)
        return tag + body


class ChannelCalls:
    """A slot's calls over its actor incarnation's channel (`_channel`)."""

    def __init__(self, conn) -> None:
        self._conn = conn

    def send(self, message: bytes) -> None:
        self._conn.send_bytes(message)

    def receive(self, timeout: float | None) -> bytes:
        """The answer (TimeoutError past ``timeout``; EOFError or OSError: the actor is gone)."""
        if not self._conn.poll(timeout):
            raise TimeoutError
        return self._conn.recv_bytes()

    def close(self) -> None:
        self._conn.close()


class RayCalls:
    """A slot's calls as Ray actor calls, where the caller cannot reach its actor's node."""

    def __init__(self, ray, actor) -> None:
        self._ray, self._actor, self._ref = ray, actor, None

    def send(self, message: bytes) -> None:
        self._ref = self._actor.run.remote(message)

    def receive(self, timeout: float | None) -> bytes:
        try:
            return self._ray.get(self._ref, timeout=timeout)
        except self._ray.exceptions.GetTimeoutError:
            raise TimeoutError from None
        finally:
            self._ref = None

    def close(self) -> None:
        self._ref = None


def _device_array(host) -> DeviceArray:
    """An argument's DeviceArray, rebuilt in the actor from its contents."""
    return to_device(host)


def _by_value(array: DeviceArray) -> tuple:
    return _device_array, (array.to_host(),)


# How long joining a cluster's head may take to answer (docs/isolation.md): Ray's own
# ray.init retries an address where nothing answers for minutes.
CONNECT_TIMEOUT_S = 10.0
# What an HTTP/2 client sends first (gRPC speaks HTTP/2), and an empty SETTINGS frame: a
# gRPC server answers with a SETTINGS frame of its own (type 4, the fourth byte).
_HTTP2_HELLO = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])


def join(ray, address: str | None) -> None:
    """Connect this process to Ray: to the cluster at ``address`` (None: a new local one)
    unless it is connected already (then ``address`` must name that cluster, if any)."""
    if ray.is_initialized():
        _same_cluster(ray, address)
        return
    if address is not None:
        _answers(address)
    ray.init(address=address)


def _host_port(address: str) -> tuple[str, int] | None:
    """(host, port) of a "host:port" or "ray://host:port" address; None for "auto" and
    "local", which Ray resolves on this machine."""
    if address.strip().lower() in ("auto", "local"):
        return None
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(
            f"address={address!r} is not a Ray cluster's address: use 'host:port' (the head's "
            "port, 6379 unless `ray start --head --port=...` chose another), "
            "'ray://host:port' (Ray Client) or 'auto'"
        )
    return host.strip("[]"), int(port)


def _answers(address: str) -> None:
    """Fail within CONNECT_TIMEOUT_S, naming ``address``, where nothing answers there as a
    Ray head does (a gRPC server); Ray's own connect would retry for minutes."""
    where = _host_port(address)
    if where is None:
        return
    deadline = time.monotonic() + CONNECT_TIMEOUT_S
    try:
        with socket.create_connection(where, timeout=CONNECT_TIMEOUT_S) as sock:
            if os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true"):
                return  # a TLS head answers only after a handshake: what answers will do
            sock.settimeout(max(deadline - time.monotonic(), 0.1))
            sock.sendall(_HTTP2_HELLO)
            answer = sock.recv(9)
    except OSError as exc:
        raise ConnectionError(
            f"cannot join the Ray cluster at {address!r}: no Ray head answered at "
            f"{where[0]}:{where[1]} ({exc}; it has {CONNECT_TIMEOUT_S:g} s); start its head "
            f"there (ray start --head --port={where[1]}) or correct the address"
        ) from None
    if len(answer) < 4 or answer[3] != 4:
        raise ConnectionError(
            f"cannot join the Ray cluster at {address!r}: {where[0]}:{where[1]} answers, but "
            "not as a Ray head does (gRPC); the address is the head's port (6379 unless "
            "`ray start --head --port=...` chose another), or ray://host:10001 for Ray Client"
        )


def _same_cluster(ray, address: str | None) -> None:
    where = None if address is None or address.startswith("ray://") else _host_port(address)
    if where is None:
        return
    try:
        current = ray.get_runtime_context().gcs_address
    except Exception:  # noqa: BLE001 - a Ray Client connection has none to compare
        return
    if not current.endswith(f":{where[1]}"):
        raise ValueError(
            f"this process is connected to the Ray cluster at {current} already, and "
            f"address={address!r} names another: call ray.shutdown() first, or leave address "
            "out to use that cluster"
        )


class RayEngine:
    def __init__(self, core: Core, standby: bool, address: str | None) -> None:
        ray = self._ray = _ray()
        join(ray, address)
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
        self._queues = {id(slot): queue.SimpleQueue() for slot in core.slots}  # sent calls
        self._calls: dict[int, ChannelCalls | RayCalls] = {}  # slot -> how its calls go
        if standby:
            for device in sorted({s.device for s in core.slots}):
                self._standbys[device] = self._new_actor(device)
        for slot in core.slots:
            slot.thread = threading.Thread(
                target=self._serve,
                args=(slot,),
                daemon=True,
                name=f"cuctx-isolated-ray-{slot.device}",
            )
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
        """Send ``call`` to ``slot``'s actor from the thread that hands it out; the slot's
        thread waits for its answer."""
        error = None
        try:
            self._calls[id(slot)].send(b"".join(_wire.call_message(call.fn_bytes, call.args_bytes)))
        except Exception as exc:  # noqa: BLE001 - the slot's thread says the actor is lost
            error = exc
        self._queues[id(slot)].put((call, error))

    # -- a slot's thread --------------------------------------------------------------------

    def _serve(self, slot: Slot) -> None:
        try:
            actor, token = self._start(slot), None
            while True:
                ready = self._wait_ready(slot, actor, token)
                if ready is None:
                    return
                pid, token = ready
                calls = self._connect(actor)
                if calls is None:  # the incarnation was lost meanwhile: wait for the next
                    continue
                self._calls[id(slot)] = calls
                try:
                    go_on = self._run(slot, actor, calls, self.core.ready(slot, actor, pid))
                finally:
                    calls.close()
                if not go_on or slot.state == "closing":  # closed, or lost at Ctrl-C
                    self._kill(actor)
                    return
                if self._standby:  # the spare takes over; this actor ends
                    self._kill(actor)
                    actor, token = self._start(slot), None
        finally:
            self.core.closed(slot)

    def _connect(self, actor) -> ChannelCalls | RayCalls | None:
        """How calls reach ``actor``'s live incarnation: its channel, or Ray actor calls where
        its node cannot be reached from here; None if it was lost meanwhile."""
        ray, authkey = self._ray, os.urandom(32)
        try:
            address = ray.get(actor.channel.remote(authkey), timeout=CONNECT_TIMEOUT_S)
        except ray.exceptions.RayActorError:
            return None
        except ray.exceptions.GetTimeoutError:  # it answers, but not this: a new one
            self._kill(actor, restart=True)
            return None
        except ray.exceptions.RayError:  # it could not listen: Ray actor calls, then
            return RayCalls(ray, actor)
        try:  # (unreachable: Ray Client from outside the cluster's network, say)
            return ChannelCalls(_channel.connect(tuple(address), authkey, CONNECT_TIMEOUT_S))
        except (OSError, EOFError, AuthenticationError):
            return RayCalls(ray, actor)

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
        text = str(exc)  # Ray's: the actor's own traceback, when its __init__ raised
        for idle in self.core.break_(last_line(text), slot.device, None, text):
            self._queues[id(idle)].put(None)

    def _run(self, slot: Slot, actor, calls: ChannelCalls | RayCalls, call: Call | None) -> bool:
        """Serve calls until the actor is lost (True) or the slot closes (False)."""
        core, pid = self.core, slot.pid
        if call is not None:
            self.dispatch(slot, call)
        sent = self._queues[id(slot)]
        while True:
            if slot.state == "closing":
                return False
            item = sent.get()
            if item is None:  # shutdown: the slot was idle
                return False
            call, error = item
            remaining = (
                None if slot.deadline is None else max(0.0, slot.deadline - time.monotonic())
            )
            try:
                if error is not None:  # sending it failed
                    raise error
                answer = calls.receive(remaining)
                tag, message = answer[:1], memoryview(answer)[1:]
            except TimeoutError:
                core.lost(slot, call)
                self._kill(actor, restart=True)  # Ray brings it back
                resolve(call, error=WorkerTimeoutError(call.name, slot.device, pid, call.timeout))
                return True
            except Exception as exc:  # noqa: BLE001 - a closed connection, Ray's errors
                core.lost(slot, call)
                self._kill(actor, restart=True)  # (a no-op where its process is gone)
                resolve(
                    call,
                    error=cancelled(call)
                    if core.aborted
                    else WorkerDiedError(call.name, slot.device, pid, f"Ray: {type(exc).__name__}"),
                )
                return True
            if tag in (_wire.FAULT, _wire.ENDING):  # the actor cannot go on: Ray restarts it
                self._kill(actor, restart=True)
                core.lost(slot, call)
                report = pickle.loads(message)
                resolve(
                    call,
                    error=fault_error(report, call, slot.device, pid)
                    if tag == _wire.FAULT
                    else WorkerDiedError(call.name, slot.device, pid, report[1]),
                )
                return True
            done, following = core.finished(slot, call)
            if following is not None:
                self.dispatch(slot, following)
            if done is not None:
                resolve(done, *_wire.outcome(message))
            call = item = answer = message = done = None  # the caller's arrays are theirs

    # -- shutdown ---------------------------------------------------------------------------

    def shutdown(self, wait: bool, cancel_futures: bool) -> None:
        self._kill_standbys()
        for slot in self.core.shutdown(cancel_futures):
            self._queues[id(slot)].put(None)
        if wait:
            self._join()

    def abort(self, wait: bool) -> None:
        """Ctrl-C: kill every actor now, in the middle of its call or not."""
        self._kill_standbys()
        for actor in self.core.abort():
            self._kill(actor)
        for slot in self.core.slots:
            self._queues[id(slot)].put(None)  # an idle slot's thread waits on its queue
        if wait:
            self._join()

    def _kill_standbys(self) -> None:
        with self._lock:
            self._closing = True
            standbys, self._standbys = list(self._standbys.values()), {}
        for actor in standbys:
            self._kill(actor)

    def _join(self) -> None:
        for slot in self.core.slots:
            slot.thread.join()
