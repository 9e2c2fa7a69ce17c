"""Handing an ipc pool's descriptor to any process of this machine that unpickles the pool.

A pool is shared through a file descriptor (cuMemPoolExportToShareableHandle), which no
pickle can hold, and the process that unpickles it (a multiprocessing child, a Pool's
worker, a Ray task) may have been started by anyone. So the process that made the pool
serves it: at the first pickle of an ipc pool, a daemon thread starts listening on a Unix
socket in the abstract namespace (nothing on disk; it goes with the process). The pickle
carries the socket's name and a random secret (`Origin`); the unpickling process connects,
sends the secret and the pool's key, and receives a new descriptor beside the answer
(SCM_RIGHTS), once per pool and process (`_ipc` caches the import). Only processes of the
same user are answered (SO_PEERCRED), and only with the secret.

The server thread runs while the process does. It answers from Python, so it needs the GIL
now and then: the exporting process must not hold the GIL for long while others unpickle
(joining a process, waiting on a queue or on Ray release it).
"""

from __future__ import annotations

import os
import secrets
import socket
import struct
import threading
from typing import Callable, NamedTuple

_SECRET = 16  # bytes
_TIMEOUT_S = 30.0  # for one hand-off, both ends
_CREDENTIALS = struct.Struct("3i")  # SO_PEERCRED: pid, uid, gid


class Origin(NamedTuple):
    """Where a pickled pool's descriptor is served: its process on its machine."""

    machine: str  # the boot id: one machine, one boot
    host: str  # its name, for messages
    pid: int
    address: bytes  # the abstract socket's name
    secret: bytes


class _Server:
    __slots__ = ("origin", "sock", "lookup")

    def __init__(self, lookup: Callable[[str], object | None]) -> None:
        self.lookup = lookup
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        address = f"\0cuctx-ipc-{os.getpid()}-{secrets.token_hex(8)}".encode()
        self.sock.bind(address)
        self.sock.listen(16)
        self.origin = Origin(
            machine_id(), socket.gethostname(), os.getpid(), address, secrets.token_bytes(_SECRET)
        )
        threading.Thread(target=self._serve, daemon=True, name="cuctx-ipc-handoff").start()

    def _serve(self) -> None:
        while True:
            conn, _ = self.sock.accept()
            with conn:
                try:
                    self._answer(conn)
                except OSError:  # the other side went away: its unpickling says so
                    pass

    def _answer(self, conn: socket.socket) -> None:
        conn.settimeout(_TIMEOUT_S)
        _, uid, _ = _CREDENTIALS.unpack(
            conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CREDENTIALS.size)
        )
        if uid != os.geteuid():
            return
        request = conn.recv(512)
        if not secrets.compare_digest(request[:_SECRET], self.origin.secret):
            return
        key = request[_SECRET:].decode(errors="replace")
        try:
            shared = self.lookup(key)
        except Exception as exc:  # noqa: BLE001 - told to the process that asked
            conn.sendall(f"no:{type(exc).__name__}: {exc}".encode())
            return
        if shared is None:
            conn.sendall(b"gone")
            return
        with shared:  # its descriptor is closed once sent (the other side got a duplicate)
            socket.send_fds(conn, [b"ok"], [shared.fd])


_server: _Server | None = None
_lock = threading.Lock()


def serve(lookup: Callable[[str], object | None]) -> Origin:
    """This process's `Origin`, its server started at the first call. ``lookup(key)`` gives
    the pool's `SharedPool` (closed after sending), or None when there is no such pool."""
    global _server
    with _lock:
        if _server is None or _server.origin.pid != os.getpid():  # (a forked child: its own)
            _server = _Server(lookup)
        return _server.origin


def fetch(origin: Origin, key: str, what: str) -> int:
    """A descriptor of the pool ``key`` from the process ``origin`` names (the caller's to
    close). ``what`` names the pool in errors."""
    if origin.machine != machine_id():
        raise ValueError(
            f"{what} was pickled on {origin.host} (process {origin.pid}), another machine or "
            "an earlier boot of this one: ipc pools and their arrays pickle only to processes "
            "of the machine that made them; send arr.to_host() to another machine"
        )
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(_TIMEOUT_S)
        try:
            sock.connect(origin.address)
            sock.sendall(origin.secret + key.encode())
            answer, fds, _, _ = socket.recv_fds(sock, 512, 1)
        except OSError as exc:
            raise RuntimeError(
                f"cannot get {what} from process {origin.pid}, which made it ({exc}): that "
                "process must still run when another one unpickles its pool or arrays (in the "
                "same network namespace: the pool is handed over on a Unix socket)"
            ) from None
    if answer == b"ok" and fds:
        return fds[0]
    for fd in fds:
        os.close(fd)
    if answer == b"gone":
        raise RuntimeError(
            f"process {origin.pid} no longer has {what}: keep the pool (or an array of it) "
            "alive in the process that made it until the others have unpickled it"
        )
    reason = answer[3:].decode(errors="replace") if answer.startswith(b"no:") else "no answer"
    raise RuntimeError(f"process {origin.pid} could not share {what}: {reason}")


_machine: str | None = None


def machine_id() -> str:
    """This boot of this machine (Linux's boot id; the host name where there is none)."""
    global _machine
    if _machine is None:
        try:
            with open("/proc/sys/kernel/random/boot_id") as f:
                _machine = f.read().strip()
        except OSError:
            _machine = socket.gethostname()
    return _machine
