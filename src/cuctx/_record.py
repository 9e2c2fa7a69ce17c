"""The recorder slot: while an `@cuctx.autograph` function runs, the work its thread enqueues
goes to the thread's recorder (cuctx.graphs._autograph) instead of the driver. It sits at
the bottom of the package and imports nothing of cuctx, like `_trace`.

Allocations are not recorded (an address is a value like any other), but a recording thread's
`memory._alloc.allocate` asks its recorder first: ``allocate(nbytes, stream)`` may lend memory
an earlier call of the same function used and dropped (an `Allocation`), or answer None.

`threads` maps the ids of the threads recording now to their recorders. The paths that
enqueue (launches, copies, fills, host functions, event records, waits) test its truth, one
test that is false unless some thread records, and then hand the operation to `launch` or
`enqueue`: True means the calling thread's recorder took it (the caller enqueues nothing),
False that the caller enqueues it as usual (no recorder on this thread, or work the recorder
does not follow). A call that a graph cannot hold (a synchronize, a query, a pageable copy)
calls `interrupt` first: the recorder enqueues what it holds, in order, and stops; the call
then proceeds. Each check comes after the call's own argument checks, so errors are raised
where and as they would be without a recorder.
"""

from __future__ import annotations

from threading import get_ident
from typing import Any, Protocol

# Kinds of operations `enqueue` takes, with their payloads:
COPY = "copy"  # (plan, dst, src, dst_on_device, src_on_device): one `_copy.issue`
FILL = "fill"  # (array, pattern): one `_copy.memset`
HOST = "host"  # (fn, args): `Stream.launch_host_func`
RECORD = "record"  # (event,): `Stream.record`
WAIT = "wait"  # (event or stream,): `Stream.wait`


class Tape:
    """What a recorder appends its launches to: three parallel lists (the structure keys, the
    values, the items: see `graphs._autograph_record`), and the stream of its latest
    operation. A launch on that stream is recorded by three appends, ``keys.append(launcher)``,
    ``values.append(bytes(buffer))``, ``items.append((args, plan))``: the compiled launch
    path makes them itself instead of calling ``launch`` (cuctx/csrc/autograph.c)."""

    __slots__ = ("keys", "values", "items", "_stream")


class Recorder(Protocol):
    def launch(self, launcher: Any, buffer: bytearray, args: tuple, plan: Any) -> bool: ...
    def allocate(self, nbytes: int, stream: Any) -> Any: ...
    def enqueue(self, stream: Any, kind: str, payload: tuple) -> bool: ...
    def interrupt(self, operation: str) -> None: ...


# The recorders of the threads that record now, by thread id. Mutated in place (never
# replaced), so generated and compiled code can bind the dict itself and test its truth
# without an attribute lookup.
threads: dict[int, Recorder] = {}


def current() -> Recorder | None:
    """The calling thread's recorder, if it records."""
    return threads.get(get_ident())


def start(recorder: Recorder) -> None:
    """Make ``recorder`` the calling thread's (which must have none)."""
    threads[get_ident()] = recorder


def stop() -> None:
    """The calling thread records no more."""
    threads.pop(get_ident(), None)


def launch(launcher: Any, buffer: bytearray, args: tuple, plan: Any) -> bool:
    """A launch whose parameters ``buffer`` holds, packed from ``args`` by ``plan``."""
    recorder = threads.get(get_ident())
    return recorder is not None and recorder.launch(launcher, buffer, args, plan)


def enqueue(stream: Any, kind: str, *payload: Any) -> bool:
    """Any other operation on ``stream`` (see the kinds above)."""
    recorder = threads.get(get_ident())
    return recorder is not None and recorder.enqueue(stream, kind, payload)


def interrupt(operation: str) -> None:
    """``operation`` cannot be part of a graph: the thread's recorder (if any) enqueues what
    it holds and stops."""
    recorder = threads.get(get_ident())
    if recorder is not None:
        recorder.interrupt(operation)
