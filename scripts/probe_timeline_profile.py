"""Dev tool (GPU): where the host time of the 8-stream pipeline goes inside cuctx.timeline()
(CUPTI and event pairs) against a plain run: cProfile's top entries, and per-operation gaps."""

import cProfile
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import cuctx  # noqa: E402
from overlap import Pipeline  # noqa: E402

with cuctx.Device(0):
    pipe = Pipeline()
    for _ in range(3):
        pipe.run(8)
    for source in ("events", "activity", "events", "activity"):
        with cuctx.timeline(source) as tl:
            t = time.perf_counter()
            gpu, wall = pipe.run(8)
            submit = time.perf_counter() - t
        print(f"{source}: events {gpu:.3f} ms, wall {wall:.3f} ms", flush=True)
    for source in ("events", "activity"):
        prof = cProfile.Profile()
        with cuctx.timeline(source) as tl:
            prof.enable()
            gpu, wall = pipe.run(8)
            prof.disable()
        print(f"\n== {source}: events {gpu:.3f} ms, wall {wall:.3f} ms; host profile of run():")
        pstats.Stats(prof).sort_stats("tottime").print_stats(14)
    rows = [r for r in tl.records if r.submit_ns is not None]
    rows.sort(key=lambda r: r.submit_ns)
    t0 = rows[0].submit_ns
    print(
        "submissions (us from the first):",
        [(r.kind, round((r.submit_ns - t0) / 1e3, 1)) for r in rows[:30]],
    )
