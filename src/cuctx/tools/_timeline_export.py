"""A timeline's records as a Chrome trace (Perfetto), a picture (matplotlib) and a summary.

Tracks: one per stream (a Chrome "thread"), grouped in a "process" per device and context,
sorted by device; one more process holds the host's submissions, a thread per host thread.
Flow arrows go from each submission to its execution, from an event's record to each wait
for it, and from the work a `Stream.wait(other)` waited for to the wait.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any, Iterable

from ._timeline_sources import Record, stream_key

HOST_PID = 0
COLOURS = {
    "kernel": "#4c72b0",
    "copy": "#dd8452",
    "memset": "#8172b3",
    "host": "#55a868",
    "busy": "#937860",
    "marker": "#c44e52",
}


def _ran(records: Iterable[Record]) -> list[Record]:
    return [r for r in records if r.start_ns is not None]


Names = dict[tuple[int, int], list[str]]  # (context, stream) -> the user's names for it
DEFAULT_STREAMS = {1: "legacy", 2: "per-thread"}


class Tracks:
    """Process and thread ids and names: a process per (device, context), a thread per
    stream, numbered in order of first appearance. Each lane has a short label, for the
    picture and the summary: the user's name for its stream (``names``: the names found at
    the lines that used it; one no other stream of the timeline had), else "ctx 1 / stream
    2" (small ordinals of this timeline). The Chrome trace's names hold the handles too."""

    def __init__(self, records: list[Record], names: Names | None = None) -> None:
        self.pids: dict[tuple[Any, int], int] = {}
        self.tids: dict[tuple[Any, int, int], int] = {}
        self.process_names: dict[int, str] = {}
        self.thread_names: dict[tuple[int, int], str] = {}
        self.labels: dict[tuple[Any, int, int], str] = {}
        user = unique_names(names or {})
        created: dict[int, int] = {}  # pid -> streams it created, so far
        for r in _ran(records):
            key = (r.device, r.context, r.stream)
            if key in self.tids:
                continue
            pid = self.pids.setdefault(key[:2], len(self.pids) + 1)
            self.tids[key] = tid = sum(1 for k in self.tids if k[:2] == key[:2]) + 1
            op = r.operation
            ctx_kind = f" ({op.context.kind})" if op is not None else ""
            self.process_names[pid] = (
                f"ctx {pid}: device {r.device} / context {r.context:#x}{ctx_kind}"
            )
            if r.stream in DEFAULT_STREAMS:
                ordinal = f"{DEFAULT_STREAMS[r.stream]} stream"
                handle = f"{DEFAULT_STREAMS[r.stream]} default stream"
            else:
                created[pid] = created.get(pid, 0) + 1
                ordinal = f"stream {created[pid]}"
                handle = f"stream {r.stream:#x}" + (f" ({op.stream.kind})" if op else "")
            name = user.get(key[1:])
            self.labels[key] = name or f"ctx {pid} / {ordinal}"
            if name is None and r.stream in DEFAULT_STREAMS:  # its handle says it already
                self.thread_names[(pid, tid)] = handle
            else:
                self.thread_names[(pid, tid)] = f"{name or ordinal}: {handle}"

    def of(self, r: Record) -> tuple[int, int]:
        key = (r.device, r.context, r.stream)
        return self.pids[key[:2]], self.tids[key]

    def label(self, r: Record) -> str:
        return self.labels[(r.device, r.context, r.stream)]


def unique_names(names: Names) -> dict[tuple[int, int], str]:
    """Each stream's first name that no other stream had: a loop's ``s`` names several
    streams, so each of them goes by the next name it had (``streams[1]``), or by none."""
    holders = Counter(n for candidates in names.values() for n in set(candidates))
    return {
        key: next(n for n in candidates if holders[n] == 1)
        for key, candidates in names.items()
        if any(holders[n] == 1 for n in candidates)
    }


def chrome_trace(records: list[Record], source: str, names: Names | None = None) -> dict[str, Any]:
    """The Chrome trace event format (JSON object form), timestamps in microseconds from the
    first record; each slice's args hold its context and stream handles."""
    tracks = Tracks(records, names)
    times = [t for r in records for t in (r.submit_ns, r.start_ns) if t is not None]
    origin = min(times, default=0)
    us = lambda ns: (ns - origin) / 1000
    events: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": HOST_PID, "args": {"name": "host"}},
        {"ph": "M", "name": "process_sort_index", "pid": HOST_PID, "args": {"sort_index": 0}},
    ]
    # The groups in device order, whichever device's work ran first; a device's contexts
    # in order of appearance.
    device_of = {pid: key[0] for key, pid in tracks.pids.items()}
    ranked = sorted(
        tracks.process_names, key=lambda pid: (device_of[pid] is None, device_of[pid] or 0, pid)
    )
    for rank, pid in enumerate(ranked, 1):
        events.append(
            {
                "ph": "M",
                "name": "process_name",
                "pid": pid,
                "args": {"name": tracks.process_names[pid]},
            }
        )
        events.append(
            {"ph": "M", "name": "process_sort_index", "pid": pid, "args": {"sort_index": rank}}
        )
    for (pid, tid), name in tracks.thread_names.items():
        events.append(
            {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}}
        )
    host_tids: dict[int, int] = {}
    flows = 0

    def flow(src: tuple[int, int, int], dst: tuple[int, int, int], name: str) -> None:
        nonlocal flows
        flows += 1
        for ph, (pid, tid, ns) in (("s", src), ("f", dst)):
            events.append(
                {
                    "ph": ph,
                    "id": flows,
                    "name": name,
                    "cat": name,
                    "pid": pid,
                    "tid": tid,
                    "ts": us(ns),
                    "bp": "e",
                }
            )

    for r in records:
        args = {
            "kind": r.kind,
            "context": f"{r.context:#x}",
            "stream": f"{r.stream:#x}",
            "correlation": r.correlation,
            "approximate": r.approximate,
        }
        if r.site is not None:
            args["site"] = f"{r.site[0]}:{r.site[1]} in {r.site[2]}"
        host = None
        if r.submit_ns is not None:
            thread = r.operation.thread if r.operation is not None else 0
            tid = host_tids.setdefault(thread, len(host_tids) + 1)
            host = (HOST_PID, tid, r.submit_ns)
            events.append(
                {
                    "ph": "X",
                    "name": r.kind,
                    "cat": "submission",
                    "pid": HOST_PID,
                    "tid": tid,
                    "ts": us(r.submit_ns),
                    "dur": 0,
                    "args": args,
                }
            )
        if r.start_ns is None:
            continue
        pid, tid = tracks.of(r)
        events.append(
            {
                "ph": "X",
                "name": r.name,
                "cat": r.lane,
                "pid": pid,
                "tid": tid,
                "ts": us(r.start_ns),
                "dur": (r.end_ns - r.start_ns) / 1000,
                "args": args,
            }
        )
        if host is not None:
            flow(host, (pid, tid, r.start_ns), "submission")
    for src, dst, name in _dependencies(records):
        flow((*tracks.of(src), src.end_ns), (*tracks.of(dst), dst.start_ns), name)
    for thread, tid in host_tids.items():
        events.append(
            {
                "ph": "M",
                "name": "thread_name",
                "pid": HOST_PID,
                "tid": tid,
                "args": {"name": f"host thread {thread:#x}"},
            }
        )
    return {
        "traceEvents": events,
        "displayTimeUnit": "ns",
        "otherData": {"source": source, "producer": "cuctx.timeline"},
    }


def _dependencies(records: list[Record]) -> list[tuple[Record, Record, str]]:
    """(from, to, name): each wait's event record, or the last work of the stream waited for."""
    ran = sorted(_ran(records), key=lambda r: r.correlation or 0)
    last_on: dict[tuple[Any, int, int], Record] = {}
    last_record: dict[int, Record] = {}
    out = []
    for r in ran:
        op = r.operation
        if r.lane == "marker" and op is not None:
            if op.kind == "wait_event" and op.event is not None and op.event._key in last_record:
                out.append((last_record[op.event._key], r, "event record -> wait"))
            elif op.kind == "wait_stream" and op.other is not None:
                other = (r.device, *stream_key(op.other.context, op.other))
                if other in last_on:
                    out.append((last_on[other], r, "stream wait"))
            if op.kind == "record" and op.event is not None:
                last_record[op.event._key] = r
        last_on[(r.device, r.context, r.stream)] = r
    return out


# -- the picture --------------------------------------------------------------------------


def save_png(records: list[Record], path: str, source: str, names: Names | None = None) -> None:
    figure(records, source, names).savefig(path, dpi=110)


def figure(records: list[Record], source: str, names: Names | None = None) -> Any:
    """The picture as a matplotlib Figure: a lane per stream, labelled as `Tracks` labels."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.patches import Patch
    except ImportError:
        raise ImportError(
            "saving a timeline as a picture needs matplotlib: pip install 'cuctx[timeline]' "
            "(or pip install matplotlib); tl.save('trace.json') needs nothing"
        ) from None
    tracks = Tracks(records, names)
    ran = _ran(records)
    origin = min((r.start_ns for r in ran), default=0)
    end = max((r.end_ns for r in ran), default=0)
    scale, unit = (1e6, "ms") if end - origin >= 1e6 else (1e3, "µs")
    lanes = [tracks.label(r) for r in ran]
    order = list(dict.fromkeys(lanes))
    fig = Figure(figsize=(11, 1.2 + 0.45 * len(order)))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for r, lane in zip(ran, lanes):
        y = len(order) - 1 - order.index(lane)
        x = (r.start_ns - origin) / scale
        if r.lane == "marker":
            ax.plot([x, x], [y - 0.35, y + 0.35], color=COLOURS["marker"], linewidth=1)
        else:
            ax.broken_barh(
                [(x, max(r.end_ns - r.start_ns, 1) / scale)],
                (y - 0.35, 0.7),
                color=COLOURS.get(r.lane, "grey"),
            )
    ax.set_yticks(range(len(order)), list(reversed(order)), fontsize=8)
    ax.set_xlabel(f"time ({unit})")
    ax.set_title(f"cuctx timeline: {source}", fontsize=9)
    used = dict.fromkeys(r.lane for r in ran)
    ax.legend(
        handles=[Patch(color=COLOURS.get(k, "grey"), label=k) for k in used],
        fontsize=8,
        loc="upper right",
    )
    fig.tight_layout()
    return fig


# -- the summary --------------------------------------------------------------------------


def _union(intervals: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[list[int]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _length(intervals: list[tuple[int, int]]) -> int:
    return sum(b - a for a, b in intervals)


def _intersection(xs: list[tuple[int, int]], ys: list[tuple[int, int]]) -> int:
    total = i = j = 0
    while i < len(xs) and j < len(ys):
        lo, hi = max(xs[i][0], ys[j][0]), min(xs[i][1], ys[j][1])
        total += max(0, hi - lo)
        if xs[i][1] < ys[j][1]:
            i += 1
        else:
            j += 1
    return total


def _two_or_more(groups: list[list[tuple[int, int]]]) -> int:
    """Time during which at least two of the groups (each a union) are busy."""
    edges = sorted((t, d) for g in groups for a, b in g for t, d in ((a, 1), (b, -1)))
    total, depth, since = 0, 0, 0
    for t, d in edges:
        if depth >= 2:
            total += t - since
        depth += d
        since = t
    return total


class Summary(dict):
    """`Timeline.summary()`: a dict; ``str()`` is a table."""

    def __str__(self) -> str:
        ms = lambda ns: f"{ns / 1e6:.3f} ms"
        lines = [f"timeline: {ms(self['span_ns'])} from {self['source']}"]
        width = max([len("stream"), *map(len, self["streams"])])
        lines.append(f"{'stream'.ljust(width)}  {'busy':>6}  {'ops':>4}  {'gaps':>4}  longest gap")
        for name, s in self["streams"].items():
            lines.append(
                f"{name.ljust(width)}  {s['busy_fraction']:>6.1%}  "
                f"{s['operations']:>4}  {s['gaps']:>4}  {ms(s['longest_gap_ns'])}"
            )
        for device, d in self["devices"].items():
            lines.append(
                f"device {device}: kernels {ms(d['kernel_ns'])}, copies {ms(d['copy_ns'])}, "
                f"copy/compute overlap {ms(d['copy_compute_overlap_ns'])} "
                f"({d['copy_compute_overlap']:.0%}); kernels of 2+ streams at once "
                f"{ms(d['concurrent_kernels_ns'])}; 2+ contexts at once "
                f"{ms(d['contexts_overlap_ns'])}"
            )
        return "\n".join(lines)


def summarize(
    records: list[Record], source: str, approximate: bool, names: Names | None = None
) -> Summary:
    ran = [r for r in _ran(records) if r.lane != "marker"]
    tracks = Tracks(records, names)
    start = min((r.start_ns for r in ran), default=0)
    span = max((r.end_ns for r in ran), default=0) - start
    per_stream: dict[str, list[Record]] = defaultdict(list)
    per_device: dict[Any, list[Record]] = defaultdict(list)
    for r in ran:
        per_stream[tracks.label(r)].append(r)
        per_device[r.device].append(r)
    streams = {}
    for name, rs in per_stream.items():
        busy = _union((r.start_ns, r.end_ns) for r in rs)
        gaps = [b[0] - a[1] for a, b in zip(busy, busy[1:])]
        streams[name] = {
            "device": rs[0].device,
            "context": rs[0].context,
            "stream": rs[0].stream,
            "operations": len(rs),
            "busy_ns": _length(busy),
            "busy_fraction": _length(busy) / span if span else 0.0,
            "gaps": len(gaps),
            "gap_ns": sum(gaps),
            "longest_gap_ns": max(gaps, default=0),
        }
    devices = {}
    for device, rs in per_device.items():
        kernels = _union((r.start_ns, r.end_ns) for r in rs if r.lane == "kernel")
        copies = _union((r.start_ns, r.end_ns) for r in rs if r.lane == "copy")
        overlap = _intersection(kernels, copies)
        smaller = min(_length(kernels), _length(copies))
        by_stream: dict[tuple[int, int], list] = defaultdict(list)
        by_context: dict[int, list] = defaultdict(list)
        for r in rs:
            if r.lane == "kernel":
                by_stream[(r.context, r.stream)].append((r.start_ns, r.end_ns))
            by_context[r.context].append((r.start_ns, r.end_ns))
        devices[device] = {
            "kernel_ns": _length(kernels),
            "copy_ns": _length(copies),
            "copy_compute_overlap_ns": overlap,
            "copy_compute_overlap": overlap / smaller if smaller else 0.0,
            "concurrent_kernels_ns": _two_or_more([_union(v) for v in by_stream.values()]),
            "contexts_overlap_ns": _two_or_more([_union(v) for v in by_context.values()]),
        }
    return Summary(
        source=source, approximate=approximate, span_ns=span, streams=streams, devices=devices
    )
