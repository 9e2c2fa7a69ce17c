"""What one `@autograph` call enqueued, recorded at the API level instead of enqueued.

A `Recording` is the calling thread's recorder (`cuctx._record`) while the function runs.
It keeps three parallel lists, one entry per operation:

- ``keys``, the structure: the `Launcher` for a launch (its kernel, configuration and
  stream), ``(kind, role, ...)`` for the rest (the copy's plan, the fill's shape and dtype,
  the edge a wait makes). Two calls with equal ``keys`` can share one executable.
- ``values``, what may change from call to call without changing the graph: a launch's
  packed parameter bytes (pointers and scalars), a copy's two addresses, a fill's address
  and pattern, the identities of a host function and its arguments, of an event.
- ``items``, what performs the operation: ``(args, plan)`` of a launch, ``(stream,
  payload)`` of the rest. They keep the arrays alive until the work is enqueued.

Allocations are not recorded: their addresses are values. The k-th allocation of the call
on a stream borrows the function's memory of earlier calls (`_autograph_arena`), so a
temporary keeps its address from call to call.

Streams: every stream of the context of the first operation is followed; each gets a
*role* in the order of first use, role 0 being where an executable is launched. Work on a
stream of another context is not recorded (it is enqueued at once), unless it waits for
recorded work: then the recording is interrupted, since that wait needs the work enqueued.

`interrupt` (a synchronize, a query, a pageable copy: what a graph cannot hold) enqueues
everything recorded so far, in order, through the eager paths, and stops recording; the
rest of the call runs eagerly. `enqueue_all` does the same for a call that is run eagerly.
"""

from __future__ import annotations

import inspect
from typing import Any

from ..memory import _alloc, _layout
from .. import _record, _trace
from ..memory._copy import _address, issue, memset, memory_type
from ..memory._host import page_locked
from ..kernels._launcher import Launcher
from ..event import Event
from ..stream import Stream
from ._autograph_arena import Arena, Lease

COPY, FILL, HOST, RECORD, WAIT = (
    _record.COPY,
    _record.FILL,
    _record.HOST,
    _record.RECORD,
    _record.WAIT,
)

PAGEABLE = (
    "cuctx.copy with pageable host memory (synchronous: to_host() without a "
    "page-locked out=, to_device or copy of an ordinary NumPy array)"
)
# Functions whose call returns before their body runs, outside the call's recording (AutoGraph
# refuses to decorate them): (test, what it is, what a call gives).
_DEFERRED = (
    (inspect.isasyncgenfunction, "an async generator function", "an async generator"),
    (inspect.iscoroutinefunction, "an async function", "a coroutine"),
    (inspect.isgeneratorfunction, "a generator function", "a generator"),
)


class Recording(_record.Tape):
    """The calling thread's recorder for one call (see the module's docstring)."""

    __slots__ = ("streams", "roles", "ctx", "events", "broken", "arena", "allocations", "_role")

    def __init__(self, arena: Arena | None = None) -> None:
        self.keys: list = []
        self.values: list = []
        self.items: list = []
        self.streams: list[Stream] = []  # by role
        self.roles: dict[int, int] = {}  # stream handle -> role
        self.ctx: Any = None  # the context of the first operation
        self.events: dict[int, int] = {}  # id(event) -> index of its latest record
        self.broken: tuple[str, tuple | None] | None = None  # (operation, user's site)
        self.arena = Arena() if arena is None else arena  # the function's, for temporaries
        self.allocations = 0  # made so far in the call
        self._stream: Stream | None = None  # the latest operation's stream, and its role
        self._role = 0

    def _follow(self, stream: Stream) -> bool:
        """Whether work on ``stream`` is recorded (its role becomes the current one)."""
        ctx = stream._ctx
        if self.ctx is None:
            self.ctx = ctx
        elif ctx is not self.ctx:
            return False
        role = self.roles.get(stream._key)
        if role is None:
            role = self.roles[stream._key] = len(self.streams)
            self.streams.append(stream)
        self._stream, self._role = stream, role
        return True

    def role_of(self, stream: Stream) -> int:
        return self.roles[stream._key]

    # -- the recorder protocol (cuctx._record) ----------------------------------------------

    def launch(self, launcher: Launcher, buffer: bytearray, args: tuple, plan: Any) -> bool:
        if launcher.stream is not self._stream and not self._follow(launcher.stream):
            return False
        self.keys.append(launcher)
        self.values.append(bytes(buffer))
        self.items.append((args, plan))
        return True

    def allocate(self, nbytes: int, stream: Stream) -> Lease | None:
        index = self.allocations
        self.allocations = index + 1
        return self.arena.lend(index, nbytes, stream)

    def enqueue(self, stream: Stream, kind: str, payload: tuple) -> bool:
        if kind is WAIT:
            return self._wait(stream, payload[0])
        if stream is not self._stream and not self._follow(stream):
            return False
        role = self._role
        if kind is COPY:
            plan, dst, src, dst_on_device, src_on_device = payload
            if not (dst_on_device and src_on_device) and not _locked(src if dst_on_device else dst):
                self.interrupt(PAGEABLE)
                return False
            key = (COPY, role, plan, dst_on_device, src_on_device)
            if _alloc.host_pools:  # a host pool's array is another memory type: another node
                key += (memory_type(dst, dst_on_device), memory_type(src, src_on_device))
            value = (_address(dst, dst_on_device), _address(src, src_on_device))
        elif kind is FILL:
            array, pattern = payload
            key = (FILL, role, array.shape, array.strides, array.dtype.str)
            value = (array.ptr, pattern)
        elif kind is HOST:
            fn, args = payload
            key = (HOST, role)
            value = (fn, *map(id, args))  # the arguments by identity: they need not compare
        else:  # RECORD
            (event,) = payload
            self.events[id(event)] = len(self.keys)
            key, value = (RECORD, role), id(event)
        self.keys.append(key)
        self.values.append(value)
        self.items.append((stream, payload))
        return True

    def _wait(self, stream: Stream, other: Event | Stream) -> bool:
        """``stream`` waits for ``other``. Between followed streams it is an edge; on a
        followed stream for outside work, a wait made before the executable launches; on an
        outside stream for recorded work, an interruption."""
        if self.ctx is None:
            self.ctx = stream._ctx
        index = self.events.get(id(other)) if isinstance(other, Event) else None
        inside = index is not None if isinstance(other, Event) else other._ctx is self.ctx
        if stream._ctx is not self.ctx:
            if inside:
                self.interrupt(
                    "Stream.wait by a stream of another context for work the call recorded"
                )
            return False
        self._follow(stream)
        if isinstance(other, Event):
            key = (WAIT, self._role, None, index) if inside else (WAIT, self._role)
        elif inside:
            other_role = self.roles.get(other._key)
            if other_role is None:
                other_role = self.roles[other._key] = len(self.streams)
                self.streams.append(other)
            key = (WAIT, self._role, other_role, None)
        else:
            key = (WAIT, self._role)
        self.keys.append(key)
        self.values.append(None if inside else id(other))
        self.items.append((stream, (other,)))
        return True

    def interrupt(self, operation: str) -> None:
        """``operation`` cannot be in a graph: stop recording, enqueue what was recorded."""
        self.broken = (operation, _trace.user_site())
        _record.stop()
        self.enqueue_all()

    # -- running it eagerly ------------------------------------------------------------------

    def enqueue_all(self) -> None:
        """Enqueue every recorded operation, in order, through the eager paths (the
        recorder must be stopped): runs of launches through the compiled path where the
        backend has it (`cuctx._native`'s enqueue, from their packed bytes), the rest here."""
        keys, values, items = self.keys, self.values, self.items
        native = self.ctx._backend.native if self.ctx is not None else None
        i, n = 0, len(keys)
        while i < n:
            if native is not None:
                i = native.enqueue(keys, values, i)
                if i == n:
                    break
            key = keys[i]
            if key.__class__ is Launcher:
                key._enqueue(values[i], *items[i])
            else:
                self._enqueue_one(key[0], *items[i])
            i += 1

    @staticmethod
    def _enqueue_one(kind: str, stream: Stream, payload: tuple) -> None:
        if kind is COPY:
            issue(stream, *payload)
        elif kind is FILL:
            memset(payload[0], payload[1], stream)
        elif kind is HOST:
            stream.launch_host_func(payload[0], *payload[1])
        elif kind is RECORD:
            stream.record(payload[0])
        else:
            stream.wait(payload[0])

    def external_waits(self) -> list[tuple[Stream, Any]]:
        """The waits for outside work: (stream, event or stream), in order."""
        return [
            self.items[i]
            for i, key in enumerate(self.keys)
            if key.__class__ is tuple and key[0] is WAIT and len(key) == 2
        ]


def _locked(host: Any) -> bool:
    """Whether the host array of a copy is page-locked (else the copy is synchronous)."""
    lo, hi = _layout.span(host.shape, host.strides, host.dtype.itemsize)
    return page_locked(_address(host, False) + lo, hi - lo)
