"""`@cuctx.autograph`: a function that enqueues cuctx work runs as a CUDA graph when that
pays, and eagerly when it does not, with the same results either way.

Each call records what the function enqueues (`_autograph_record.Recording`) instead of
enqueuing it, its temporaries borrowing the memory of earlier calls (`_autograph_arena`),
then compares it with what earlier calls recorded:

- same structure and values: launch the executable made for that structure;
- same structure, other values (new arrays, new scalars): patch the changed nodes, or
  update the whole graph when that is cheaper;
- a structure seen for the first time runs eagerly (the recorded operations are enqueued
  as they would have been); once it repeats and a graph pays, a graph is built
  (`_autograph_build`), cached by structure (least recently used first out, bounded by
  ``max_graphs`` and an estimate of the bytes, ``max_bytes``).

Whether graphs pay is the policy's (`_autograph_policy`: host costs, modelled on the sim,
measured on a GPU): it decides when to build, patch or update whole; after `SWITCH_AFTER`
graph calls in a row costing more than eager ones the structure runs eagerly, and after as
many eager calls in a row for which graph calls are predicted cheaper by `MARGIN` it goes
back to its graph. A call that does what a graph cannot hold (a synchronize, a query, a
pageable copy) runs eagerly from the start: what was recorded before it is enqueued first;
so does a call whose streams are being captured, and one that would build a graph while a
capture forbids instantiating one (it would break that capture). Where the backend has the
compiled path, every step of a call runs in C (`cuctx._native`: csrc/autograph_call.c, the
call; autograph_serve.c, a graph call of structures of kernels on one stream, and the
launches of an eager call; autograph.c, the recording, the comparisons, the patches and the
launch; arrays.c, the temporaries): this module is the reference, and serves the rest.
Everything is counted, timed and explained: `AutoGraph.stats`, `AutoGraph.explain`.
"""

from __future__ import annotations

import functools
import threading
import types
from collections import OrderedDict, deque
from itertools import compress
from operator import ne
from time import perf_counter
from typing import Any, Callable

from .. import _lifetimes, _record, _trace
from ..kernels._launcher import Launcher
from .._lifetimes import defer_cleanup
from ..errors import CudaError
from ._autograph_arena import Arena
from ._autograph_build import construct, launch, patch, patchable, patcher
from ._autograph_policy import MARGIN, SWITCH_AFTER, Policy, Why, mean, us
from ._autograph_record import _DEFERRED, Recording
from ._autograph_state import EAGER, GRAPH, Entry, Tally, difference, said, site_of
from ._capture_rules import _captured, forbidding_instantiation

REASONS_KEPT = 256  # the latest reasons stats() lists


class AutoGraph:
    """A function whose cuctx work runs as a CUDA graph when that pays (see
    `cuctx.autograph`). Call it as the function; `stats` and `explain` tell what happened."""

    # What the compiled per-call path reads and writes are slots (cuctx/csrc/autograph_call.c);
    # __dict__ holds what functools.update_wrapper copies from the function.
    __slots__ = (
        "_fn",
        "max_graphs",
        "max_bytes",
        "_lock",
        "_cache",
        "_last",
        "_tally",
        "_arena",
        "_reasons",
        "_policy",
        "__dict__",
        "__weakref__",
    )

    def __init__(self, fn: Callable, max_graphs: int = 16, max_bytes: int = 256 << 20) -> None:
        if not callable(fn):
            raise TypeError(f"autograph decorates a function, not {type(fn).__name__}")
        for test, what, returns in _DEFERRED:
            if test(fn):  # its body runs after the call returns: nothing would be recorded
                raise TypeError(
                    f"autograph: {getattr(fn, '__qualname__', fn)!r} is {what}: calling it "
                    f"returns {returns} and runs its body later, outside the call autograph "
                    "records, so nothing would be recorded; decorate a plain function that "
                    "enqueues the GPU work and returns, and call that from it"
                )
        for name, value in (("max_graphs", max_graphs), ("max_bytes", max_bytes)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"autograph: {name} must be an int >= 1, not {value!r}")
        functools.update_wrapper(self, fn)
        self._fn = fn
        self.max_graphs = max_graphs
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._cache: OrderedDict[tuple, Entry] = OrderedDict()  # least recently used first
        self._last: Entry | None = None
        self._tally = Tally()
        self._arena = Arena()  # the memory of the calls' temporaries
        self._reasons: deque[tuple] = deque(maxlen=REASONS_KEPT)  # see _note
        self._policy = Policy()

    def __get__(self, obj: Any, cls: Any = None) -> Any:
        return self if obj is None else types.MethodType(self, obj)

    # -- a call (the compiled path, where there is one, does the same: _native_hooks) ------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if _record.current() is not None:  # inside another autograph call: that one records
            return self._fn(*args, **kwargs)
        recording = Recording(self._arena)
        start = perf_counter()
        # Frees of memory the call drops wait until its work is enqueued (it may use it).
        with defer_cleanup():
            _record.start(recording)
            try:
                result = self._fn(*args, **kwargs)
            except BaseException as exc:
                self._failed(recording, start, exc)
                raise
            if recording.broken is not None:
                self._broken(recording, start)
                return result
            _record.stop()
            recorded = perf_counter()
            with self._lock:
                self._tally.calls += 1
                self._tally.recording_s += recorded - start
                self._run(recording)
                self._arena.trim(self.max_bytes)
        return result

    def _failed(self, recording: Recording, start: float, exc: BaseException) -> None:
        """The function raised: what it enqueued before runs (as eagerly it would have)."""
        if recording.broken is None:
            _record.stop()
            recording.enqueue_all()
        self._ran_eagerly(
            start,
            f"the function raised {type(exc).__name__}: what it enqueued before ran eagerly",
            site_of(exc),
        )

    def _broken(self, recording: Recording, start: float) -> None:
        operation, site = recording.broken
        self._ran_eagerly(
            start,
            f"{operation} cannot be part of a graph: the work recorded "
            "before it ran eagerly, then the rest of the call",
            site,
        )

    def _ran_eagerly(self, start: float, reason: str, site: tuple | None) -> None:
        with self._lock:
            tally = self._tally
            tally.calls += 1
            tally.eager += 1
            tally.eager_s += perf_counter() - start
            self._note("eager", reason, site)

    def _run(self, recording: Recording) -> None:
        """Serve a complete recording: eagerly, by a build, a replay or an update."""
        if _lifetimes.capturing:
            captured = _captured(recording)
            if captured is not None:  # its work goes into that capture, as eagerly
                return self._eager(
                    None,
                    recording,
                    (
                        f"its {captured!r} is being captured (Stream.capture): the recorded work "
                        "went into the capture, as eager work does"
                    ),
                )
        keys = recording.keys
        last = self._last
        policy = self._policy
        if last is not None and last.size == len(keys) and last.keys == keys:
            entry = last
        else:
            key = tuple(keys)
            entry = self._cache.get(key)
            if entry is None:
                entry = self._cache[key] = Entry(key, recording)
                self._trim()
                what = (
                    f"a structure not seen before ({difference(last, keys)})"
                    if keys
                    else "the call enqueued no work"
                )
                self._last = entry
                entry.seen = 1
                policy.called(entry)
                return self._eager(entry, recording, what)
            self._cache.move_to_end(key)
        self._last = entry
        entry.seen += 1
        policy.called(entry)
        if policy.measured is None and recording.ctx is not None:  # modelled on the sim
            policy.measured = recording.ctx._backend.sim is None
        changed = self._changed(entry, recording)
        entry.changes = mean(entry.changes, len(changed))
        if entry.exe is None:
            why_not = policy.why_not_build(entry)
            if why_not:
                entry.values = recording.values
                return self._eager(entry, recording, why_not)
            return self._build(entry, recording)
        if entry.mode is EAGER:
            predicted, eager = policy.predict(entry, changed), policy.eager(entry)
            entry.strikes = entry.strikes + 1 if predicted < eager * (1 - MARGIN) else 0
            if entry.strikes < SWITCH_AFTER:
                return self._eager(
                    entry,
                    recording,
                    Why(
                        "graphs did not pay for this structure; a graph call is predicted at {} "
                        "against {} eager",
                        predicted,
                        eager,
                    ),
                )
            entry.mode, entry.strikes = GRAPH, 0
            self._note(
                "graph",
                f"back to the graph: predicted {us(predicted)} against "
                f"{us(eager)} eager for {SWITCH_AFTER} calls",
            )
        self._graph_call(entry, recording, changed)

    # -- eager, build, replay, update -----------------------------------------------------------

    def _eager(self, entry: Entry | None, recording: Recording, reason: str) -> None:
        t0 = perf_counter()
        recording.enqueue_all()
        spent = perf_counter() - t0
        if entry is not None:
            self._policy.eager_took(entry, spent)
        self._tally.eager += 1
        self._tally.eager_s += spent
        self._note("eager", reason)

    def _build(self, entry: Entry, recording: Recording, reason: str | None = None) -> None:
        if _lifetimes.capturing and forbidding_instantiation():  # it would break the capture
            if entry.exe is None:
                entry.values = recording.values
            return self._eager(
                entry,
                recording,
                (
                    'a capture forbids instantiating a graph now (a "thread_local" or '
                    '"global" one of this thread, or a "global" one of another): ran '
                    "eagerly, and a later call builds it"
                ),
            )
        t0 = perf_counter()
        try:
            graph, nodes, size = construct(recording)
            t1 = perf_counter()
            if size > self.max_bytes:
                raise ValueError(
                    f"its graph (about {size} bytes) would exceed max_bytes={self.max_bytes}"
                )
            exe = graph.instantiate()
        except (CudaError, TypeError, ValueError) as exc:
            entry.blocked = f"building its graph failed: {exc}"
            entry.values = recording.values
            return self._eager(entry, recording, f"no graph for this structure: {exc}")
        built = perf_counter()
        if entry.exe is not None:
            entry.exe.destroy()
        entry.exe, entry.nodes, entry.bytes = exe, nodes, size
        entry.simple = patchable(nodes, range(len(nodes)))
        native = recording.ctx._backend.native
        entry.patcher = None if native is None else patcher(native, exe, nodes)
        entry.compiled = (
            entry.patcher is not None
            and len(recording.streams) == 1
            and all(key.__class__ is Launcher for key in entry.key)
        )
        entry.values = recording.values
        entry.mode, entry.strikes = GRAPH, 0
        self._policy.built(entry, t1 - t0, built - t0, recording.ctx.handle)
        launch(entry, recording)
        self._tally.builds += 1
        self._tally.build_s += perf_counter() - t0
        self._note(
            "build",
            reason
            or Why(
                "the structure repeated ({} calls): built a graph of {} nodes",
                entry.seen,
                len(graph),
            ),
        )
        self._trim()

    def _graph_call(self, entry: Entry, recording: Recording, changed: list[int]) -> None:
        """Patch what changed (or update the whole graph) and launch: what the compiled
        path's `serve` does for the structures it takes (``entry.compiled``)."""
        policy = self._policy
        t0 = perf_counter()
        estimate = 0.0
        if changed:
            try:
                estimate = self._update(entry, recording, changed)
            except CudaError as exc:  # a refused update (GraphUpdateError): build anew
                return self._rebuild(entry, recording, exc)
        t1 = perf_counter()
        launch(entry, recording)
        t2 = perf_counter()
        tally = self._tally
        if changed:
            tally.updates += 1
            tally.update_s += t1 - t0
            tally.replay_s += t2 - t1
        else:
            tally.replays += 1
            tally.replay_s += t2 - t0
        cost = t2 - t0 if policy.measured else policy.replay(entry) + estimate
        policy.launched(entry, t2 - t1)
        entry.values = recording.values
        eager = policy.eager(entry)
        tally.saved_s += eager - cost
        entry.strikes = entry.strikes + 1 if cost > eager else 0
        if entry.strikes >= SWITCH_AFTER:
            self._give_way(entry, cost, eager, len(changed))

    def _rebuild(self, entry: Entry, recording: Recording, refusal: CudaError) -> None:
        self._build(entry, recording, f"rebuilt: the update was refused: {refusal}")

    def _give_way(self, entry: Entry, cost: float, eager: float, changed: int) -> None:
        entry.mode, entry.strikes = EAGER, 0
        self._note(
            "eager",
            f"graph calls cost more than eager ones ({us(cost)} against "
            f"{us(eager)}, {changed} changed operations): running this "
            "structure eagerly until graphs pay again",
        )

    def _changed(self, entry: Entry, recording: Recording) -> list[int]:
        """The indices of the values that differ from those the entry holds."""
        new, old = recording.values, entry.values
        native = recording.ctx._backend.native if recording.ctx is not None else None
        if native is not None:
            return native.changed(new, old)
        if new == old:
            return []
        return list(compress(range(len(new)), map(ne, new, old)))

    def _update(self, entry: Entry, recording: Recording, changed: list[int]) -> float:
        """Patch the changed nodes, or update the whole graph where that is cheaper; the
        seconds the policy expected it to cost."""
        policy = self._policy
        by_node, estimate = policy.update(entry, changed)
        t0 = perf_counter()
        if by_node:
            patched = patch(entry.exe, entry.nodes, recording, changed, entry.patcher)
            policy.patched(perf_counter() - t0, patched)
            self._tally.patched_nodes += patched
            return estimate
        graph, _, _ = construct(recording)
        entry.exe.update(graph)
        if entry.patcher is not None:  # its slots were the old graph's
            entry.patcher = patcher(recording.ctx._backend.native, entry.exe, entry.nodes)
        self._tally.patched_nodes += len(graph.nodes)
        policy.updated_whole(entry, perf_counter() - t0)
        return estimate

    def _trim(self) -> None:
        """Keep at most max_graphs executables of at most max_bytes, and four times as many
        structures: the least recently used go first."""
        cache = self._cache
        while len(cache) > 4 * self.max_graphs:
            self._evict(next(iter(cache)))
        built = [e for e in cache.values() if e.exe is not None]
        total = sum(e.bytes for e in built)
        for entry in built[:-1]:  # the most recent one stays
            if len(built) <= self.max_graphs and total <= self.max_bytes:
                break
            self._evict(entry.key)
            built.remove(entry)
            total -= entry.bytes

    def _evict(self, key: tuple) -> None:
        entry = self._cache.pop(key)
        if entry.exe is not None:
            entry.exe.destroy()
            entry.exe = entry.patcher = None
            entry.compiled = False
        if self._last is entry:
            self._last = None

    # -- explaining -----------------------------------------------------------------------

    def _note(self, action: str, reason: str | Why, site: tuple | None = None) -> None:
        # Kept as given, made words by stats(): most are an eager call's, and never read.
        self._reasons.append((self._tally.calls, action, reason, site or _trace.user_where()))

    def stats(self) -> dict[str, Any]:
        """Counts (``calls`` = ``replays`` + ``updates`` + ``builds`` + ``eager``), seconds
        spent in each (``recording_s``, ``replay_s``, ``update_s``, ``build_s``,
        ``eager_s``), ``saved_s`` (estimated: eager time of the calls graphs served minus
        what they cost), ``patched_nodes`` (graph nodes patched so far: a whole update
        counts every node), the cache (``graphs``, ``bytes``, ``structures``), ``temp_bytes``
        (device memory kept for the calls' temporaries) and ``reasons``:
        the latest eager calls, builds and switches, each with the call's number, its
        ``action``, the ``reason`` and the user's ``site`` ("file:line")."""
        with self._lock:
            built = [e for e in self._cache.values() if e.exe is not None]
            return {
                **self._tally.as_dict(),
                "graphs": len(built),
                "bytes": sum(e.bytes for e in built),
                "temp_bytes": self._arena.bytes,
                "structures": len(self._cache),
                "reasons": [said(*reason) for reason in self._reasons],
            }

    def explain(self) -> str:
        """Print what the calls did and why (a table of `stats`); return the text."""
        s = self.stats()
        name = getattr(self._fn, "__qualname__", repr(self._fn))
        lines = [
            f"autograph {name}: {s['calls']} calls",
            f"  {'replays':>8} {'updates':>8} {'builds':>8} {'eager':>8}",
            f"  {s['replays']:>8} {s['updates']:>8} {s['builds']:>8} {s['eager']:>8}",
            "  time (ms): "
            + ", ".join(
                f"{k} {s[k + '_s'] * 1e3:.3f}"
                for k in ("recording", "replay", "update", "build", "eager")
            ),
            f"  saved (estimated): {s['saved_s'] * 1e3:.3f} ms; nodes patched: "
            f"{s['patched_nodes']}",
            f"  cache: {s['graphs']} of {self.max_graphs} graphs, ~{s['bytes']} of "
            f"{self.max_bytes} bytes; {s['structures']} structures known; "
            f"{s['temp_bytes']} bytes kept for temporaries",
        ]
        if s["reasons"]:
            lines.append("  why:")
            lines += [
                f"    call {r['call']:>5}  {r['action']:<6} {r['reason']}"
                + (f"  (at {r['site']})" if r["site"] else "")
                for r in s["reasons"]
            ]
        text = "\n".join(lines)
        print(text)
        return text

    def clear(self) -> None:
        """Destroy the cached executables, forget the structures and give back the memory
        kept for temporaries (the counts stay)."""
        with self._lock:
            for key in list(self._cache):
                self._evict(key)
            self._arena.clear()

    def __repr__(self) -> str:
        # No lock: a repr must not wait (a debugger may print it while a call holds it).
        built = sum(1 for e in list(self._cache.values()) if e.exe is not None)
        return (
            f"<autograph {getattr(self._fn, '__qualname__', self._fn)!r}: "
            f"{self._tally.calls} calls, {built} of {self.max_graphs} graphs built>"
        )


def autograph(
    fn: Callable | None = None, *, max_graphs: int = 16, max_bytes: int = 256 << 20
) -> Any:
    """Run ``fn``'s cuctx work as CUDA graphs where that pays: ``@cuctx.autograph`` or
    ``@cuctx.autograph(max_graphs=16, max_bytes=256 << 20)``. Each call records what
    ``fn`` enqueues (on the stream of its first operation and on the other streams of that
    context) and replays, patches or builds a graph for it, or runs it eagerly; results are
    those of calling ``fn`` itself. ``max_graphs`` executables are kept, of about
    ``max_bytes`` in all. ``fn.stats()`` and ``fn.explain()`` say what happened and why.
    See docs/graphs.md, "AutoGraph"."""
    if fn is None:
        return lambda f: AutoGraph(f, max_graphs, max_bytes)
    return AutoGraph(fn, max_graphs, max_bytes)
