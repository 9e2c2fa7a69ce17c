"""What every benchmark shares: a timer that takes the best of several rounds, and one
output format, so scripts/gpu-check's log reads the same for all of them.

Each benchmark measures cuctx and its baselines in the same process, interleaved round by
round, and prints ``ratio = cuctx / baseline``: lower is better for costs, higher for
bandwidths. No benchmark asserts anything about time; machines are noisy.

A benchmark's ``main`` runs through `run`: on the sim cuctx checks stream order by default
(docs/checks.md), and a benchmark times cuctx as a GPU runs it, so the race checker is off
unless ``CUCTX_RACECHECK`` asks for it (benchmarks/racecheck.py times the checker itself).
"""

from __future__ import annotations

import os
import time
from typing import Callable


def run(main: Callable[[], None]) -> None:
    """Run a benchmark's ``main``, with the race checker off (in the processes it starts
    too) unless CUCTX_RACECHECK is set (then it decides, as for any program)."""
    import cuctx

    if os.environ.get("CUCTX_RACECHECK"):
        main()
        return
    os.environ["CUCTX_RACECHECK"] = "off"  # for worker processes
    with cuctx.racecheck("off"):
        main()


def one_cpu() -> None:
    """Keep this process, and the programs it starts (the C baselines, which run while it
    waits for them), on the CPU it runs on now, and print which. On a GPU machine's shared
    cores the same launch loop took 2.5 us on one CPU and 3.7 on another, so a C program the
    scheduler put elsewhere made a ratio of 0.98 or 1.55 of one that was 1.12-1.22 on every
    single CPU (an H100 host). ``CUCTX_BENCH_CPUS=any`` leaves the scheduler free."""
    if os.environ.get("CUCTX_BENCH_CPUS") == "any" or not hasattr(os, "sched_setaffinity"):
        print("CPU: any (the scheduler's choice, for this process and its baselines)")
        return
    with open("/proc/self/stat") as stat:  # field 39, "processor": the CPU it last ran on
        cpu = int(stat.read().rsplit(")", 1)[1].split()[36])
    os.sched_setaffinity(0, {cpu})
    print(f"CPU: {cpu} alone, for this process and its baselines (CUCTX_BENCH_CPUS=any: any)")


def start(sim_note: str):
    """Print the backend and whether the race checker runs; return the backend and the name
    of the raw baseline ("cuda.bindings" on a GPU; on the sim, its driver, with
    ``sim_note`` saying what the ratios then mean)."""
    import cuctx
    from cuctx import _trace

    backend = cuctx.backend()
    print(f"backend: {backend}")
    print(
        "race checker: "
        + ("on" if _trace.sinks else "off")
        + " (CUCTX_RACECHECK=warn|off decides; benchmarks/racecheck.py times the checker)"
    )
    if backend.name != "cuda":
        print(f"note: {sim_note}")
    return backend, "cuda.bindings" if backend.name == "cuda" else "sim driver"


def best_time(fn: Callable[[], object], *, inner: int, rounds: int = 7) -> float:
    """Seconds per call of ``fn``: the best round of ``rounds``, each ``inner`` calls."""
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(inner):
            fn()
        best = min(best, (time.perf_counter() - start) / inner)
    return best


def compare(
    title: str,
    candidates: dict[str, Callable[[], float]],
    *,
    unit: str,
    reference: str = "cuctx",
    higher_is_better: bool = False,
    rounds: int = 5,
) -> dict[str, float]:
    """Measure every candidate (each returns one measurement in ``unit``) ``rounds`` times,
    interleaved so drift hits all alike; keep each one's best; print values and ratios."""
    best: dict[str, float] = {}
    pick = max if higher_is_better else min
    for _ in range(rounds):
        for name, measure in candidates.items():
            value = measure()
            best[name] = value if name not in best else pick(best[name], value)
    print(f"\n== {title} ({'higher' if higher_is_better else 'lower'} is better)")
    for name, value in best.items():
        line = f"  {name:<22} {value:10.3f} {unit}"
        if name != reference and reference in best:
            line += f"   {reference}/{name} = {best[reference] / value:.3f}"
        print(line)
    return best
