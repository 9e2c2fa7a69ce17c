"""`cuctx.timeline()`: every operation's host submission and its execution on the device, per
device, context and stream.

The timeline is a trace sink (cuctx._trace): each operation is announced after the driver
accepted it, with its kind, context, stream, call site and host time. Before each operation
the timeline has an external correlation id pushed on the submitting thread; the sink notes
that id on the operation and pushes the next one, so the work the driver reports for an
operation carries that operation's id. Executions come from a source (_timeline_sources):
the sim's activity feed, CUPTI (tools/_cupti.py), or event pairs (approximate). Leaving the
block waits for the work recorded, then matches executions to operations by id.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

from cuda.bindings.driver import CUstreamCaptureMode, CUstreamCaptureStatus

from .. import _driver, _lifetimes, _trace
from .._resource import ACTIVE
from ..context import in_context
from ._timeline_export import chrome_trace, save_png, summarize
from . import _cupti
from ._names import names_of, user_scope
from ._timeline_sources import MARKERS, WORK, EventPairs, Execution, Record, SimActivity, Source
from ._timeline_sources import stream_key as _key

_RELAXED = CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED
_NONE = CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE


class Timeline:
    """Use through `cuctx.timeline()`. ``source``: "auto" (the sim's feed on the sim, CUPTI
    on a GPU, else event pairs), "activity" (the feed or CUPTI, or raise) or "events" (event
    pairs, approximate, on either backend)."""

    def __init__(self, source: str = "auto") -> None:
        if source not in ("auto", "activity", "events"):
            raise ValueError(
                f"timeline source must be 'auto', 'activity' or 'events', not {source!r}"
            )
        self._want = source
        self._source: Source | None = None
        self._ops: list[tuple[int | None, _trace.Operation, int]] = []
        self._records: list[Record] | None = None
        # What the user's code calls each stream, per (context, stream) key: the names found
        # at each line that submitted work to it (looked up once per stream and line).
        self._names: dict[tuple[int, int], list[str]] = {}
        self._looked: set[tuple[int, tuple[str, int, str]]] = set()  # (id(stream), site)
        self._thread = 0
        self._next = 1
        # the source's methods the sink calls, bound once (see __enter__)
        self._advance: Any = None
        self._host_ns: Any = None
        self._submitted: Any = None

    # -- the block ------------------------------------------------------------------------

    def __enter__(self) -> Timeline:
        if self._source is not None:
            raise RuntimeError("a timeline records one block; make a new cuctx.timeline()")
        backend = _driver.active()
        self._source = choose_source(backend, self._want)
        self._thread = threading.get_ident()
        source = self._source
        self._advance, self._host_ns = source.advance, source.host_ns
        # a source that learns nothing from submissions is not called for them
        self._submitted = None if type(source).submitted is Source.submitted else source.submitted
        source.start(self._next)
        _trace.add_sink(self._sink)
        return self

    def __exit__(self, *exc: object) -> None:
        _trace.remove_sink(self._sink)
        self._wait_for_work()
        executions = self._source.stop()
        self._records = _assemble(self._ops, executions, self._source.approximate)

    def _sink(self, op: _trace.Operation) -> None:
        if op.thread == self._thread and op.kind in _CORRELATED:
            # (only the entering thread moves the ids on: no lock)
            corr = self._next
            self._next = corr + 1
            self._advance(corr + 1)
        else:
            # The id stack is per thread and only the entering thread's is cuctx's: work from
            # other threads shows on its stream, without a submission arrow. An operation
            # that runs nothing on the device (an allocation, a synchronize) takes no id: the
            # next one's work carries the id it was pushed under.
            corr = None
        self._ops.append((corr, op, self._host_ns(op)))
        if self._submitted is not None and not (
            _lifetimes.capturing
            and op.stream is not None
            and (op.context._key, op.stream._key) in _lifetimes.capturing
        ):
            self._submitted(op, corr)  # work captured into a graph runs at its launches
        site = op.site
        if site is not None:
            looked = self._looked
            stream, other = op.stream, op.other
            if (stream is not None and (id(stream), site) not in looked) or (
                other is not None and (id(other), site) not in looked
            ):
                self._learn_names(op)

    def _learn_names(self, op: _trace.Operation) -> None:
        """Note the names the user's frame at the operation's line has for its streams (the
        sink runs inside that line); each stream is looked up once per line (by identity:
        the operations the timeline keeps keep their streams alive)."""
        scope = None
        for stream in (op.stream, op.other):
            if stream is None or (id(stream), op.site) in self._looked:
                continue
            self._looked.add((id(stream), op.site))
            if scope is None:
                scope = user_scope(sys._getframe(2), op.site)
            names = self._names.setdefault(_key(stream.context, stream), [])
            names += [n for n in names_of(stream, scope) if n not in names]

    def _wait_for_work(self) -> None:
        """Every context the block used, synchronized through the driver (not through cuctx,
        so that other sinks, a race checker, see no synchronization the user did not write);
        a context that fails is left for the user's next call to report. While a capture is
        active, CUDA refuses to synchronize a context with a capturing stream (and the
        capture would end without a graph): the block's streams that are not captured are
        synchronized instead, one by one, with this thread's capture mode relaxed so that
        the driver allows it."""
        seen = {id(op.context): op.context for _, op, _ in self._ops if op.context is not None}
        if _lifetimes.capturing:
            return self._wait_beside_captures(seen.values())
        for ctx in seen.values():
            if ctx._state is ACTIVE:
                with in_context(ctx, "timeline"):
                    ctx._backend.driver.cuCtxSynchronize()

    def _wait_beside_captures(self, contexts) -> None:
        contexts = [ctx for ctx in contexts if ctx._state is ACTIVE]
        if not contexts:
            return
        streams = {
            (op.context._key, op.stream._key): op.stream
            for _, op, _ in self._ops
            if op.stream is not None
        }
        drv = contexts[0]._backend.driver
        _, mode = drv.cuThreadExchangeStreamCaptureMode(_RELAXED)
        try:
            for ctx in contexts:
                with in_context(ctx, "timeline"):
                    if not any(key[0] == ctx._key for key in _lifetimes.capturing):
                        drv.cuCtxSynchronize()
                        continue
                    for stream in streams.values():
                        if stream._ctx is not ctx:
                            continue
                        # Neither a captured stream nor the legacy one beside a blocking
                        # stream's capture (the driver answers "implicit" for it, harmlessly).
                        err, status = stream._call(drv.cuStreamIsCapturing, stream._handle)
                        if not err and status == _NONE:
                            stream._call(drv.cuStreamSynchronize, stream._handle)
        finally:
            drv.cuThreadExchangeStreamCaptureMode(mode)

    # -- results --------------------------------------------------------------------------

    @property
    def records(self) -> list[Record]:
        """The raw records, ordered by when they started (submission time for the rest)."""
        if self._records is None:
            raise RuntimeError("the timeline's records exist once its `with` block has ended")
        return self._records

    @property
    def source(self) -> str:
        """Where the execution times came from, and why (e.g. why not CUPTI)."""
        if self._source is None:
            raise RuntimeError("the timeline has not started: use it as `with cuctx.timeline()`")
        return self._source.describe

    @property
    def approximate(self) -> bool:
        """True when the execution times come from event pairs, not activity records."""
        return self._source is not None and self._source.approximate

    @property
    def clock(self) -> str:
        """What the nanoseconds of the records count."""
        return self._source.clock

    def summary(self) -> dict[str, Any]:
        """Busy time per stream, copy/compute overlap and gaps, as a dict; ``print()`` it for
        a table. See docs/timeline.md for each field."""
        return summarize(self.records, self._source.describe, self._source.approximate, self._names)

    def save(self, path: str | os.PathLike[str]) -> str:
        """Write ``.json`` (Chrome trace event format: open it in https://ui.perfetto.dev or
        chrome://tracing) or ``.png`` (a picture, needs matplotlib: pip install
        'cuctx[timeline]'); return the path written."""
        path = os.fspath(path)
        ext = os.path.splitext(path)[1].lower()
        if ext == ".json":
            import json

            with open(path, "w") as f:
                json.dump(chrome_trace(self.records, self.source, self._names), f)
        elif ext == ".png":
            save_png(self.records, path, self.source, self._names)
        else:
            raise ValueError(
                f"cannot save a timeline as {path!r}: name a .json file (Chrome "
                "trace, for Perfetto) or a .png file (a picture)"
            )
        return path

    def __repr__(self) -> str:
        if self._source is None:
            return f"<Timeline source={self._want!r}, not started>"
        if self._records is None:
            return (
                f"<Timeline recording: {len(self._ops)} operations so far, times from "
                f"{self._source.describe}>"
            )
        ran = [r for r in self._records if r.start_ns is not None]
        span = max((r.end_ns for r in ran), default=0) - min((r.start_ns for r in ran), default=0)
        streams = len({(r.context, r.stream) for r in ran})
        contexts = len({r.context for r in ran})
        return (
            f"<Timeline of {len(self._records)} records: {streams} stream"
            f"{'s' * (streams != 1)} in {contexts} context{'s' * (contexts != 1)} over "
            f"{span / 1e3:.1f} us, times from {self._source.describe}>"
        )


# The operations that take a correlation id: what runs on the device, and the markers placed
# in their streams' order by it.
_CORRELATED = frozenset(WORK) | MARKERS


def choose_source(backend: _driver.Backend, want: str) -> Source:
    if want == "events":
        return EventPairs(backend, "asked for with source='events'")
    if backend.sim is not None:
        return SimActivity(backend)
    try:
        return _cupti.CuptiSource()
    except _cupti.CuptiUnavailable as exc:
        if want == "activity":
            raise RuntimeError(f"cuctx.timeline(source='activity'): {exc}") from None
        return EventPairs(backend, str(exc))


def timeline(source: str = "auto") -> Timeline:
    """``with cuctx.timeline() as tl:`` records every operation of the block: when the host
    submitted it and when it ran on the device, per device, context and stream. Then
    ``tl.save("trace.json")`` (Perfetto), ``tl.save("timeline.png")``, ``tl.summary()`` and
    ``tl.records``. Leaving the block waits for the work it submitted."""
    return Timeline(source)


def _name(op: _trace.Operation) -> str:
    if op.kernel is not None:
        return getattr(op.kernel, "name", str(op.kernel))
    if op.kind in ("record", "wait_event", "sync_event") and op.event is not None:
        return f"{op.kind} event {op.event._key:#x}"
    return op.kind


def _assemble(
    ops: list[tuple[int | None, _trace.Operation, int]],
    executions: list[Execution],
    approximate: bool,
) -> list[Record]:
    """Match executions to operations by correlation id; place markers; sort by time."""
    by_corr: dict[int, list[Execution]] = {}
    foreign: list[Execution] = []
    for ex in executions:
        (by_corr.setdefault(ex.correlation, []) if ex.correlation is not None else foreign).append(
            ex
        )
    records: list[Record] = []
    ends: dict[tuple[int, int], list[tuple[int, int]]] = {}  # stream -> [(corr, end)]
    for corr, op, submitted in ops:
        device = op.context.device.ordinal if op.context is not None else None
        ctx_key, stream_key = _key(op.context, op.stream)
        mine = by_corr.pop(corr, []) if corr is not None else []
        if op.kind in MARKERS or not mine:
            lane = "marker" if op.kind in MARKERS else "host-only"
            records.append(
                Record(
                    op.kind,
                    lane,
                    _name(op),
                    device,
                    ctx_key,
                    stream_key,
                    submitted,
                    None,
                    None,
                    corr,
                    op.site,
                    approximate,
                    op,
                )
            )
            continue
        for ex in mine:
            records.append(
                Record(
                    op.kind,
                    ex.lane or WORK.get(op.kind, op.kind),
                    ex.name or _name(op),
                    device,
                    ctx_key,
                    stream_key,
                    submitted,
                    ex.start_ns,
                    ex.end_ns,
                    corr,
                    op.site,
                    ex.approximate,
                    op,
                )
            )
            ends.setdefault((ctx_key, stream_key), []).append((corr or 0, ex.end_ns))
    leftover = [ex for group in by_corr.values() for ex in group] + foreign
    for ex in leftover:  # work cuctx did not submit inside the block (or another thread's)
        records.append(
            Record(
                ex.lane,
                ex.lane,
                ex.name,
                ex.device,
                ex.context,
                ex.stream,
                None,
                ex.start_ns,
                ex.end_ns,
                ex.correlation,
                None,
                ex.approximate,
            )
        )
    records = _place_markers(records, ends)
    records.sort(
        key=lambda r: (
            r.start_ns if r.start_ns is not None else r.submit_ns or 0,
            r.correlation or 0,
        )
    )
    return records


def _place_markers(
    records: list[Record], ends: dict[tuple[int, int], list[tuple[int, int]]]
) -> list[Record]:
    """An event record or a wait has no activity record: it sits on its stream where the
    stream reached it, the end of the stream's work submitted before it (or its submission,
    if later); a wait also not before what it waits for was reached."""
    recorded: dict[int, int] = {}  # event key -> time of its latest record
    out = []
    for r in sorted(records, key=lambda r: r.correlation or 0):
        if r.lane != "marker" or r.correlation is None:
            out.append(r)
            continue
        op = r.operation
        t = max(
            [r.submit_ns]
            + [end for corr, end in ends.get((r.context, r.stream), ()) if corr < r.correlation]
        )
        if op.kind == "wait_event" and op.event is not None:
            t = max(t, recorded.get(op.event._key, t))
        elif op.kind == "wait_stream" and op.other is not None:
            t = max(
                [t]
                + [
                    end
                    for corr, end in ends.get(_key(op.other.context, op.other), ())
                    if corr < r.correlation
                ]
            )
        if op.kind == "record" and op.event is not None:
            recorded[op.event._key] = t
        out.append(
            Record(
                r.kind,
                r.lane,
                r.name,
                r.device,
                r.context,
                r.stream,
                r.submit_ns,
                t,
                t,
                r.correlation,
                r.site,
                r.approximate,
                op,
            )
        )
    return out
