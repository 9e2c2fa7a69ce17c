"""What the race checker costs per operation: launch, copy, event record and stream wait,
with nothing listening (the fast paths), with a trace sink that does nothing (the checked
paths announcing each operation), and inside ``cuctx.racecheck()``.

The checker's own share is "racecheck" minus "no-op sink"; issue 10's target is about
10 us per operation with the checker on (everything included), and no cost at all off.
"""

from __future__ import annotations

import numpy as np

import cuctx
from cuctx import _trace
from _bench import best_time, run, start

INNER = 2_000
SOURCE = r"""
extern "C" __global__ void add(float* out, const float* x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = x[i] + a;
}
"""


def add(grid, block, out, x, a, n):
    out.view(np.float32, n)[:] = x.view(np.float32, n) + np.float32(a)


def main() -> None:
    start("on the sim every operation also runs the virtual GPU; the differences between the "
          "columns are cuctx's and the checker's own costs")
    kernel = cuctx.Library.from_source(SOURCE, sim_kernels={"add": add})["add"]
    with cuctx.Device(0):
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
        print(f"  {'operation':<26}{'off':>9}{'no-op sink':>12}{'racecheck':>12}"
              f"{'checker':>10}")
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
            print(f"  {name:<26}{off:9.2f}{traced:12.2f}{checked:12.2f}"
                  f"{checked - traced:10.2f}")


if __name__ == "__main__":
    run(main)
