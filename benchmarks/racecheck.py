"""What the race checker costs: per operation (launch, copy, event record and stream wait)
with nothing listening (the fast paths), with a trace sink that does nothing (the operation
announced), and inside ``cuctx.racecheck()``; and what its history holds after a long loop.

Goals (issue 22), printed at the end as measured, goal, met:

- a launch with the checker on costs at most 2x an untraced one, on a GPU. On the sim a
  launch runs the virtual GPU in Python, so the ratio says nothing there: the checker's own
  cost per launch is printed instead (the announcement and the check, timed without the
  driver call), the number a GPU adds to its untraced launch (4.65 us on an H200);
- 100k operations of a loop (a temporary made, filled, used by two launches and freed, a
  synchronize every fourth round) under the checker in "warn" mode, the sim's default, grow
  what Python holds by less than 1 MiB (tracemalloc; also the part the checker's own code
  allocated). On a GPU the loop takes about a second; on the sim about a minute.

``python benchmarks/racecheck.py [operations]`` (default 100000).
"""

from __future__ import annotations

import gc
import sys
import time
import tracemalloc

import numpy as np

import cuctx
from cuctx import _trace
from _bench import best_time, run, start

INNER = 2_000
OPERATIONS = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
SOURCE = r"""
extern "C" __global__ void add(float* out, const float* x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = x[i] + a;
}
"""
CHECKER_FILES = [
    tracemalloc.Filter(True, "*/cuctx/tools/*"),
    tracemalloc.Filter(True, "*/cuctx/_trace.py"),
]
GOALS: list[tuple[str, float | None, float, str, str]] = []


def add(grid, block, out, x, a, n):
    out.view(np.float32, n)[:] = x.view(np.float32, n) + np.float32(a)


def goal(what: str, value: float | None, target: float, unit: str, note: str = "") -> None:
    """A goal (value <= target) to print at the end; value None: not measured (note: why)."""
    GOALS.append((what, value, target, unit, note))


def per_operation(kernel: cuctx.Kernel) -> None:
    s1, s2 = cuctx.Stream(), cuctx.Stream()
    n = 256
    x, out = cuctx.zeros(n, np.float32), cuctx.zeros(n, np.float32)
    event = cuctx.Event()
    launcher = kernel[1, n, 0, s1]
    operations = {
        "launch": lambda: launcher(out, x, 1.0, n),
        "copy (device to device)": lambda: cuctx.copy(out, x, stream=s1),
        "event record": lambda: s1.record(event),
        "stream wait (event)": lambda: s2.wait(event),
    }
    s1.record(event)
    print(f"\n== per operation, us (best of 3 rounds of {INNER}; lower is better)")
    print(f"  {'operation':<26}{'off':>9}{'no-op sink':>12}{'racecheck':>12}{'checked/off':>13}")
    launch = None
    for name, op in operations.items():

        def measure(op=op) -> float:
            try:
                return best_time(op, inner=INNER, rounds=3) * 1e6
            finally:
                cuctx.synchronize()

        with cuctx.racecheck("off"):  # each column as named, whatever CUCTX_RACECHECK says
            off = measure()
            with _trace.sink(lambda operation: None):
                traced = measure()
            with cuctx.racecheck("raise"):
                checked = measure()
        print(f"  {name:<26}{off:9.2f}{traced:12.2f}{checked:12.2f}{checked / off:13.2f}")
        launch = launch or (off, checked)
    added = checker_cost(launcher, (out, x, 1.0, n))
    print(
        f"\n  the checker's own cost per launch (announcement and check, no driver call): "
        f"{added:.2f} us"
    )
    if cuctx.backend().name == "cuda":
        goal("launch with the checker / untraced", launch[1] / launch[0], 2.0, "x")
    else:
        goal(
            "launch with the checker / untraced",
            None,
            2.0,
            "x",
            f"on a GPU only: the sim's launch runs its virtual GPU in Python "
            f"({launch[0]:.1f} us); the checker adds {added:.2f} us to a launch, which a GPU "
            f"adds to its untraced launch (4.65 us on an H200: 2x leaves 4.65)",
        )


def checker_cost(launcher, args: tuple) -> float:
    """Microseconds the announcement and the check add to a launch: the trace's emit_launch
    (what every launch path calls after the driver call) with the checker listening, less
    with nothing listening."""
    plan = launcher._packer.plan(args)

    def announce() -> None:
        _trace.emit_launch(launcher, args, plan)

    with cuctx.racecheck("off"):
        nothing = best_time(announce, inner=INNER * 5, rounds=5)
        with cuctx.racecheck("raise"):
            checked = best_time(announce, inner=INNER * 5, rounds=5)
    return (checked - nothing) * 1e6


def growth(kernel: cuctx.Kernel) -> None:
    """What Python holds after OPERATIONS operations of the loop, under a checker in "warn"
    mode (the sim's default), less what it held before (after a warm-up of 1000 rounds)."""
    n = 256
    out, x = cuctx.zeros(n, np.float32), cuctx.zeros(n, np.float32)
    side = cuctx.Stream()

    def rounds(count: int) -> int:
        for i in range(count):
            temporary = cuctx.zeros(n, np.float32)  # an allocation and a fill
            temporary.fill(1.0)
            kernel[1, n](out, temporary, 1.0, n)
            side.wait(cuctx.legacy_stream())
            kernel[1, n, 0, side](x, out, 1.0, n)
            cuctx.legacy_stream().wait(side)
            del temporary  # a free
            if i % 4 == 3:
                cuctx.synchronize()
        return count * 8 + count // 4  # the waits count too

    with cuctx.racecheck("warn"):
        rounds(1000)
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.take_snapshot()
            started = time.perf_counter()
            done = 0
            while done < OPERATIONS:
                done += rounds(500)
            cuctx.synchronize()
            seconds = time.perf_counter() - started
            gc.collect()
            after = tracemalloc.take_snapshot()
        finally:
            tracemalloc.stop()
    grown = sum(s.size_diff for s in after.compare_to(before, "filename"))
    checker = sum(
        s.size_diff
        for s in after.filter_traces(CHECKER_FILES).compare_to(
            before.filter_traces(CHECKER_FILES), "filename"
        )
    )
    print(f"\n== {done} operations under racecheck('warn') ({seconds:.1f} s, tracemalloc on)")
    print(
        f"  Python's memory grew by {grown / 1024:.1f} KiB, of which the checker's and "
        f"the trace's code allocated {checker / 1024:.1f} KiB"
    )
    goal(f"growth over {done // 1000}k operations", grown / 2**20, 1.0, "MiB")


def print_goals() -> None:
    print("\n== goals (issue 22)")
    for what, value, target, unit, note in GOALS:
        if value is None:
            print(f"  {what:<44} not measured ({note})")
            continue
        print(
            f"  {what:<44} {value:8.2f} {unit:<3}  goal <= {target} {unit:<3}  "
            f"{'met' if value <= target else 'NOT met'}"
        )


def main() -> None:
    start(
        "on the sim every operation also runs the virtual GPU; the differences between the "
        "columns are cuctx's and the checker's own costs"
    )
    kernel = cuctx.Library.from_source(SOURCE, sim_kernels={"add": add})["add"]
    with cuctx.Device(0):
        per_operation(kernel)
        growth(kernel)
    print_goals()


if __name__ == "__main__":
    run(main)
