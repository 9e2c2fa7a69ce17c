"""The operation trace: the checked paths announce each operation to the sinks registered at
the time (a race checker, a timeline, a test). It sits at the bottom of the package and
imports nothing of cuctx.

With no sink registered it costs one truth test of a module-level list (``if sinks:``) on the
checked paths; the generated fast paths test the same list in their guard and step aside to
the checked path while a sink is registered, so everything is announced exactly once.

An `Operation` carries what a consumer needs to reason about ordering and memory: its kind,
context and stream, the byte ranges it reads and writes (`Access`), the kernel and launch
configuration, the event, the other stream of a wait, and the user's call site (the first
frame outside cuctx). Sinks are called on the submitting thread, after the operation was
enqueued; a sink that raises makes the call raise (a checker in "raise" mode does that).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, NamedTuple

READ, WRITE, READ_WRITE = "r", "w", "rw"

# Operation kinds: what each one's fields mean.
KINDS = frozenset({
    "alloc",        # accesses: the new allocation (mode w); stream: where it is ordered
    "free",         # accesses: the allocation freed; stream: where the free is ordered
    "copy",         # accesses: source (r) and destination (w); host sides have device=None
    "memset",       # accesses: the range written (w)
    "launch",       # accesses: pointer arguments (mode from annotation, const, else rw)
    "graph_launch",  # accesses: its kernel/copy/fill nodes'; fields: graph, exec, nodes
    #                  ((GraphNode, accesses) each; graph.edges order them)
    "host_func",    # fields["fn"]: the callable
    "record",       # event: the event recorded on stream
    "wait_event",   # event: the event stream waits for
    "wait_stream",  # other: the stream that stream waits for (through an internal event)
    "sync_stream",  # the host waits for stream
    "sync_event",   # the host waits for event
    "sync_context",  # the host waits for everything in context
})

_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep
# The examples ship inside the package but are user code: their lines are the user's.
_EXAMPLES = _PACKAGE + "examples" + os.sep
# Code cuctx generates (launch fast paths) is compiled under names starting with this: its
# frames are cuctx's, not the user's.
GENERATED = "<cuctx "


class Access(NamedTuple):  # (a tuple: one is made per array of every traced operation)
    """A byte range an operation touches: ``[ptr, ptr + nbytes)`` in ``mode`` (READ, WRITE or
    READ_WRITE). ``array`` is the cuctx array (or other library's object) it came from, when
    there is one; ``host`` is True for host memory."""

    ptr: int
    nbytes: int
    mode: str
    array: Any = None
    host: bool = False

    def __repr__(self) -> str:  # the address in hex, as DeviceArray prints it
        return (f"Access(ptr={self.ptr:#x}, nbytes={self.nbytes}, mode={self.mode!r}, "
                f"array={self.array!r}, host={self.host})")


@dataclass(slots=True)
class Operation:
    kind: str
    context: Any
    stream: Any
    accesses: tuple[Access, ...] = ()
    kernel: Any = None
    config: Any = None
    event: Any = None
    other: Any = None
    site: tuple[str, int, str] | None = None  # the user's (file, line, function)
    thread: int = 0
    time_ns: int = 0  # host submission time (time.perf_counter_ns)
    fields: dict[str, Any] = field(default_factory=dict)

    def __repr__(self) -> str:
        where = f" at {self.site[0]}:{self.site[1]}" if self.site else ""
        return f"<Operation {self.kind} on {self.stream!r}{where}>"


Sink = Callable[[Operation], None]

# Registered sinks. Hot paths test its truth value; it is replaced, never mutated in place,
# so a thread iterating it never sees it change.
sinks: tuple[Sink, ...] = ()
_lock = threading.Lock()


def add_sink(sink: Sink) -> None:
    global sinks
    if not callable(sink):
        raise TypeError(f"a trace sink is a callable taking an Operation, not {sink!r}")
    with _lock:
        sinks = sinks + (sink,)


def remove_sink(sink: Sink) -> None:
    global sinks
    with _lock:
        if sink not in sinks:
            raise ValueError(f"{sink!r} is not a registered trace sink")
        i = sinks.index(sink)
        sinks = sinks[:i] + sinks[i + 1:]


@contextlib.contextmanager
def sink(fn: Sink) -> Iterator[Sink]:
    """Register ``fn`` for the block."""
    add_sink(fn)
    try:
        yield fn
    finally:
        remove_sink(fn)


def user_site(depth: int = 2) -> tuple[str, int, str] | None:
    """The first frame outside cuctx: where the user's code called in."""
    frame = sys._getframe(depth)
    while frame is not None:
        filename = frame.f_code.co_filename
        if not filename.startswith((_PACKAGE, GENERATED)) or filename.startswith(_EXAMPLES):
            return filename, frame.f_lineno, frame.f_code.co_name
        frame = frame.f_back
    return None


def emit(kind: str, context: Any, stream: Any, accesses: tuple[Access, ...] = (),
         **fields: Any) -> None:
    """Announce one operation to every registered sink. Call it only under ``if sinks:``."""
    op = Operation(kind, context, stream, accesses,
                   fields.pop("kernel", None), fields.pop("config", None),
                   fields.pop("event", None), fields.pop("other", None),
                   user_site(), threading.get_ident(), time.perf_counter_ns(), fields)
    for fn in sinks:
        fn(op)


def device_access(array: Any, mode: str) -> Access:
    """The bytes a device array (``ptr``, ``shape``, ``strides``, ``dtype``) spans, from
    its lowest to its highest address, for any strides (negative ones too)."""
    if getattr(array, "_c", False):  # a C-contiguous cuctx array: its own bytes
        return Access(array.ptr, array.nbytes, mode, array)
    start, nbytes = extent(array.ptr, array.shape, array.strides, array.dtype.itemsize)
    return Access(start, nbytes, mode, array)


def extent(ptr: int, shape: tuple[int, ...], strides: tuple[int, ...],
           itemsize: int) -> tuple[int, int]:
    """(lowest address, bytes) of the elements of a strided layout starting at ``ptr``."""
    if 0 in shape:
        return ptr, 0
    hi = sum((n - 1) * s for n, s in zip(shape, strides) if s > 0)
    lo = sum((n - 1) * s for n, s in zip(shape, strides) if s < 0)
    return ptr + lo, hi - lo + itemsize
