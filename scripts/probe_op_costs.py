"""Dev tool (GPU): host time of each operation of the 8-stream pipeline (benchmarks/
overlap.py), timed one by one, plain, under a no-op trace sink and inside cuctx.timeline()
with each source: where a timeline's host time goes, per kind of operation."""

import collections
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import cuctx  # noqa: E402
from cuctx import _trace  # noqa: E402
from overlap import Pipeline  # noqa: E402

N = 8


def timed_run(pipe):
    """The pipeline's operations, each timed: {kind: [us, ...]}."""
    costs = collections.defaultdict(list)
    n = pipe.host_in.size // N
    streams = pipe.streams[:N]
    first = cuctx.Event()

    def t(kind, fn):
        start = time.perf_counter_ns()
        fn()
        costs[kind].append((time.perf_counter_ns() - start) / 1e3)

    t("record", lambda: first.record(streams[0]))
    for s in streams[1:]:
        t("wait", lambda s=s: s.wait(first))
    for i, s in enumerate(streams):
        part = slice(i * n, (i + 1) * n)
        t("copy HtoD", lambda p=part, s=s: cuctx.copy(pipe.dev_in[p], pipe.host_in[p], stream=s))
        t(
            "launch",
            lambda p=part, s=s: pipe.scale[-(-n // 256), 256, 0, s](
                pipe.dev_out[p], pipe.dev_in[p], 2.0, n
            ),
        )
        t("copy DtoH", lambda p=part, s=s: cuctx.copy(pipe.host_out[p], pipe.dev_out[p], stream=s))
    for s in streams[1:]:
        t("wait stream", lambda s=s: streams[0].wait(s))
    cuctx.current_context().synchronize()
    return costs


def show(label, costs):
    print(
        f"{label:<22}"
        + "  ".join(f"{k} {min(v):6.1f}/{sum(v) / len(v):6.1f}" for k, v in costs.items()),
        flush=True,
    )


with cuctx.Device(0):
    pipe = Pipeline()
    for _ in range(3):
        timed_run(pipe)
    print("us per operation, best/mean")
    for _ in range(2):
        show("plain", timed_run(pipe))
        with _trace.sink(lambda op: None):
            show("no-op sink", timed_run(pipe))
        for source in ("events", "auto"):
            with cuctx.timeline(source):
                costs = timed_run(pipe)
            show(f"timeline {source}", costs)
