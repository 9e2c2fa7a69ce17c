"""Dev tool (GPU): does cuctx.timeline() perturb the 8-stream copy/compute/copy pipeline of
benchmarks/overlap.py, or misread it? Runs the pipeline plain, under a trace sink that does
nothing, under the timeline with event pairs, with CUPTI as cuctx enables it, and with CUPTI
minus one activity kind at a time; prints the events' GPU time, the wall time, and what the
timeline saw (span, overlap, records per lane and per device)."""

import collections
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import cuctx  # noqa: E402
from cuctx import _trace  # noqa: E402
from cuctx.tools import _cupti  # noqa: E402
from overlap import Pipeline, best  # noqa: E402

N = 8


def show(label, gpu, wall, tl=None):
    line = f"{label:<34} events {gpu:7.3f} ms  wall {wall:7.3f} ms"
    if tl is not None:
        s = tl.summary()
        lanes = collections.Counter((r.lane, r.device) for r in tl.records)
        line += (
            f"  span {s['span_ns'] / 1e6:7.3f} ms  overlap "
            + ", ".join(
                f"dev {d}: {v['copy_compute_overlap']:.0%}" for d, v in s["devices"].items()
            )
            + f"  records {dict(lanes)}  source {tl.source}"
        )
    print(line, flush=True)


with cuctx.Device(0):
    pipe = Pipeline()
    for _ in range(3):
        pipe.run(N)
    show("plain", *best(lambda: pipe.run(N)))
    sink = lambda op: None  # noqa: E731
    _trace.add_sink(sink)
    try:
        show("no-op trace sink", *best(lambda: pipe.run(N)))
    finally:
        _trace.remove_sink(sink)
    for source in ("events", "auto"):
        for _ in range(2):
            with cuctx.timeline(source) as tl:
                gpu, wall = pipe.run(N)
            show(f"timeline({source!r})", gpu, wall, tl)
    try:
        from cupti import cupti
    except ImportError as exc:
        print("no cupti-python:", exc)
        raise SystemExit from None
    kinds = [
        cupti.ActivityKind.CONCURRENT_KERNEL,
        cupti.ActivityKind.MEMCPY,
        cupti.ActivityKind.MEMSET,
        cupti.ActivityKind.DRIVER,
        cupti.ActivityKind.EXTERNAL_CORRELATION,
    ]
    original = _cupti.CuptiSource.__init__
    for drop in kinds[2:]:

        def patched(self, drop=drop):
            original(self)
            self._kinds = [k for k in self._kinds if k != drop]

        _cupti.CuptiSource.__init__ = patched
        with cuctx.timeline("activity") as tl:
            gpu, wall = pipe.run(N)
        show(f"CUPTI without {drop.name}", gpu, wall, tl)
    _cupti.CuptiSource.__init__ = original
    # The raw records of one run: times per lane straight from CUPTI, no matching.
    with cuctx.timeline("activity") as tl:
        gpu, wall = pipe.run(N)
    rows = sorted(
        (r.start_ns, r.end_ns, r.lane, r.stream, r.correlation)
        for r in tl.records
        if r.start_ns is not None and r.lane in ("kernel", "copy")
    )
    t0 = rows[0][0] if rows else 0
    for start, end, lane, stream, corr in rows[:40]:
        print(
            f"  {(start - t0) / 1e3:9.1f} us .. {(end - t0) / 1e3:9.1f} us  {lane:<6} "
            f"stream {stream:#x}  corr {corr}"
        )
