"""The recorder slot: while an `@cuctx.autograph` function runs, the work its thread enqueues
goes to the thread's recorder (cuctx.graphs._autograph) instead of the driver. It sits at
the bottom of the package and imports nothing of cuctx, like `_trace`.

Allocations are not recorded (an address is a value like any other), but a recording thread's
`memory._alloc.allocate` asks its recorder first: ``allocate(nbytes, stream)`` may lend memory
an earlier call of the same function used and dropped (an `Allocation`), or answer None.

`threads` holds the ids of the threads recording now. The paths that enqueue (launches,
copies, fills, host functions, event records, waits) test its truth, one test that is false
unless some thread records, and then hand the operation to `launch` or `enqueue`: True means
the calling thread's recorder took it (the caller enqueues nothing), False that the caller
enqueues it as usual (no recorder on this thread, or work the recorder does not follow). A
call that a graph cannot hold (a synchronize, a query, a pageable copy) calls `interrupt`
first: the recorder enqueues what it holds, in order, and stops; the call then proceeds.
Each check comes after the call's own argument checks, so errors are raised where and as
they would be without a recorder.
"""

from __future__ import annotations

import threading
from typing import Any, Protocol

# Kinds of operations `enqueue` takes, with their payloads:
COPY = "copy"  # (plan, dst, src, dst_on_device, src_on_device): one `_copy.issue`
FILL = "fill"  # (array, pattern): one `_copy.memset`
HOST = "host"  # (fn, args): `Stream.launch_host_func`
RECORD = "record"  # (event,): `Stream.record`
WAIT = "wait"  # (event or stream,): `Stream.wait`


class Recorder(Protocol):
    def launch(self, launcher: Any, buffer: bytearray, args: tuple, plan: Any) -> bool: ...
    def allocate(self, nbytes: int, stream: Any) -> Any: ...
    def enqueue(self, stream: Any, kind: str, payload: tuple) -> bool: ...
    def interrupt(self, operation: str) -> None: ...


# Ids of the threads that record now. Mutated in place (never replaced), so generated code can
# bind the set itself and test it without an attribute lookup.
threads: set[int] = set()
local = threading.local()  # .recorder: the thread's (generated launch paths read it too)


def current() -> Recorder | None:
    """The calling thread's recorder, if it records."""
    return getattr(local, "recorder", None)


def start(recorder: Recorder) -> None:
    """Make ``recorder`` the calling thread's (which must have none)."""
    local.recorder = recorder
    threads.add(threading.get_ident())


def stop() -> None:
    """The calling thread records no more."""
    local.recorder = None
    threads.discard(threading.get_ident())


def launch(launcher: Any, buffer: bytearray, args: tuple, plan: Any) -> bool:
    """A launch whose parameters ``buffer`` holds, packed from ``args`` by ``plan``."""
    recorder = getattr(local, "recorder", None)
    return recorder is not None and recorder.launch(launcher, buffer, args, plan)


def enqueue(stream: Any, kind: str, *payload: Any) -> bool:
    """Any other operation on ``stream`` (see the kinds above)."""
    recorder = getattr(local, "recorder", None)
    return recorder is not None and recorder.enqueue(stream, kind, payload)


def interrupt(operation: str) -> None:
    """``operation`` cannot be part of a graph: the thread's recorder (if any) enqueues what
    it holds and stops."""
    recorder = getattr(local, "recorder", None)
    if recorder is not None:
        recorder.interrupt(operation)
