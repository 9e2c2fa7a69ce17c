"""The race checker: a trace sink keeping happens-before between streams with vector clocks.

Actors are streams, per (context, stream; the per-thread default stream per host thread
too), and the host. Each actor has a vector clock (actor id -> epoch); an operation on a
stream takes the stream's epoch and then advances it, so an earlier operation (actor a, epoch
e) happens before a later one on a stream whose clock says ``clock[a] > e``. The edges:

- submission: a stream's work comes after what the host has seen finish;
- an event record snapshots the recording stream's clock; a wait (event or stream) joins it;
- stream, event and context synchronize, and a copy to pageable host memory (it returns once
  complete: CUDA's "API synchronization behavior"), join the host's clock;
- the legacy default stream and the blocking streams of its context join each other's clocks
  at each operation (its implicit barrier, both ways);
- a free is a write of the whole allocation on its stream; what frees release is remembered,
  so a later access there is a use after free, until a new allocation takes the range (pool
  reuse: a fresh history, ordered after the free).

The host is one actor for all threads: what one thread saw finish orders what every thread
submits after it. cuctx cannot see Python's thread starts, joins, locks and queues, which is
how programs hand work between threads once it is done ("synchronize, then start workers",
"synchronize, then put it in the queue"); a clock per thread would report those as races.
Work captured into a graph is skipped: it runs when the graph does.

One `Watch` keeps this history for every checker at once; what a finding then does (raise,
warn, collect) is the business of the scopes it reports to (`cuctx.racecheck` blocks and the
whole run's checker: _racecheck_run.py).
"""

from __future__ import annotations

import bisect
import os
import sys
import threading
from typing import Any

from ..memory import _host
from .. import _lifetimes, _trace
from .._resource import ACTIVE
from ..stream import LEGACY, PER_THREAD
from ._racecheck_shadow import (FREE_IN_USE, USE_AFTER_FREE, Finding, OpInfo, Region, Stamp)
from ._racecheck_words import explain, label, node_what, what

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


class Watch:
    """The race checker's history and its trace sink (`see`): every operation it is shown
    is checked against what it saw before, and each finding goes to ``scopes`` (objects
    with ``mode``, ``findings`` and ``_seen``: `RaceCheck`; the innermost last), which
    `_racecheck_run` keeps. ``lock`` guards the history and ``scopes``."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.scopes: list[Any] = []
        self.on = False  # registered as a trace sink
        self.backend: Any = None  # the active backend: only its operations are checked
        self._handlers = {kind: getattr(self, "_" + kind) for kind in _trace.KINDS}
        self.reset(None)

    def reset(self, backend: Any) -> None:
        """Forget everything seen (a new backend, or the checker was off for a while): work
        it did not see is never reported."""
        self.backend = backend
        self._actors: dict[tuple, int] = {}
        self._clocks: list[dict[int, int]] = []
        # The host: what any thread saw finish (it synchronized), one actor for all threads.
        self._host = self._actor(("host",))
        self._blocking: dict[int, list[int]] = {}  # context key -> its blocking stream actors
        self._legacy: dict[int, int] = {}  # context key -> its legacy stream's actor
        self._streams: dict[int, list[int]] = {}  # context key -> its stream actors
        self._events: dict[int, dict[int, int]] = {}  # event key -> snapshot
        self._starts: list[int] = []  # live regions, sorted by start
        self._regions: dict[int, Region] = {}
        # (start, end) -> the live region of exactly those bytes (whole arrays: most
        # accesses); emptied whenever the regions change.
        self._exact: dict[tuple[int, int], Region] = {}
        self._freed_starts: list[int] = []  # freed regions no allocation took again
        self._freed: dict[int, tuple[int, int, OpInfo, Region]] = {}
        self._graph_checked: dict[int, tuple] = {}
        # The host's clock changes only at synchronizations: each stream remembers the
        # version of it that it joined last, and skips joining it again.
        self._host_version = 0
        self._joined: dict[int, int] = {}  # stream actor -> host version

    # -- the sink ---------------------------------------------------------------------------

    def see(self, op: _trace.Operation) -> None:
        if op.context._backend is not self.backend:
            return  # an object of another backend (made before a switch): another address space
        stream = op.stream
        if stream is not None and _lifetimes.capturing and \
                (op.context._key, stream._key) in _lifetimes.capturing:
            return  # captured into a graph: it runs when the graph is launched
        with self.lock:
            found = self._handlers[op.kind](op)
            scope = self.scopes[-1] if self.scopes else None
        if scope is not None and (found or scope._pending):
            scope._tell(found, op)

    # -- clocks -----------------------------------------------------------------------------

    def _actor(self, key: tuple) -> int:
        actor = self._actors.get(key)
        if actor is None:
            actor = self._actors[key] = len(self._clocks)
            self._clocks.append({actor: 1})
        return actor

    def _host_joins(self, *clocks: dict[int, int]) -> None:
        """The host has seen what ``clocks`` say (a thread synchronized)."""
        host = self._clocks[self._host]
        for clock in clocks:
            _join(host, clock)
        self._host_version += 1

    def _stream(self, op: _trace.Operation, stream: Any = None) -> tuple[int, dict[int, int]]:
        """The stream's actor and clock, after the edges into it: the host's clock, and the
        legacy stream's barrier."""
        stream = stream or op.stream
        ctx_key, key = stream._ctx._key, stream._key
        key = LEGACY if key == 0 else key
        full = (ctx_key, key, op.thread if key == PER_THREAD else 0)
        actor = self._actors.get(full)
        if actor is None:
            actor = self._actor(full)
            self._streams.setdefault(ctx_key, []).append(actor)
            if key == LEGACY:
                self._legacy[ctx_key] = actor
            if self._is_blocking(stream, key):
                self._blocking.setdefault(ctx_key, []).append(actor)
        clock = self._clocks[actor]
        if self._joined.get(actor) != self._host_version:
            _join(clock, self._clocks[self._host])
            self._joined[actor] = self._host_version
        legacy = self._legacy.get(ctx_key)
        if legacy is not None and legacy != actor:
            if actor in self._blocking.get(ctx_key, ()):
                _join(clock, self._clocks[legacy])
        elif legacy == actor:
            for other in self._blocking.get(ctx_key, ()):
                if other != actor:
                    _join(clock, self._clocks[other])
        return actor, clock

    def _is_blocking(self, stream: Any, key: int) -> bool:
        if key in (LEGACY, PER_THREAD):
            return True
        drv = stream._backend.driver
        query = getattr(drv, "cuStreamGetFlags", None)
        if query is None:  # the sim does not answer it yet: its own stream table does
            sim = getattr(drv, "_streams", {}).get(stream._key)
            return sim is not None and not sim.flags & 1
        err, flags = query(stream._handle)
        return not err and not int(flags) & 1  # CU_STREAM_NON_BLOCKING

    # -- operations ---------------------------------------------------------------------------

    def _alloc(self, op: _trace.Operation) -> list[Finding]:
        self._stream(op)
        acc = op.accesses[0]
        lo, hi = acc.ptr, acc.ptr + acc.nbytes
        for start in self._freed_in(lo, hi):  # the pool reused it: a fresh history
            self._freed_starts.remove(start)
            del self._freed[start]
        self._forget(lo, hi)
        self._add(Region(lo, hi, op.site))
        return []

    def _free(self, op: _trace.Operation) -> list[Finding]:
        actor, clock = self._stream(op)
        acc = op.accesses[0]
        info = OpInfo("free", op.stream, _free_site(op.site), op.thread)
        stamp = Stamp(actor, clock[actor], info)
        found = []
        region = self._region(acc.ptr, acc.ptr + acc.nbytes, acc)
        if region is not None:
            for _, earlier in region.access(region.ptr, region.end, "w", stamp, clock):
                found += self._report(FREE_IN_USE, region, earlier.op, info)
            self._forget(region.ptr, region.end)
            bisect.insort(self._freed_starts, region.ptr)
            self._freed[region.ptr] = (region.ptr, region.end, info, region)
        clock[actor] += 1
        return found

    def _copy(self, op: _trace.Operation) -> list[Finding]:
        found = self._accesses(op)
        dst = op.accesses[1] if len(op.accesses) == 2 else None
        if dst is not None and dst.host and not _host.page_locked(dst.ptr, dst.nbytes):
            # To pageable memory: the call returned once the copy was done.
            self._host_joins(self._clocks[self._stream(op)[0]])
        return found

    def _launch(self, op: _trace.Operation) -> list[Finding]:
        return self._accesses(op)

    _memset = _launch

    def _graph_launch(self, op: _trace.Operation) -> list[Finding]:
        """The nodes' accesses; the graph's event wait nodes count as waits before them, its
        record nodes as records after them (ordering no more than the graph does)."""
        events = [(node.kind, node.keep[0]) for node in op.fields["graph"].nodes
                  if node.kind in ("record", "wait") and node.keep]
        _, clock = self._stream(op)
        for kind, event in events:
            if kind == "wait":
                _join(clock, self._events.get(event._key, {}))
        found = self._accesses(op) + self._inside_graph(op)
        for kind, event in events:
            if kind == "record":
                self._events[event._key] = dict(clock)
        return found

    def _accesses(self, op: _trace.Operation) -> list[Finding]:
        actor, clock = self._stream(op)
        found: list[Finding] = []
        epoch = clock[actor]
        if op.kind == "graph_launch":  # each access names its node
            stamps = [Stamp(actor, epoch, OpInfo(node_what(node), op.stream, op.site,
                                                 op.thread))
                      for node, acc in op.fields["nodes"] for _ in acc]
        else:
            stamps = [Stamp(actor, epoch, OpInfo(what(op), op.stream, op.site,
                                                 op.thread))] * len(op.accesses)
        for acc, stamp in zip(op.accesses, stamps):
            nbytes = acc.nbytes
            if acc.host or not nbytes:
                continue  # host memory is the host's business
            lo = acc.ptr
            hi = lo + nbytes
            region = self._exact.get((lo, hi)) or self._region(lo, hi, acc)
            if region is None:  # freed memory
                freed = self._freed_at(lo, hi)
                found += self._report(USE_AFTER_FREE, freed[3], freed[2], stamp.op)
                continue
            if lo < region.ptr or hi > region.end:
                lo, hi = max(lo, region.ptr), min(hi, region.end)
            races = region.access(lo, hi, acc.mode, stamp, clock)
            for kind, earlier in races:
                found += self._report(kind, region, earlier.op, stamp.op)
        clock[actor] += 1
        return found

    def _host_func(self, op: _trace.Operation) -> list[Finding]:
        self._stream(op)
        return []

    def _record(self, op: _trace.Operation) -> list[Finding]:
        _, clock = self._stream(op)
        self._events[op.event._key] = dict(clock)
        return []

    def _wait_event(self, op: _trace.Operation) -> list[Finding]:
        _, clock = self._stream(op)
        _join(clock, self._events.get(op.event._key, {}))
        return []

    def _wait_stream(self, op: _trace.Operation) -> list[Finding]:
        _, other = self._stream(op, op.other)
        _, clock = self._stream(op)
        _join(clock, other)
        return []

    def _sync_stream(self, op: _trace.Operation) -> list[Finding]:
        self._host_joins(self._stream(op)[1])
        return []

    def _sync_event(self, op: _trace.Operation) -> list[Finding]:
        self._host_joins(self._events.get(op.event._key, {}))
        return []

    def _sync_context(self, op: _trace.Operation) -> list[Finding]:
        self._host_joins(*(self._clocks[actor]
                                      for actor in self._streams.get(op.context._key, ())))
        return []

    # -- memory -----------------------------------------------------------------------------

    def _add(self, region: Region) -> None:
        bisect.insort(self._starts, region.ptr)
        self._regions[region.ptr] = region
        self._exact.clear()

    def _forget(self, lo: int, hi: int) -> None:
        i = bisect.bisect_left(self._starts, lo)
        if i and self._regions[self._starts[i - 1]].end > lo:
            i -= 1
        while i < len(self._starts) and self._starts[i] < hi:
            del self._regions[self._starts.pop(i)]
        self._exact.clear()

    def _region(self, lo: int, hi: int, acc: _trace.Access) -> Region | None:
        """The live region holding ``lo`` (made for memory first seen here); None when the
        bytes were freed."""
        i = bisect.bisect_right(self._starts, lo) - 1
        region = self._regions[self._starts[i]] if i >= 0 else None
        if region is None or region.end <= lo:
            if self._freed_at(lo, hi) is not None:
                return None
            nxt = self._starts[i + 1] if i + 1 < len(self._starts) else hi
            region = Region(lo, min(hi, nxt), None)
            self._add(region)
        if not region.label and acc.array is not None:
            region.label = label(acc.array)
        if region.ptr == lo and region.end == hi and region.label:
            self._exact[lo, hi] = region
        return region

    def _freed_in(self, lo: int, hi: int) -> list[int]:
        """The starts of the freed regions overlapping ``[lo, hi)``."""
        starts = self._freed_starts
        i = bisect.bisect_right(starts, lo) - 1
        if i < 0 or self._freed[starts[i]][1] <= lo:
            i += 1
        j = i
        while j < len(starts) and starts[j] < hi:
            j += 1
        return starts[i:j]

    def _freed_at(self, lo: int, hi: int) -> tuple | None:
        found = self._freed_in(lo, hi)
        return self._freed[found[0]] if found else None

    # -- graphs -----------------------------------------------------------------------------

    def _inside_graph(self, op: _trace.Operation) -> list[Finding]:
        """Nodes of one launch that touch the same bytes, one writing, with no path between
        them in the graph: checked once per executable and set of ranges."""
        nodes = op.fields["nodes"]
        key = tuple((a.ptr, a.nbytes, a.mode) for _, acc in nodes for a in acc)
        exe = op.fields["exec"]
        if self._graph_checked.get(id(exe)) == key:
            return []
        self._graph_checked[id(exe)] = key
        graph = op.fields["graph"]
        conflicts = [(a, b) for i, (a, acc_a) in enumerate(nodes) for b, acc_b in nodes[i + 1:]
                     if _conflict(acc_a, acc_b)]
        if not conflicts:
            return []
        after: dict[Any, set] = {}
        for src, dst in graph.edges:
            after.setdefault(src, set()).add(dst)
        found: list[Finding] = []
        for a, b in conflicts:
            if not (_reaches(after, a, b) or _reaches(after, b, a)):
                first = OpInfo(node_what(a), op.stream, a.site, op.thread)
                second = OpInfo(node_what(b), op.stream, b.site, op.thread)
                found += self._report("unordered nodes of one graph", None, first, second)
        return found

    # -- findings ---------------------------------------------------------------------------

    def _report(self, kind: str, region: Region | None, first: OpInfo,
                second: OpInfo) -> list[Finding]:
        """A finding for the innermost scope, unless it reported this pair of lines already;
        every open scope lists it once."""
        if kind != USE_AFTER_FREE and first.stream._ctx._state is not ACTIVE:
            return []  # its context was destroyed (its work ended) or faulted (work dropped)
        key = (kind, first.site, first.what, second.site, second.what)
        scopes = self.scopes
        if not scopes or key in scopes[-1]._seen:
            return []
        array = region.describe() if region is not None else "memory two nodes share"
        missing, fix = explain(kind, first, second, sys._getframe(3))
        finding = Finding(kind, array, first, second, missing, fix)
        for scope in scopes:
            if key not in scope._seen:
                scope._seen.add(key)
                scope.findings.append(finding)
        return [finding]


def _free_site(site: tuple[str, int, str] | None) -> tuple[str, int, str] | None:
    """A free runs from the array's finalizer: its user's line is the first frame outside
    cuctx and outside the weakref machinery that called it (``del x``, a rebinding)."""
    if site is None or not site[0].endswith("weakref.py"):
        return site
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_filename
        if not name.startswith((_PACKAGE, _trace.GENERATED)) and not name.endswith("weakref.py"):
            return name, frame.f_lineno, frame.f_code.co_name
        frame = frame.f_back
    return None


def _join(into: dict[int, int], other: dict[int, int]) -> None:
    for actor, epoch in other.items():
        if into.get(actor, 0) < epoch:
            into[actor] = epoch


def _conflict(a: tuple, b: tuple) -> bool:
    return any(x.ptr < y.ptr + y.nbytes and y.ptr < x.ptr + x.nbytes and
               ("w" in x.mode or "w" in y.mode) for x in a for y in b if not x.host)


def _reaches(after: dict, a: Any, b: Any) -> bool:
    todo, seen = [a], set()
    while todo:
        n = todo.pop()
        for m in after.get(n, ()):
            if m is b:
                return True
            if m not in seen:
                seen.add(m)
                todo.append(m)
    return False
