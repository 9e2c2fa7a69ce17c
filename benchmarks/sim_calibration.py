"""The sim's timing model against the GPU: the copy/compute/copy pipeline of
benchmarks/overlap.py on 1, 2, 4 and 8 streams, its speedup over one stream per N on the
active backend. Run it on both (``CUCTX_BACKEND=sim`` and ``cuda``) on the GPU machine: the
goal is the sim's speedups within +-20% of the H100's. ``--both`` runs the sim in a
subprocess too and prints the ratio sim/GPU per N.

The sim's other model, the host costs `@cuctx.autograph` decides from (``HOST_*`` in
cuctx/_driver/sim/_timing.py, calibrated there with the source of each figure), is checked
by benchmarks/autograph.py: on a GPU it prints those constants beside what AutoGraph measured,
and the sim's decisions for its loops beside the GPU's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import cuctx
from _bench import run, start
from overlap import STREAMS, Pipeline, speedups


def measure() -> dict[int, float]:
    with cuctx.Device(0):
        return speedups(Pipeline())


def main() -> None:
    if "--json" in sys.argv:
        print(json.dumps(measure()))
        return
    backend, _ = start("these are the sim's own speedups (its timing model)")
    mine = measure()
    print("speedup over 1 stream: " + ", ".join(f"{n}: {mine[n]:.2f}x" for n in STREAMS))
    if "--both" in sys.argv and backend.name == "cuda":
        env = dict(os.environ, CUCTX_BACKEND="sim")
        out = subprocess.run(
            [sys.executable, __file__, "--json"],
            env=env,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        sim = {int(k): v for k, v in json.loads(out.splitlines()[-1]).items()}
        for n in STREAMS:
            ratio = sim[n] / mine[n]
            print(
                f"  {n} streams: GPU {mine[n]:.2f}x, sim {sim[n]:.2f}x, sim/GPU {ratio:.2f} "
                f"({'within' if abs(ratio - 1) <= 0.2 else 'OUTSIDE'} +-20%)"
            )


if __name__ == "__main__":
    run(main)
