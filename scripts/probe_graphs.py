"""What the driver answers for CUDA graphs and stream capture: one scripted transcript of
driver calls, each step's result code and relevant outputs (node types, edges, update
results and error nodes, capture states, memory read back). Handles are written as the
names the script gave them, so transcripts from the sim and a GPU compare step by step.

The steps live in probe_graphs_explicit.py (explicit graphs, executables, updates, memory
and conditional nodes), probe_graphs_capture.py (stream capture) and
probe_graphs_conditionals.py (if/else, switch and while nodes driven by kernels; what is
refused around conditional nodes; per-node updates of bodies); the Recorder and the kernels
they share in probe_graphs_common.py. New steps go at the end, so that a transcript recorded
before them still compares step by step.

Record on a GPU (dev tool):
    CUCTX_BACKEND=cuda PYTHONPATH=src python scripts/probe_graphs.py tests/driver/graphs_transcript.json
tests/driver/test_sim_graphs_parity.py runs the same `transcript` on the sim and compares.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from cuda.bindings import driver as d
from probe_graphs_capture import capture, graphs_in_a_capture, instantiating_beside_captures
from probe_graphs_common import Recorder, Setup
from probe_graphs_conditionals import conditional_kinds, conditional_rules
from probe_graphs_explicit import explicit, memory_and_conditionals, updates


def transcript(backend) -> list[list]:
    """The scripted steps on ``backend`` (cuctx's backend object: its driver, and on the
    sim its controls for the kernels' twins)."""
    drv = backend.driver
    r = Recorder(drv)
    drv.cuInit(0)
    _, dev = drv.cuDeviceGet(0)
    _, ctx = drv.cuDevicePrimaryCtxRetain(dev)
    drv.cuCtxPushCurrent(ctx)
    try:
        setup = Setup(drv, backend, ctx)
        event = explicit(r, setup)
        updates(r, setup, backend, event)
        capture(r, setup)
        memory_and_conditionals(r, setup)
        conditional_kinds(r, setup, backend)
        graphs_in_a_capture(r, setup)
        conditional_rules(r, setup)
        instantiating_beside_captures(r, setup)
    finally:
        drv.cuCtxSynchronize()
        drv.cuCtxPopCurrent()
        drv.cuDevicePrimaryCtxRelease(dev)
    return r.steps


def main() -> None:
    import cuctx

    backend = cuctx.backend()
    result = {"backend": backend.name, "steps": transcript(backend)}
    if backend.name == "cuda":
        result["driver"] = d.cuDriverGetVersion()[1]
    text = json.dumps(result, indent=1)
    if len(sys.argv) > 1:
        Path(sys.argv[1]).write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
