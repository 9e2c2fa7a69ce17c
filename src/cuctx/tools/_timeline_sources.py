"""Where a timeline's execution times come from: one `Source` per timeline.

- `SimActivity`: the sim's activity feed (``backend.sim.subscribe_activity``), exact on the
  virtual clock; the sim tags each queued operation with the external correlation id pushed
  on the submitting thread (``push_correlation``/``pop_correlation``), as CUPTI does.
- `CuptiSource` (tools/_cupti.py): CUPTI activity records on a GPU, same protocol.
- `EventPairs`: a timing event recorded after each operation on its stream; an operation
  runs from the later of its submission and the previous event of its stream to its own
  event. Approximate (an idle stream reads as waiting from its submission, the driver's own
  queueing is not seen), but it needs nothing but the driver: the fallback where CUPTI is
  missing or taken by another tool, and on the sim to test that path.

All times of one source are on one clock, the one its submissions are read from
(`host_ns`): the sim's virtual clock, or the host's ``perf_counter_ns`` on a GPU.
"""

from __future__ import annotations

import time
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .. import _lifetimes
from .._resource import ACTIVE, Handle
from .._calls import fail
from ..context import in_context, live_current

if TYPE_CHECKING:
    from .. import _driver, _trace


# What runs on the device, and the lane (colour) it gets.
WORK = {
    "launch": "kernel",
    "graph_launch": "kernel",
    "copy": "copy",
    "memset": "memset",
    "host_func": "host",
}
# Points in a stream's order with no activity record: placed where the stream reached them.
MARKERS = frozenset({"record", "wait_event", "wait_stream"})


def stream_key(ctx: Any, stream: Any) -> tuple[int, int]:
    """(context, stream) as ints; the legacy default stream is 1 whichever handle named it."""
    s = 0 if stream is None else stream._key
    return (0 if ctx is None else ctx._key), (1 if s == 0 and stream is not None else s)


@dataclass(frozen=True, slots=True)
class Execution:
    """One piece of work the device ran: what a source reports, before matching."""

    correlation: int | None
    lane: str  # kernel, copy, memset, host, busy
    name: str
    device: int | None
    context: int
    stream: int
    start_ns: int
    end_ns: int
    approximate: bool = False


@dataclass(frozen=True, slots=True)
class Record:
    """One row of the timeline. An operation with its execution has both times; a
    synchronize or an allocation has only its submission; work the driver reported but
    cuctx did not submit (another thread, another library) has no operation.

    Times are nanoseconds on the timeline's clock (`Timeline.clock`): the sim's virtual
    clock, or the host's ``perf_counter_ns`` on a GPU."""

    kind: str  # the operation's kind (cuctx._trace.KINDS); for foreign work: "kernel", ...
    lane: str  # what the lane colour means: kernel, copy, memset, host, marker, busy, host-only
    name: str  # the kernel's name, the copy's direction, the event ...
    device: int | None
    context: int  # the CUcontext as a `Handle` (an int printed in hex; 0: no context)
    stream: int  # the CUstream as a `Handle` (1: the legacy default stream); 0: no stream
    submit_ns: int | None
    start_ns: int | None
    end_ns: int | None
    correlation: int | None
    site: tuple[str, int, str] | None  # the user's (file, line, function)
    approximate: bool  # times from event pairs, not from the device's activity records
    operation: _trace.Operation | None = None

    def __post_init__(self) -> None:
        # Every source's handles print as cuctx prints handles (hex), here and in summaries.
        object.__setattr__(self, "context", Handle(self.context))
        object.__setattr__(self, "stream", Handle(self.stream))

    @property
    def duration_ns(self) -> int:
        return 0 if self.start_ns is None else self.end_ns - self.start_ns

    def __repr__(self) -> str:
        if self.start_ns is None:
            times = f"submitted at {self.submit_ns} ns, not run on the device"
        else:
            times = f"ran {self.start_ns}..{self.end_ns} ns" + (
                "" if self.submit_ns is None else f", submitted at {self.submit_ns} ns"
            )
        approx = " (approximate)" if self.approximate else ""
        where = f" at {self.site[0]}:{self.site[1]}" if self.site else ""
        return (
            f"<Record {self.kind} {self.name!r} ({self.lane}) device {self.device} ctx "
            f"{self.context:#x} stream {self.stream:#x}: {times}{approx}{where}>"
        )


class Source:
    approximate = False
    describe = ""
    clock = ""

    def start(self, first_id: int) -> None:
        """Begin collecting, with ``first_id`` pushed on the calling thread."""

    def advance(self, next_id: int) -> None:
        """The operation under the pushed id was submitted: push ``next_id`` instead."""

    def host_ns(self, op: _trace.Operation) -> int:
        return op.time_ns

    def submitted(self, op: _trace.Operation, correlation: int | None) -> None:
        """Called after each operation (on its thread), once the id moved on."""

    def stop(self) -> list[Execution]:
        """Stop collecting (the work is done: the timeline synchronized) and hand back what
        ran; called on the thread that started."""
        return []


_SIM_LANES = {"kernel": "kernel", "memset": "memset", "host": "host", "busy": "busy"}


class SimActivity(Source):
    """The sim's activity feed: every executed operation with its virtual start and end."""

    describe = "the sim's activity feed (exact, on the virtual clock)"
    clock = "the sim's virtual clock (ns)"

    def __init__(self, backend: _driver.Backend) -> None:
        self._sim = backend.sim
        self._activities: list[Any] = []

    def start(self, first_id: int) -> None:
        self._check(self._sim.subscribe_activity(self._activities.append), "subscribe")
        self._check(self._sim.push_correlation(first_id), "push")

    def advance(self, next_id: int) -> None:
        self._sim.pop_correlation()
        self._sim.push_correlation(next_id)

    def host_ns(self, op: _trace.Operation) -> int:
        return self._sim.clock()

    def stop(self) -> list[Execution]:
        self._sim.pop_correlation()
        self._check(self._sim.unsubscribe_activity(self._activities.append), "unsubscribe")
        return [
            Execution(
                a.correlation,
                _SIM_LANES.get(a.kind, "copy"),
                a.kind if a.kind.startswith("memcpy") else a.name,
                a.device,
                int(a.context),
                int(a.stream) or 1,
                a.start_ns,
                a.end_ns,
            )
            for a in self._activities
        ]

    @staticmethod
    def _check(result: tuple, what: str) -> None:
        if result[0]:
            raise RuntimeError(f"the sim's activity feed refused to {what}: {result[0]!r}")


class EventPairs(Source):
    """A timing event after each operation on its stream, read when the block ends."""

    approximate = True

    def __init__(self, backend: _driver.Backend, reason: str) -> None:
        self.describe = f"event pairs (approximate; {reason})"
        self.clock = (
            "the sim's virtual clock (ns)"
            if backend.sim is not None
            else "the host's perf_counter_ns"
        )
        self._backend = backend
        self._marks: list[tuple[int | None, Any, int, Any]] = []  # (id, op, submitted, CUevent)
        self._refs: dict[Any, tuple[Any, int]] = {}  # context -> (CUevent, host ns)

    def start(self, first_id: int) -> None:
        # The current context's reference now, not at the block's first operation: taking it
        # synchronizes a stream of its own, a stall the work should not see.
        ctx = live_current(self._backend)
        if ctx is not None and not _lifetimes.capturing:
            self._refs[ctx] = self._reference(ctx)

    def host_ns(self, op: _trace.Operation) -> int:
        sim = self._backend.sim
        return sim.clock() if sim is not None else op.time_ns

    def submitted(self, op: _trace.Operation, correlation: int | None) -> None:
        # No events while a graph is captured: a record would become a node of the graph.
        stream = op.stream
        if op.kind not in _TIMED or stream is None or _lifetimes.capturing:
            return
        ctx = op.context
        if ctx not in self._refs:
            self._refs[ctx] = self._reference(ctx)
        event = _take_event(ctx)
        (err,) = stream._record(event, stream._handle)  # the driver's own: no trace
        if err:
            _give_back(ctx, [event])
        else:
            self._marks.append((correlation, op, self.host_ns(op), event))

    def _reference(self, ctx: Any) -> tuple[Any, int]:
        """An event the host saw complete, and the host's clock just after: device time of
        any later event = that clock + the elapsed time between the two."""
        drv = self._backend.driver
        event = _take_event(ctx)
        with in_context(ctx, "timeline"):
            err, stream = drv.cuStreamCreate(1)  # non-blocking: waits for nobody's work
            if err:
                raise RuntimeError(f"timeline: cuStreamCreate failed with {err!r}")
            drv.cuEventRecord(event, stream)
            drv.cuStreamSynchronize(stream)
            now = (
                self._backend.sim.clock()
                if self._backend.sim is not None
                else time.perf_counter_ns()
            )
            drv.cuStreamDestroy(stream)
        return event, now

    def stop(self) -> list[Execution]:
        drv = self._backend.driver
        out, last = [], {}
        for correlation, op, submitted, event in self._marks:
            if op.context._state is not ACTIVE:  # it went before the block ended, events too
                continue
            ref, ref_ns = self._refs[op.context]
            err, ms = drv.cuEventElapsedTime(ref, event)
            if err:
                continue
            key = stream_key(op.context, op.stream)
            end = ref_ns + round(ms * 1e6)
            start = min(end, max(submitted, last.get(key, submitted)))
            last[key] = end
            if op.kind in WORK:
                out.append(
                    Execution(
                        correlation,
                        WORK[op.kind],
                        "",
                        op.context.device.ordinal,
                        key[0],
                        key[1],
                        start,
                        end,
                        True,
                    )
                )
        used: dict[Any, list[Any]] = {ctx: [ref] for ctx, (ref, _) in self._refs.items()}
        for _, op, _, event in self._marks:
            used[op.context].append(event)
        for ctx, events in used.items():
            _give_back(ctx, events)
        self._marks.clear()
        self._refs.clear()
        return out


# Operations after which event pairs record an event: the work and the markers.
_TIMED = frozenset(WORK) | MARKERS

# Timing events that earlier timelines read, per context, for the next one: creating an event
# costs more than recording it. Raw handles, not Events (an Event keeps its context alive):
# the entry goes with the Context object, or with the context when it is destroyed or reset
# (its events with it).
_spare: weakref.WeakKeyDictionary[Any, list[Any]] = weakref.WeakKeyDictionary()
SPARE_KEPT = 4096  # per context; more are destroyed


def _take_event(ctx: Any) -> Any:
    """A timing event of ``ctx``: a spare one, else a new one."""
    spare = _spare.get(ctx)
    if spare:
        return spare.pop()
    with in_context(ctx, "timeline"):
        err, event = ctx._backend.driver.cuEventCreate(0)  # with timing
    if err:
        fail(ctx._backend, err, "cuEventCreate", ctx)
    return event


def _give_back(ctx: Any, events: list[Any]) -> None:
    """``events`` of ``ctx`` were read: keep them for the next timeline (a few thousand),
    destroy the rest."""
    if ctx._state is not ACTIVE:
        return  # destroyed with their context
    spare = _spare.get(ctx)
    if spare is None:
        spare = _spare.setdefault(ctx, [])  # (two threads' timelines may end at once)
        ctx._on_teardown(_forget_spare)  # (once per context: it keeps no duplicates)
    keep = max(0, SPARE_KEPT - len(spare))
    spare += events[:keep]
    if events[keep:]:
        with in_context(ctx, "timeline"):
            for event in events[keep:]:
                ctx._backend.driver.cuEventDestroy(event)


def _forget_spare(ctx: Any) -> None:
    _spare.pop(ctx, None)
