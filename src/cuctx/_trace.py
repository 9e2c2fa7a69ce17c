"""The operation trace: the checked paths announce each operation to the sinks registered at
the time (a race checker, a timeline, a test). It sits at the bottom of the package and
imports nothing of cuctx.

With no sink registered it costs one truth test of a module-level list (``if sinks:``) on the
checked paths; the generated fast paths test the same list in their guard and step aside to
the checked path while a sink is registered, so everything is announced exactly once.

An `Operation` carries what a consumer needs to reason about ordering and memory: its kind,
context and stream, the byte ranges it reads and writes (`Access`), the kernel and launch
configuration, the event, the other stream of a wait, and the user's call site (the first
frame outside cuctx: kept as ``where``, (code, instruction offset), and put as (file, line,
function) in ``site`` only when asked, since a line number costs a walk of the code's line
table). Sinks are called on the submitting thread, after the operation was enqueued, with
two exceptions: a synchronize is announced as its wait begins, so that what other threads
enqueue while it waits comes after it (a query, answered done, after it answered); a free is
announced before the driver frees the memory, so that another thread's allocation of the same
memory comes after it. A sink that raises makes the call raise (a checker in "raise" mode
does that).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from math import prod
from threading import get_ident
from time import perf_counter_ns
from types import MappingProxyType
from typing import Any, Callable, Iterable, Iterator, Mapping, NamedTuple

READ, WRITE, READ_WRITE = "r", "w", "rw"

# Operation kinds: what each one's fields mean.
KINDS = frozenset(
    {
        "alloc",  # accesses: the new allocation (mode w); stream: where it is ordered
        "free",  # accesses: the allocation freed; stream: where the free is ordered
        #          (announced before the driver frees it)
        "copy",  # accesses: source (r) and destination (w); host sides have device=None
        "memset",  # accesses: the range written (w)
        "launch",  # accesses: pointer arguments (mode from annotation, const, else rw)
        "graph_launch",  # accesses: its kernel/copy/fill nodes'; fields: graph, exec, nodes
        #                  ((GraphNode, accesses) each; graph.edges order them)
        "host_func",  # fields["fn"]: the callable
        "record",  # event: the event recorded on stream
        "wait_event",  # event: the event stream waits for
        "wait_stream",  # other: the stream that stream waits for (through an internal event)
        "sync_stream",  # the host waits for stream (fields["query"]: a query answered done)
        "sync_event",  # the host waits for event (fields["query"]: a query answered done)
        "sync_context",  # the host waits for everything in context
        #                  (the three announced as the wait begins, a query once answered)
    }
)

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
        return (
            f"Access(ptr={self.ptr:#x}, nbytes={self.nbytes}, mode={self.mode!r}, "
            f"array={self.array!r}, host={self.host})"
        )


_NO_FIELDS: Mapping[str, Any] = MappingProxyType({})  # (shared: no dict made per operation)
_UNSET: Any = object()
Where = tuple  # (code object, offset of an instruction in it): `user_where`


class Operation:
    """One announced operation. ``accesses`` is worked out the first time a sink asks for it
    (a timeline never does), from what the announcing path handed over; a launch's
    ``launch`` is (plan, args, modes), what they are worked out from (the race checker reads
    the arrays there, without making Accesses)."""

    __slots__ = (
        "kind",
        "context",
        "stream",
        "kernel",
        "config",
        "event",
        "other",
        "where",
        "thread",
        "time_ns",
        "fields",
        "launch",
        "_accesses",
        "_accesses_of",
        "_site",
    )

    def __init__(
        self,
        kind: str,
        context: Any,
        stream: Any,
        accesses: tuple[Access, ...] = (),
        kernel: Any = None,
        config: Any = None,
        event: Any = None,
        other: Any = None,
        where: Where | None = None,
        thread: int = 0,
        time_ns: int = 0,
        fields: Mapping[str, Any] | None = None,
    ) -> None:
        self.kind = kind
        self.context = context
        self.stream = stream
        self._accesses = accesses
        self._accesses_of = None  # (function, *arguments) giving the accesses, until asked
        self.kernel = kernel
        self.config = config
        self.event = event
        self.other = other
        self.where = where  # the user's line, as `site_of` takes it (see `site`)
        self._site: Any = _UNSET
        self.thread = thread
        self.time_ns = time_ns  # host submission time (time.perf_counter_ns)
        self.fields = _NO_FIELDS if fields is None else fields
        self.launch: tuple | None = None  # a launch's (plan, args, modes): `emit_launch`

    @property
    def accesses(self) -> tuple[Access, ...]:
        """The byte ranges the operation touches, with their modes."""
        pending = self._accesses_of
        if pending is not None:
            self._accesses_of = None
            self._accesses = pending[0](*pending[1:])
        return self._accesses

    @property
    def site(self) -> tuple[str, int, str] | None:
        """The user's (file, line, function) that submitted it, worked out when first asked
        (from ``where``: a line number costs a walk of its code's line table)."""
        site = self._site
        if site is _UNSET:
            site = self._site = site_of(self.where)
        return site

    def __repr__(self) -> str:
        site = self.site
        where = f" at {site[0]}:{site[1]}" if site else ""
        return f"<Operation {self.kind} on {self.stream!r}{where}>"


Sink = Callable[[Operation], None]
_new_operation = object.__new__
# An Access made from all its fields: what Access(...) does, without its Python-level __new__
# (an array's access is made for every operation that touches it while a sink listens).
_new = tuple.__new__

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
        raise ValueError(
            f"unknown operation kinds {sorted(wanted - KINDS)}; the kinds are {sorted(KINDS)}"
        )
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


def user_where(depth: int = 2) -> Where | None:
    """The first frame outside cuctx, where the user's code called in, as (code, offset of
    its current instruction): `site_of` makes it (file, line, function)."""
    frame = sys._getframe(depth)
    ours = _ours.get
    while frame is not None:
        code = frame.f_code
        filename = code.co_filename
        known = ours(filename)
        if not (_is_ours(filename) if known is None else known):
            return code, frame.f_lasti
        frame = frame.f_back
    return None


def user_site(depth: int = 2) -> tuple[str, int, str] | None:
    """The first frame outside cuctx: where the user's code called in."""
    return site_of(user_where(depth + 1))


# (id(code), offset) -> (code, line); forgotten when it grows past _LINES_KEPT (code made at
# run time). Keyed by the code's id, not the code: a code object's hash is computed from its
# contents every time (microseconds for a long function), and every autograph build and
# graph node looks a line up. The code kept beside the line holds its id while it is cached.
_lines: dict[tuple[int, int], tuple[Any, int]] = {}
_LINES_KEPT = 4096


def site_of(where: Where | None) -> tuple[str, int, str] | None:
    """(file, line, function) of a `user_where`: the line of the instruction at the offset,
    as the frame's ``f_lineno`` said then."""
    if where is None:
        return None
    code, offset = where
    known = _lines.get((id(code), offset))
    if known is not None and known[0] is code:
        line = known[1]
    else:
        line = next(
            (line for start, end, line in code.co_lines() if start <= offset < end),
            code.co_firstlineno,
        )
        if len(_lines) >= _LINES_KEPT:
            _lines.clear()
        _lines[id(code), offset] = code, line
    return code.co_filename, line, code.co_name


def emit(
    kind: str, context: Any, stream: Any, accesses: tuple[Access, ...] = (), **fields: Any
) -> None:
    """Announce one operation to the sinks that want its kind. Call it only under
    ``if sinks:``."""
    wanted = _by_kind[kind]
    if not wanted:
        return
    op = Operation(
        kind,
        context,
        stream,
        accesses,
        fields.pop("kernel", None),
        fields.pop("config", None),
        fields.pop("event", None),
        fields.pop("other", None),
        user_where(),
        get_ident(),
        perf_counter_ns(),
        fields,
    )
    for fn in wanted:
        fn(op)


def emit_lazily(kind: str, context: Any, stream: Any, accesses_of: tuple) -> None:
    """`emit` for an operation whose accesses cost something to work out: ``accesses_of`` is
    ``(function, *arguments)``, called the first time a sink reads ``op.accesses``."""
    wanted = _by_kind[kind]
    if not wanted:
        return
    op = Operation(
        kind,
        context,
        stream,
        (),
        None,
        None,
        None,
        None,
        user_where(),
        get_ident(),
        perf_counter_ns(),
    )
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
    # (Operation's fields set here, not by its __init__: the hottest announcement, and a
    # call of a class with a Python __init__ costs as much as the rest of it)
    op = _new_operation(Operation)
    op.kind = "launch"
    op.context = launcher._ctx
    op.stream = stream = launcher.stream
    op._accesses = ()
    modes = launcher._modes()
    op._accesses_of = (plan.accesses, args, stream, modes)
    op.launch = (plan, args, modes)
    op.kernel = launcher.kernel
    op.config = launcher.config
    op.event = op.other = None
    op.where = user_where()
    op.thread = get_ident()
    op.time_ns = perf_counter_ns()
    op.fields = _NO_FIELDS
    op._site = _UNSET
    for fn in wanted:
        fn(op)


def device_access(array: Any, mode: str) -> Access:
    """The bytes a device array (``ptr``, ``shape``, ``strides``, ``dtype``) spans, from
    its lowest to its highest address, for any strides (negative ones too)."""
    if getattr(array, "_c", False):  # a C-contiguous cuctx array: its own bytes
        return _new(
            Access, (array.ptr, prod(array.shape) * array.dtype.itemsize, mode, array, False)
        )
    start, nbytes = extent(array.ptr, array.shape, array.strides, array.dtype.itemsize)
    return _new(Access, (start, nbytes, mode, array, False))


def extent(
    ptr: int, shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int
) -> tuple[int, int]:
    """(lowest address, bytes) of the elements of a strided layout starting at ``ptr``."""
    if 0 in shape:
        return ptr, 0
    hi = sum((n - 1) * s for n, s in zip(shape, strides) if s > 0)
    lo = sum((n - 1) * s for n, s in zip(shape, strides) if s < 0)
    return ptr + lo, hi - lo + itemsize
