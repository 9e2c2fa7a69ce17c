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
from threading import get_ident
from time import perf_counter_ns
from typing import Any, Callable, Iterable, Iterator, NamedTuple

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


class Operation:
    """One announced operation. ``accesses`` is worked out the first time a sink asks for it
    (a timeline never does), from what the announcing path handed over."""

    __slots__ = ("kind", "context", "stream", "kernel", "config", "event", "other", "site",
                 "thread", "time_ns", "fields", "_accesses", "_accesses_of")

    def __init__(self, kind: str, context: Any, stream: Any, accesses: tuple[Access, ...] = (),
                 kernel: Any = None, config: Any = None, event: Any = None, other: Any = None,
                 site: tuple[str, int, str] | None = None, thread: int = 0, time_ns: int = 0,
                 fields: dict[str, Any] | None = None) -> None:
        self.kind = kind
        self.context = context
        self.stream = stream
        self._accesses = accesses
        self._accesses_of = None  # (function, *arguments) giving the accesses, until asked
        self.kernel = kernel
        self.config = config
        self.event = event
        self.other = other
        self.site = site  # the user's (file, line, function)
        self.thread = thread
        self.time_ns = time_ns  # host submission time (time.perf_counter_ns)
        self.fields = {} if fields is None else fields

    @property
    def accesses(self) -> tuple[Access, ...]:
        """The byte ranges the operation touches, with their modes."""
        pending = self._accesses_of
        if pending is not None:
            self._accesses_of = None
            self._accesses = pending[0](*pending[1:])
        return self._accesses

    def __repr__(self) -> str:
        where = f" at {self.site[0]}:{self.site[1]}" if self.site else ""
        return f"<Operation {self.kind} on {self.stream!r}{where}>"


Sink = Callable[[Operation], None]

# Registered sinks. Hot paths test its truth value; it is replaced, never mutated in place,
# so a thread iterating it never sees it change.
sinks: tuple[Sink, ...] = ()
# The sinks each kind goes to (a sink registered with ``kinds`` hears only those): `emit`
# builds nothing for a kind no sink wants.
_by_kind: dict[str, tuple[Sink, ...]] = {kind: () for kind in KINDS}
_registered: list[tuple[Sink, frozenset[str]]] = []
_lock = threading.Lock()


def add_sink(sink: Sink, kinds: Iterable[str] | None = None) -> None:
    """Register ``sink`` for every operation, or only those of ``kinds`` (`KINDS`)."""
    if not callable(sink):
        raise TypeError(f"a trace sink is a callable taking an Operation, not {sink!r}")
    wanted = KINDS if kinds is None else frozenset(kinds)
    if not wanted <= KINDS:
        raise ValueError(f"unknown operation kinds {sorted(wanted - KINDS)}; the kinds are "
                         f"{sorted(KINDS)}")
    with _lock:
        _registered.append((sink, wanted))
        _publish()


def remove_sink(sink: Sink) -> None:
    with _lock:
        for i, (registered, _) in enumerate(_registered):
            if registered == sink:
                del _registered[i]
                break
        else:
            raise ValueError(f"{sink!r} is not a registered trace sink")
        _publish()


def _publish() -> None:
    """Replace (never mutate) what the hot paths and `emit` read."""
    global sinks, _by_kind
    _by_kind = {kind: tuple(s for s, wanted in _registered if kind in wanted) for kind in KINDS}
    sinks = tuple(s for s, _ in _registered)


@contextlib.contextmanager
def sink(fn: Sink, kinds: Iterable[str] | None = None) -> Iterator[Sink]:
    """Register ``fn`` for the block."""
    add_sink(fn, kinds)
    try:
        yield fn
    finally:
        remove_sink(fn)


# Whether a file's code is cuctx's own (its frames are not the user's), decided once per file
# name: walking to the user's frame is then one dict lookup per frame (a str's hash is kept).
_ours: dict[str, bool] = {}


def _is_ours(filename: str) -> bool:
    ours = filename.startswith((_PACKAGE, GENERATED)) and not filename.startswith(_EXAMPLES)
    _ours[filename] = ours
    return ours


def user_site(depth: int = 2) -> tuple[str, int, str] | None:
    """The first frame outside cuctx: where the user's code called in."""
    frame = sys._getframe(depth)
    ours = _ours.get
    while frame is not None:
        code = frame.f_code
        filename = code.co_filename
        known = ours(filename)
        if not (_is_ours(filename) if known is None else known):
            return filename, frame.f_lineno, code.co_name
        frame = frame.f_back
    return None


def emit(kind: str, context: Any, stream: Any, accesses: tuple[Access, ...] = (),
         **fields: Any) -> None:
    """Announce one operation to the sinks that want its kind. Call it only under
    ``if sinks:``."""
    wanted = _by_kind[kind]
    if not wanted:
        return
    op = Operation(kind, context, stream, accesses,
                   fields.pop("kernel", None), fields.pop("config", None),
                   fields.pop("event", None), fields.pop("other", None),
                   user_site(), get_ident(), perf_counter_ns(), fields)
    for fn in wanted:
        fn(op)


def emit_lazily(kind: str, context: Any, stream: Any, accesses_of: tuple) -> None:
    """`emit` for an operation whose accesses cost something to work out: ``accesses_of`` is
    ``(function, *arguments)``, called the first time a sink reads ``op.accesses``."""
    wanted = _by_kind[kind]
    if not wanted:
        return
    op = Operation(kind, context, stream, (), None, None, None, None, user_site(),
                   get_ident(), perf_counter_ns())
    op._accesses_of = accesses_of
    for fn in wanted:
        fn(op)


def emit_launch(launcher: Any, args: tuple, plan: Any) -> None:
    """Announce a launch that ran (from any of the launch paths: the checked one, the
    generated and the compiled fast paths). Its accesses are worked out from the plan only
    when a sink asks for them."""
    wanted = _by_kind["launch"]
    if not wanted:
        return
    stream = launcher.stream
    op = Operation("launch", launcher._ctx, stream, (), launcher.kernel, launcher.config,
                   None, None, user_site(), get_ident(), perf_counter_ns())
    op._accesses_of = (plan.accesses, args, stream, launcher._modes())
    for fn in wanted:
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
