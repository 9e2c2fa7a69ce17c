"""The race checker: a trace sink keeping happens-before between streams with vector clocks.

Actors are streams, per (context, stream; the per-thread default stream per host thread
too), and the host. Each actor has a vector clock (actor id -> epoch); an operation on a
stream takes the stream's epoch and then advances it, so an earlier operation (actor a, epoch
e) happens before a later one on a stream whose clock says ``clock[a] > e``. The edges:

- submission: a stream's work comes after what the host has seen finish;
- an event record snapshots the recording stream's clock; a wait (event or stream) joins it;
- stream, event and context synchronize, a query that answered "done" (`Event.done`,
  `Stream.done`), and a copy to pageable host memory (it returns once complete: CUDA's "API
  synchronization behavior"), join the host's clock;
- the legacy default stream and the blocking streams of its context join each other's clocks
  at each operation (its implicit barrier, both ways);
- a free is a write of the whole allocation on its stream; what frees release is remembered,
  so a later access there is a use after free, until a new allocation takes the range (pool
  reuse: a fresh history, ordered after the free); the latest `FREES_KEPT` frees are.

What the host has seen finish is retired (`Watch._sweep`, at a host join, amortized over the
operations since the last one): every stream joins the host's clock at its next operation,
so a stamp behind it can race nothing that comes later, and an event or actor whose clock
it covers orders nothing the host's clock does not. So the history holds the work not yet
known done, the live allocations and the latest frees, whatever ran before.

The host is one actor for all threads: what one thread saw finish orders what every thread
submits after it. cuctx cannot see Python's thread starts, joins, locks and queues, which is
how programs hand work between threads once it is done ("synchronize, then start workers",
"synchronize, then put it in the queue"); a clock per thread would report those as races.
Work captured into a graph is skipped: it runs when the graph does, and a graph's launch is
checked as the graph orders its nodes (_racecheck_graphs.py).

One `Watch` keeps this history for every checker at once; what a finding then does (raise,
warn, collect) is the business of the scopes it reports to (`cuctx.racecheck` blocks and the
whole run's checker: _racecheck_run.py).
"""

from __future__ import annotations

import bisect
import os
import sys
import threading
import weakref
from typing import Any

from ..memory import _host
from ..memory._array import DeviceArray
from .. import _lifetimes, _trace
from .._resource import ACTIVE
from ._racecheck_clocks import Clocks, join, ordered
from ._racecheck_graphs import GraphChecks
from ._racecheck_shadow import FREE_IN_USE, RAW, USE_AFTER_FREE, WAR, WAW, Finding, OpInfo, Region
from ._racecheck_words import explain, kept_free, label_of, named_free, node_what

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
# Freed ranges no allocation took again, kept to tell a use after free: the latest ones. A
# GPU's allocator hands freed addresses out again (the new allocation then drops the
# record); where it does not (the sim's, memory released at a synchronize) this bounds them.
FREES_KEPT = 1024
# Retired at a synchronize once this many operations touched memory since the last time,
# or as many as there are regions, actors and events to look at (the work of a sweep).
SWEEP_EVERY = 256


class Watch(GraphChecks):
    """The race checker's history and its trace sink (`see`): every operation it is shown
    is checked against what it saw before, and each finding goes to ``scopes`` (objects
    with ``mode``, ``findings`` and ``_seen``: `RaceCheck`; the innermost last), which
    `_racecheck_run` keeps. ``lock`` guards the history and ``scopes``."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.scopes: list[Any] = []
        self.on = False  # registered as a trace sink
        self.backend: Any = None  # the active backend: only its operations are checked
        self._handlers = {
            kind: getattr(self, "_" + kind, self._accesses)  # launch, memset
            for kind in _trace.KINDS
        }
        self.reset(None)

    def reset(self, backend: Any) -> None:
        """Forget everything seen (a new backend, or the checker was off for a while): work
        it did not see is never reported."""
        self.backend = backend
        self.clocks = Clocks()
        self._enter = self.clocks.enter
        # event key -> (the recording stream's clock then, a weak reference to the event)
        self._events: dict[int, tuple[dict[int, int], weakref.ref]] = {}
        self._events_pruned_at = 64
        self._starts: list[int] = []  # live regions, sorted by start
        self._regions: dict[int, Region] = {}
        self._freed_starts: list[int] = []  # freed regions no allocation took again
        # start -> (end, the free's info, the region's label and where): oldest first
        self._freed: dict[int, tuple[int, tuple, Any, Any]] = {}
        self._graph_checked: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._whats: dict[str, str] = {}  # kernel name -> "launch of 'name'"
        self._sweep_after = SWEEP_EVERY  # operations (`Clocks.advanced`)

    # -- the sink ---------------------------------------------------------------------------

    def see(self, op: _trace.Operation) -> None:
        if op.context._backend is not self.backend:
            return  # an object of another backend (made before a switch): another address space
        stream = op.stream
        if (
            stream is not None
            and _lifetimes.capturing
            and (op.context._key, stream._key) in _lifetimes.capturing
        ):
            return  # captured into a graph: it runs when the graph is launched
        lock = self.lock
        lock.acquire()  # (not `with`: it costs a launch more than the rest of this method)
        try:
            found = self._handlers[op.kind](op)
            scopes = self.scopes
            scope = scopes[-1] if scopes else None
        finally:
            lock.release()
        if scope is not None and (found or scope._pending):
            scope._tell(found, op)

    # -- operations ---------------------------------------------------------------------------

    def _alloc(self, op: _trace.Operation) -> list[Finding]:
        self._enter(op.stream, op.thread)
        acc = op.accesses[0]
        lo, hi = acc.ptr, acc.ptr + acc.nbytes
        for start in self._freed_in(lo, hi):  # the pool reused it: a fresh history
            self._unfree(start)
        self._forget(lo, hi)
        self._add(Region(lo, hi, op.where))
        return []

    def _free(self, op: _trace.Operation) -> list[Finding]:
        actor = self._enter(op.stream, op.thread)
        clock = actor.clock
        acc = op.accesses[0]
        info = ("free", op.stream, _free_where(op.where), op.thread)
        found = []
        region = self._region(acc.ptr, acc.ptr + acc.nbytes)
        if region is not None:
            races = region.access(
                region.ptr,
                region.end,
                "w",
                (actor.id, clock[actor.id], info),
                clock,
                self.clocks.host,
            )
            for _, earlier in races or ():
                found += self._report(FREE_IN_USE, region, earlier[2], info)
            self._forget(region.ptr, region.end)
            bisect.insort(self._freed_starts, region.ptr)
            self._freed[region.ptr] = (region.end, kept_free(info), region.label, region.where)
            if len(self._freed) > FREES_KEPT:
                self._unfree(next(iter(self._freed)))
        clock[actor.id] += 1
        return found

    def _copy(self, op: _trace.Operation) -> list[Finding]:
        found = self._accesses(op)
        dst = op.accesses[1] if len(op.accesses) == 2 else None
        if dst is not None and dst.host and not _host.page_locked(dst.ptr, dst.nbytes):
            # To pageable memory: the call returned once the copy was done.
            self._host_joins(self._enter(op.stream, op.thread).clock)
        return found

    def _accesses(self, op: _trace.Operation) -> list[Finding]:
        """Check and record the operation's accesses; one stamp for all of them (one per
        node for a graph launch). The hot path: nothing is made per access but what a race
        or memory first seen needs."""
        stream = op.stream
        clocks = self.clocks
        entry = stream._checked  # (`Clocks.enter`'s common case, inline)
        if (
            entry is not None
            and entry[0] == clocks.generation
            and not entry[1].gone
            and not entry[1].blocking
        ):
            actor = entry[1]
        else:
            actor = self._enter(stream, op.thread)
        host = clocks.host
        clock = actor.clock
        aid = actor.id
        epoch = clock[aid]
        kind = op.kind
        stamps = None
        if kind == "launch":
            name = op.kernel.name
            what = self._whats.get(name)
            if what is None:
                what = self._whats[name] = f"launch of {name!r}"
        elif kind == "graph_launch":  # each access names its node
            what = ""
            stamps = [
                (aid, epoch, (node_what(node), stream, op.where, op.thread))
                for node, acc in op.fields["nodes"]
                for _ in acc
            ]
        else:
            what = "fill" if kind == "memset" else "copy"
        stamp = (aid, epoch, (what, stream, op.where, op.thread))
        found: list[Finding] = []
        if kind == "launch":
            # The common case inline: a C-contiguous cuctx array that is the whole of a region
            # touched alike so far (no Access made); any other argument as `_access` checks
            # it, in the order of the parameters.
            plan, args, modes = op.launch
            regions = self._regions
            for n, i in enumerate(plan.pointers):
                arg = args[i]
                if type(arg) is DeviceArray and arg._c:
                    region = regions.get(arg.ptr)
                    exact = region.exact if region is not None else None
                    if (
                        exact is not None
                        and arg.dtype is exact[0]
                        and arg.shape == exact[1]
                        and len(region.segments) == 1
                    ):
                        # `touch` inline (a call costs as much): the last writer, and the
                        # readers for a write, unless ordered before this
                        seg = region.segments[0]
                        mode = modes[i]
                        w = seg.writer
                        if (
                            w is not None
                            and w[0] != aid
                            and clock.get(w[0], 0) <= w[1]
                            and host.get(w[0], 0) <= w[1]
                        ):  # (`ordered` inline)
                            found += self._races([(RAW if mode != "w" else WAW, w)], region, stamp)
                        if mode == "r":
                            seg.readers[aid] = stamp
                            continue
                        readers = seg.readers
                        if readers:
                            for r in readers.values():
                                if r[0] != aid and not ordered(r[0], r[1], clock, host):
                                    found += self._races([(WAR, r)], region, stamp)
                            seg.readers = {}
                        seg.writer = stamp
                        continue
                found += self._access(op.accesses[n], stamp, clock)
        else:
            for n, acc in enumerate(op.accesses):
                found += self._access(acc, stamp if stamps is None else stamps[n], clock)
        clock[aid] = epoch + 1
        return found

    def _access(self, acc: _trace.Access, stamp: tuple, clock: dict[int, int]) -> list[Finding]:
        """Check and record one access of an operation (``stamp``; its actor's ``clock``)."""
        lo, nbytes, mode, array, host = acc
        if host or not nbytes:
            return []  # host memory is the host's business
        hi = lo + nbytes
        region = self._regions.get(lo)
        if region is None or region.end != hi:
            region = self._region(lo, hi)
            if region is None:  # freed memory
                start = self._freed_in(lo, hi)[0]
                end, free, label, where = self._freed[start]
                free = named_free(free)
                freed = Region(start, end, where)  # (what it was, for the finding's words)
                freed.label = label
                return self._report(USE_AFTER_FREE, freed, free, stamp[2])
            hi = min(hi, region.end)
        if region.label is None and array is not None:
            region.label = label_of(array)
        if lo == region.ptr and hi == region.end and type(array) is DeviceArray and array._c:
            region.exact = (array.dtype, array.shape)  # (what `_accesses` looks for)
        races = region.access(lo, hi, mode, stamp, clock, self.clocks.host)
        return self._races(races, region, stamp) if races else []

    def _races(self, races: list[tuple[str, tuple]], region: Region, stamp: tuple) -> list[Finding]:
        found: list[Finding] = []
        for kind, earlier in races:
            found += self._report(kind, region, earlier[2], stamp[2])
        return found

    def _host_func(self, op: _trace.Operation) -> list[Finding]:
        self._enter(op.stream, op.thread)
        return []

    def _record(self, op: _trace.Operation) -> list[Finding]:
        clock = self._enter(op.stream, op.thread).clock
        self._events[op.event._key] = (dict(clock), weakref.ref(op.event))
        if len(self._events) > self._events_pruned_at:  # events that went away
            self._prune_events()
        return []

    def _wait_event(self, op: _trace.Operation) -> list[Finding]:
        join(self._enter(op.stream, op.thread).clock, self._snapshot(op.event))
        return []

    def _wait_stream(self, op: _trace.Operation) -> list[Finding]:
        other = self._enter(op.other, op.thread).clock
        join(self._enter(op.stream, op.thread).clock, other)
        return []

    def _sync_stream(self, op: _trace.Operation) -> list[Finding]:
        self._host_joins(self._enter(op.stream, op.thread).clock)
        return []

    def _sync_event(self, op: _trace.Operation) -> list[Finding]:
        self._host_joins(self._snapshot(op.event))
        return []

    def _sync_context(self, op: _trace.Operation) -> list[Finding]:
        self._host_joins(*(actor.clock for actor in self.clocks.of_context(op.context._key)))
        return []

    def _snapshot(self, event: Any) -> dict[int, int]:
        """The clock of the event's stream when it was last recorded ({}: nothing the host
        has not seen, or never recorded)."""
        entry = self._events.get(event._key)
        return entry[0] if entry is not None else {}

    # -- retiring ---------------------------------------------------------------------------

    def _host_joins(self, *clocks: dict[int, int]) -> None:
        self.clocks.host_joins(*clocks)
        if self.clocks.advanced() >= self._sweep_after:
            self._sweep()

    def _sweep(self) -> None:
        """Forget what the host has passed: stamps behind its clock (no later operation can
        race them), regions first seen in an access with nothing left (a later access makes
        them again), events whose clock it covers or that went away, and what
        `Clocks.prune` drops."""
        host = self.clocks.host
        idle = [
            start
            for start, region in self._regions.items()
            if region.retire(host) and region.where is None
        ]
        for start in idle:
            del self._regions[start]
        if idle:
            self._starts = sorted(self._regions)
        self._prune_events()
        self.clocks.prune()
        self._sweep_after = max(
            SWEEP_EVERY, len(self._regions) + len(self._events) + len(self.clocks)
        )

    def _prune_events(self) -> None:
        """Events that went away, or whose clock the host's covers, are forgotten (a wait for
        one adds nothing then); the others keep what the host has not seen."""
        host = self.clocks.host
        events = {}
        for key, (snapshot, event) in self._events.items():
            if event() is not None:
                beyond = {a: e for a, e in snapshot.items() if e > host.get(a, 0)}
                if beyond:
                    events[key] = (beyond, event)
        self._events = events
        self._events_pruned_at = 2 * len(events) + 64

    # -- memory -----------------------------------------------------------------------------

    def _add(self, region: Region) -> None:
        bisect.insort(self._starts, region.ptr)
        self._regions[region.ptr] = region

    def _forget(self, lo: int, hi: int) -> None:
        i = bisect.bisect_left(self._starts, lo)
        if i and self._regions[self._starts[i - 1]].end > lo:
            i -= 1
        while i < len(self._starts) and self._starts[i] < hi:
            del self._regions[self._starts.pop(i)]

    def _region(self, lo: int, hi: int) -> Region | None:
        """The live region holding ``lo`` (made for memory first seen here); None when the
        bytes were freed."""
        i = bisect.bisect_right(self._starts, lo) - 1
        region = self._regions[self._starts[i]] if i >= 0 else None
        if region is None or region.end <= lo:
            if self._freed_in(lo, hi):
                return None
            nxt = self._starts[i + 1] if i + 1 < len(self._starts) else hi
            region = Region(lo, min(hi, nxt), None)
            self._add(region)
        return region

    def _freed_in(self, lo: int, hi: int) -> list[int]:
        """The starts of the freed regions overlapping ``[lo, hi)``."""
        starts = self._freed_starts
        i = bisect.bisect_right(starts, lo) - 1
        if i < 0 or self._freed[starts[i]][0] <= lo:
            i += 1
        j = i
        while j < len(starts) and starts[j] < hi:
            j += 1
        return starts[i:j]

    def _unfree(self, start: int) -> None:
        del self._freed_starts[bisect.bisect_left(self._freed_starts, start)]
        del self._freed[start]

    # -- findings ---------------------------------------------------------------------------

    def _report(
        self, kind: str, region: Region | None, first: tuple, second: tuple
    ) -> list[Finding]:
        """A finding for the innermost scope, unless it reported this pair of lines already;
        every open scope lists it once. ``first`` and ``second``: `OpInfo`s, or stamps'
        infos (their where for the site)."""
        first, second = _named(first), _named(second)
        if kind != USE_AFTER_FREE and first.stream._ctx._state is not ACTIVE:
            return []  # its context was destroyed (its work ended) or faulted (work dropped)
        key = (kind, first.site, first.what, second.site, second.what)
        scopes = self.scopes
        if not scopes or key in scopes[-1]._seen:
            return []
        array = region.describe() if region is not None else "memory two nodes share"
        missing, fix = explain(kind, first, second, sys._getframe(1))
        finding = Finding(kind, array, first, second, missing, fix)
        for scope in scopes:
            if key not in scope._seen:
                scope._seen.add(key)
                scope.findings.append(finding)
        return [finding]


def _free_where(where: _trace.Where | None) -> _trace.Where | None:
    """A free runs from the array's finalizer: its user's line is the first frame outside
    cuctx and outside the weakref machinery that called it (``del x``, a rebinding)."""
    if where is None or not where[0].co_filename.endswith("weakref.py"):
        return where
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_filename
        if not name.startswith((_PACKAGE, _trace.GENERATED)) and not name.endswith("weakref.py"):
            return frame.f_code, frame.f_lasti
        frame = frame.f_back
    return None


def _named(info: tuple) -> OpInfo:
    """A stamp's info (what, stream, where, thread) as a finding names it."""
    if isinstance(info, OpInfo):
        return info
    what, stream, where, thread = info
    return OpInfo(what, stream, _trace.site_of(where), thread)
