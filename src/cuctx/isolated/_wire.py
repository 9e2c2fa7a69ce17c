"""What crosses between the caller and a worker process, and how.

One Unix socket per worker carries framed messages: a tag byte, a length, the bytes. A call
is its function's pickle and its arguments' pickle; an outcome is a pickle too. Pickles are
the standard library's (fast, by reference for what a worker can import); what only exists
in the caller (functions and classes of ``__main__``, lambdas, local functions) goes by value
through cloudpickle, as Ray and Dask send it. File descriptors (an ipc pool's handle) go
beside a message as SCM_RIGHTS, never in a pickle.
"""

from __future__ import annotations

import array
import copyreg
import functools
import io
import marshal
import mmap
import os
import pickle
import select
import socket
import struct
import tempfile
import time
import traceback
import types
import weakref
from collections import ChainMap, OrderedDict, deque
from collections.abc import Mapping
from typing import Any, Callable

# Tags: caller -> worker
SETUP, CALL, EXIT, POOL, FD = b"S", b"C", b"X", b"P", b"D"
# Tags: worker -> caller (ENDING is the Runner's answer when a call asks its worker to end:
# the process engine's worker ends without a message; a Ray actor's answer tells the caller)
READY, FAILED, RESULT, FAULT, ENDING = b"Y", b"E", b"R", b"F", b"Q"

HEADER = struct.Struct("<cQ")  # tag, length
_CALL = struct.Struct("<I")  # the length of the function's pickle, before the arguments'
_CALL_HEAD = struct.Struct("<cQI")  # a CALL's header and that length, packed at once
# How long a reader looks for a message before it sleeps (`Channel.wait`): on an H100 host
# a no-op call's round trip went from 59 to 31 us with 50 (200 did no better).
SPIN_S = 50e-6
_SMALL = 1 << 16  # below this, one send of header and body (one syscall, one copy)
_FD_SPACE = socket.CMSG_SPACE(4 * array.array("i").itemsize)  # room for up to 4 fds


class Channel:
    """Framed messages on one end of a socket pair. One thread sends and one receives at a
    time (the executor's dispatch rules see to it); either may run while the other does.

    A read takes what is there, in one syscall (a small message's header and body together),
    and keeps what follows a message for the next `recv`. ``takes_fds``: the worker's end,
    which file descriptors reach (`send_fd`): it reads with room for them, since a read past
    a descriptor's bytes without that room would close the descriptor."""

    __slots__ = ("sock", "_reading", "_left", "_fds")

    def __init__(self, sock: socket.socket, takes_fds: bool = False) -> None:
        self.sock = sock
        self._reading = select.poll()  # for the thread that reads (one at a time)
        self._reading.register(sock, select.POLLIN)
        self._left = b""  # what a read got past the last message
        self._fds: deque[int] | None = deque() if takes_fds else None

    def wait(self, timeout: float | None) -> bool:
        """For the thread that reads: True once a message (or the other end's close) can be
        read; False when ``timeout`` seconds (None: no limit) passed first. It looks without
        sleeping for the first `SPIN_S`: a short call's answer (or a worker's next call)
        comes within that, and a thread woken from sleep costs more than the looking."""
        if self._left:
            return True
        poll = self._reading.poll
        spin = SPIN_S if timeout is None else min(SPIN_S, max(timeout, 0))
        end = time.perf_counter() + spin
        while True:
            if poll(0):
                return True
            if time.perf_counter() >= end:
                break
        if timeout is not None:
            timeout = max(timeout - spin, 0)
        return bool(poll(None if timeout is None else timeout * 1000))

    def send(self, tag: bytes, *parts: bytes | memoryview) -> None:
        size = sum(len(p) for p in parts)
        head = HEADER.pack(tag, size)
        if size < _SMALL:
            self.sock.sendall(b"".join((head, *parts)))
        else:  # large arguments: no copy into one buffer
            self.sock.sendall(head)
            for part in parts:
                self.sock.sendall(part)

    def send_call(self, fn_bytes: bytes, args_bytes: bytes) -> None:
        """A CALL message (`call_message`'s parts), framed as one: one syscall if small."""
        size = len(fn_bytes) + len(args_bytes)
        if size >= _SMALL:
            self.send(CALL, *call_message(fn_bytes, args_bytes))
            return
        self.sock.sendall(
            b"".join(
                (_CALL_HEAD.pack(CALL, _CALL.size + size, len(fn_bytes)), fn_bytes, args_bytes)
            )
        )

    def recv(self) -> tuple[bytes, memoryview]:
        """The next message; EOFError when the other end is gone."""
        data = self._left or self._read()
        while len(data) < HEADER.size:
            data += self._read()
        tag, size = HEADER.unpack_from(data)
        end = HEADER.size + size
        if len(data) >= end:
            self._left = data[end:]
            return tag, memoryview(data)[HEADER.size : end]
        # A large message: the rest straight into its buffer (and no further).
        self._left = b""
        body = bytearray(size)
        view, got = memoryview(body), len(data) - HEADER.size
        view[:got] = memoryview(data)[HEADER.size :]
        while got < size:
            n = self.sock.recv_into(view[got:])
            if not n:
                raise EOFError("the other end of the worker's socket is closed")
            got += n
        return tag, view

    def _read(self) -> bytes:
        if self._fds is None:
            data = self.sock.recv(_SMALL)
        else:  # a read stops after the bytes that carry descriptors: one FD message's
            data, ancillary, _, _ = self.sock.recvmsg(_SMALL, _FD_SPACE)
            for level, kind, fds in ancillary:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    self._fds.extend(array.array("i", fds))
        if not data:
            raise EOFError("the other end of the worker's socket is closed")
        return data

    def send_fd(self, fd: int) -> None:
        """Pass a file descriptor (a duplicate appears in the other process): an FD message,
        which carries it."""
        socket.send_fds(self.sock, [HEADER.pack(FD, 0)], [fd])

    def recv_fd(self) -> int:
        """The descriptor of the next message, an FD message."""
        tag, _ = self.recv()
        if tag != FD or not self._fds:
            raise EOFError("the worker's socket closed before a file descriptor came")
        return self._fds.popleft()

    def close(self) -> None:
        self.sock.close()


# -- who reads an answer --------------------------------------------------------------------
#
# A caller waiting in ``future.result()`` reads its own call's answer; the slot's thread reads
# any other, and sees the worker's end. Were that thread to watch the socket's data, each
# answer would wake both threads, and the two would pass the GIL and the reader lock to each
# other on every round trip. So it sleeps on a pipe (and on the socket's hang-up only), and
# the worker rings that pipe after an answer unless the caller wrote that call's number
# into a word of memory both share: "I read this one". A caller that stops waiting before
# its answer came clears the word, then rings the pipe itself, so no answer is left unread.


def next_number(number: int) -> int:
    """The number of the call after ``number`` (1, 2, ... 2**32 - 1, 1: never 0)."""
    return number % 0xFFFFFFFF + 1


def shared_word_fd() -> int:
    """A file of one word, to map in both processes (`map_word`)."""
    fd = os.memfd_create("cuctx-isolated-call") if hasattr(os, "memfd_create") else _temporary_fd()
    os.ftruncate(fd, mmap.PAGESIZE)
    return fd


def _temporary_fd() -> int:
    with tempfile.TemporaryFile() as f:
        return os.dup(f.fileno())


def map_word(fd: int) -> tuple[mmap.mmap, memoryview]:
    """The word of ``fd`` (`shared_word_fd`), mapped: (the map, a view of one uint32)."""
    mapped = mmap.mmap(fd, mmap.PAGESIZE)
    return mapped, memoryview(mapped).cast("I")


def ring(fd: int) -> None:
    """Wake the thread that sleeps on the pipe whose (non-blocking) write end is ``fd``."""
    try:
        os.write(fd, b"!")
    except (BlockingIOError, OSError):  # full: it is woken already; closed: nobody sleeps
        pass


# -- pickles --------------------------------------------------------------------------------


def dumps(obj: Any, reductions: dict | None = None) -> bytes:
    """``obj`` pickled: by the standard library where the result can be loaded in a worker,
    by value through cloudpickle where it names ``__main__`` or cannot be pickled by
    reference (lambdas, local functions). ``reductions``: extra ``dispatch_table`` entries."""
    try:
        data = _dump(_Pickler, obj, reductions)
    except (pickle.PicklingError, AttributeError):
        return _by_value(obj, reductions)
    # A reference to __main__ means the caller's script, which a worker does not import.
    # (A str "__main__" among the values sends this call by value too: harmless.)
    return _by_value(obj, reductions) if b"__main__" in data else data


class _TableFirst:
    """A pickler whose ``dispatch_table`` is set before the C pickler's ``__init__``, which is
    when it reads the table: one set after is ignored by a subclass with a class-level table
    (cloudpickle's), which is how marshal's reduction of code objects once went unused."""

    def __init__(self, file: io.BytesIO, table: Mapping) -> None:
        self.dispatch_table = table
        super().__init__(file, pickle.HIGHEST_PROTOCOL)


class _Pickler(_TableFirst, pickle.Pickler):
    own_table = copyreg.dispatch_table


def _dump(pickler_class: type, obj: Any, reductions: dict | None) -> bytes:
    if not reductions and pickler_class is _Pickler:
        return pickle.dumps(obj, pickle.HIGHEST_PROTOCOL)
    buf = io.BytesIO()
    own = pickler_class.own_table
    pickler_class(buf, ChainMap(reductions, own) if reductions else own).dump(obj)
    return buf.getvalue()


def _by_value(obj: Any, reductions: dict | None) -> bytes:
    return _dump(_by_value_pickler(), obj, reductions)


@functools.cache
def _by_value_pickler() -> type:
    import cloudpickle  # only for what the standard pickle cannot send

    return type(
        "_ByValuePickler",
        (_TableFirst, cloudpickle.Pickler),
        {"own_table": ChainMap({types.CodeType: _code}, cloudpickle.Pickler.dispatch_table)},
    )


def _code(code: types.CodeType) -> tuple:
    # cloudpickle's own reduction renames the file "<dynamic-code>"; marshal keeps it, so a
    # traceback (or a RaceWarning) from the worker names the caller's file and line.
    # (Workers run the caller's Python version: marshal's format is that version's.)
    return marshal.loads, (marshal.dumps(code),)


# Argument types that pickle by value with the standard library, whatever the worker has.
_PLAIN = frozenset({int, float, complex, str, bytes, bool, type(None)})


_NO_ARGUMENTS = pickle.dumps(((), {}), pickle.HIGHEST_PROTOCOL)


def arguments(args: tuple, kwargs: dict, reductions: Callable[[], dict]) -> bytes:
    """A call's arguments pickled: at once when each is a plain value (the usual small
    call), else by `dumps` with ``reductions()`` (DeviceArrays, values of ``__main__``)."""
    if not args and not kwargs:
        return _NO_ARGUMENTS
    if all(type(a) in _PLAIN for a in args) and all(type(v) in _PLAIN for v in kwargs.values()):
        return pickle.dumps((args, kwargs), pickle.HIGHEST_PROTOCOL)
    return dumps((args, kwargs), reductions())


_functions: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def function_bytes(fn: Callable) -> bytes:
    """``fn`` pickled once per function object: a function that goes by value is captured
    with the globals it uses as they are at its first submit (as Ray captures a remote
    function), and costs nothing to send again."""
    try:
        return _functions[fn]
    except KeyError:
        data = _functions[fn] = dumps(fn)
        return data
    except TypeError:  # a callable that cannot be weakly referenced: pickled every time
        return dumps(fn)


class FunctionCache:
    """A worker's functions by their pickle, so a function sent by value is unpickled once
    (the last 128 kept)."""

    def __init__(self, size: int = 128) -> None:
        self._size = size
        self._fns: OrderedDict[bytes, Callable] = OrderedDict()

    def get(self, data: bytes) -> Callable:
        fn = self._fns.get(data)
        if fn is None:
            fn = self._fns[data] = pickle.loads(data)
            if len(self._fns) > self._size:
                self._fns.popitem(last=False)
        else:
            self._fns.move_to_end(data)
        return fn


def call_message(fn_bytes: bytes, args_bytes: bytes) -> tuple[bytes, bytes, bytes]:
    return _CALL.pack(len(fn_bytes)), fn_bytes, args_bytes


def split_call(message: memoryview) -> tuple[bytes, memoryview]:
    (size,) = _CALL.unpack_from(message)
    start = _CALL.size
    return bytes(message[start : start + size]), message[start + size :]


# -- outcomes -------------------------------------------------------------------------------


class RemoteTraceback(Exception):
    """The traceback of an exception raised in a worker process, as text: the ``__cause__``
    of the exception the caller sees."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return f'\n"""\n{self.text}"""'


def raised(exc: BaseException) -> bytes:
    """The outcome of a call that raised ``exc``: the exception itself where it survives a
    round trip through pickle, else a RuntimeError that names it; with its traceback."""
    text = "".join(traceback.format_exception(exc))
    try:
        data = dumps(("raised", exc, text))
        pickle.loads(data)  # an exception with an unusual __init__ may not load: find out here
    except Exception as err:  # noqa: BLE001 - any failure to send it is replaced below
        stand_in = RuntimeError(
            f"{type(exc).__qualname__}: {exc} (the exception could not "
            f"be sent from the worker: {err})"
        )
        data = dumps(("raised", stand_in, text))
    return data


_RETURNED_NONE = pickle.dumps(("ok", None), pickle.HIGHEST_PROTOCOL)


def returned(value: Any, fn: Callable) -> bytes:
    """The outcome of a call of ``fn`` that returned ``value``."""
    if value is None:  # the usual answer of a call that writes its results into arrays
        return _RETURNED_NONE
    try:
        return dumps(("ok", value))
    except Exception as err:  # noqa: BLE001 - the caller gets it as the call's exception
        call = getattr(fn, "__qualname__", type(fn).__qualname__)
        return raised(
            TypeError(
                f"{call} returned a {type(value).__qualname__}, which cannot be sent back from "
                f"the worker ({err}): return host values (a DeviceArray's to_host(), say), or "
                "write device results into an array the caller passed"
            )
        )


def outcome(data: memoryview) -> tuple[Any, BaseException | None]:
    """(value, None) or (None, the exception with its remote traceback as ``__cause__``)."""
    try:
        result = pickle.loads(data)
    except Exception as err:  # noqa: BLE001 - e.g. a class the caller cannot import
        return None, RuntimeError(f"the worker's answer could not be read here: {err}")
    if result[0] == "ok":
        return result[1], None
    _, exc, text = result
    exc.__cause__ = RemoteTraceback(text)
    return None, exc
