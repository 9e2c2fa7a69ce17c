"""A worker process of the process engine, as the caller sees it: how it is started (a fresh
interpreter, ``python -c``, started by subprocess: no fork of a process that holds CUDA
state), with what environment and ipc pools, and how it is read, killed and reaped.
"""

from __future__ import annotations

import os
import pickle
import select
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

from .. import _driver
from ..kernels._compiler import cache_directory
from ..memory._ipc import _made as _made_pools  # the ipc pools this process made
from . import _wire
from ._core import last_line

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
main(*map(int, sys.argv[1:]))
"""


EXIT_GRACE_S = 2.0  # how long a worker that closed its socket has to exit by itself


class StartFailed(Exception):
    """A worker could not start: its error in one line, and its traceback if it sent one."""

    def __init__(self, why: str, traceback: str = "") -> None:
        super().__init__(why)
        self.why, self.traceback = why, traceback


class ProcessWorker:
    """One worker process: its Popen and the caller's end of its socket."""

    __slots__ = (
        "device",
        "proc",
        "channel",
        "pools",
        "reader",
        "stash",
        "closed",
        "calls",
        "number",
        "_bell",
        "_ring",
        "_word",
        "_watching",
    )

    def __init__(
        self, device: int, lifeline: int, env: dict[str, str], backend: _driver.Backend
    ) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        # The slot's thread sleeps on the bell (the read end); the worker rings it after an
        # answer no caller reads, and so does a caller that stops waiting (_wire.ring).
        bell, ring = os.pipe()
        word = -1
        try:
            os.set_blocking(bell, False)
            os.set_blocking(ring, False)
            word = _wire.shared_word_fd()  # the number of the call a caller reads itself
            self._word, self.number = _wire.map_word(word)
            fds = (theirs.fileno(), lifeline, device, ring, word)
            self.proc = subprocess.Popen(
                [sys.executable, "-c", _BOOT, *map(str, fds)],
                pass_fds=(theirs.fileno(), lifeline, ring, word),
                env=env,
                stdin=subprocess.DEVNULL,
            )
        except BaseException:
            ours.close()
            os.close(bell)
            os.close(ring)
            raise
        finally:
            theirs.close()
            if word >= 0:
                os.close(word)  # mapped: the map stays
        self._bell, self._ring = bell, ring
        self.device = device
        self.pools: set[str] = set()  # keys of the ipc pools the worker has
        self.channel = _wire.Channel(ours)
        # Whoever reads the socket holds `reader`: the slot's thread, or a caller waiting
        # for its call's answer (`ProcessEngine._attend`), which sets aside in `stash` a
        # message that is not a result, for the slot's thread.
        self.reader = threading.Lock()
        self.stash: tuple | None = None
        self.closed = False
        self.calls = 0  # the number of the last call sent (_wire.next_number)
        # The slot's thread's sleep: the bell, or the worker's end of the socket (a hang-up
        # only: data wakes the thread when the worker rings for it).
        self._watching = select.poll()
        self._watching.register(bell, select.POLLIN)
        self._watching.register(ours, select.POLLRDHUP)
        # Sent at once: the worker reads it once its imports are done. With it, this
        # process's ipc pools, which the worker imports before it is ready: a call's first
        # array of one then costs its own import only (pools made later go at first use).
        shared = _shared_pools(backend)
        self.channel.send(
            _wire.SETUP,
            pickle.dumps(
                {
                    "path": sys.path,
                    "device": device,
                    "pools": [(pool.key, pool.device) for pool in shared],
                }
            ),
        )
        for pool in shared:
            with pool:
                self.channel.send_fd(pool.fd)
            self.pools.add(pool.key)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_ready(self) -> None:
        """Return once the worker is ready; `StartFailed` with its own error if it cannot
        start (an import that fails, say), or how it ended if it said nothing."""
        try:
            tag, message = self.channel.recv()
        except (EOFError, OSError):
            raise StartFailed(
                f"it exited before saying why ({self.retire(EXIT_GRACE_S)}; "
                "its stderr may say more)"
            ) from None
        if tag != _wire.READY:
            text = bytes(message).decode(errors="replace")
            self.retire(EXIT_GRACE_S)
            raise StartFailed(last_line(text), text)

    def watch(self) -> bool:
        """For the slot's thread: return once the worker (or a caller) rang, or the worker's
        end of the socket closed; then `take` under ``reader``. True when it only rang for
        the answer of the last call sent, which a caller said it reads itself: nothing to
        do (the worker rang before the caller said so)."""
        hung_up = any(fd != self._bell for fd, _ in self._watching.poll())
        try:
            os.read(self._bell, 4096)
        except (BlockingIOError, OSError):  # a hang-up, not a ring
            pass
        return not hung_up and self.number[0] == self.calls

    def hand_back(self) -> None:
        """Under ``reader``, for a caller that stops waiting before it read its answer: the
        worker is to ring for it, and the slot's thread to look now (_wire's protocol)."""
        self.number[0] = 0
        _wire.ring(self._ring)

    def take(self) -> tuple | None:
        """Under ``reader``: the message a caller set aside, else the next one if it is there
        now ((None, None) at the end); None when there is none (a caller read it)."""
        if self.stash is not None:
            taken, self.stash = self.stash, None
            return taken
        if self.closed or not self.channel.wait(0):
            return None
        try:
            return self.channel.recv()
        except (EOFError, OSError):
            return None, None

    def send(self, tag: bytes, *parts: bytes) -> None:
        """Send, or nothing if the worker is gone (its slot's thread sees the end of the
        socket and says why)."""
        try:
            self.channel.send(tag, *parts)
        except OSError:
            pass

    def send_call(self, fn_bytes: bytes, args_bytes: bytes) -> None:
        """`send` of a CALL message."""
        try:
            self.channel.send_call(fn_bytes, args_bytes)
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
        with self.reader:  # not while a caller reads: its descriptor's number may be reused
            if not self.closed:
                self.closed = True
                self.channel.close()
                os.close(self._bell)
                os.close(self._ring)
                self.number.release()
                self._word.close()
        return how


def _shared_pools(backend: _driver.Backend) -> list:
    """A new `SharedPool` of each live ipc pool this process made on ``backend``."""
    shared = []
    for pool in list(_made_pools.values()):
        if pool._backend is backend:
            try:
                shared.append(pool._share())
            except Exception:  # noqa: BLE001 - destroyed meanwhile: nothing to share
                pass
    return shared


def worker_env() -> dict[str, str]:
    """The caller's environment, with the backend it runs on (and the sim's device count):
    workers see the devices the caller sees.

    Where it says not to write bytecode beside the sources (PYTHONDONTWRITEBYTECODE),
    workers keep theirs in cuctx's cache directory instead: a worker starts at each lost
    one, and compiling cuctx's sources again was most of its start."""
    backend = _driver.active()
    env = dict(os.environ, CUCTX_BACKEND=backend.name)
    if backend.sim is not None:
        env["CUCTX_SIM_DEVICES"] = str(backend.driver.cuDeviceGetCount()[1])
    cache = cache_directory()
    if env.get("PYTHONDONTWRITEBYTECODE") and not env.get("PYTHONPYCACHEPREFIX") and cache:
        del env["PYTHONDONTWRITEBYTECODE"]
        env["PYTHONPYCACHEPREFIX"] = str(cache / "pycache")
    return env
