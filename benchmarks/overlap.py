"""Copy in, compute, copy out over N streams (the CUDA guide's pattern, as
src/cuctx/examples/stream_overlap.py writes it): how close the pipeline comes to the ideal,
the longest phase's total (all host-to-device copies, or all kernels, or all device-to-host
copies, each measured alone). Goal on the GPU: achieved/ideal >= 0.90 at 4 and 8 streams.
Times are GPU times from events; also the wall time of the whole pipeline, synchronized.
Then each N once more inside ``cuctx.timeline()``: the span of the work it recorded (first
start to last end on the device) beside the events' time and the wall time, and the
copy/compute overlap it saw. The timeline's source is named: CUPTI activity records on a GPU
where cupti-python is installed, else event pairs (approximate).

On the sim the times come from its timing model (src/cuctx/_driver/sim/_timing.py): a smoke
test of the script, and what benchmarks/sim_calibration.py compares with the H100.
"""

from __future__ import annotations

import time

import numpy as np

import cuctx
from _bench import run, start

SOURCE = r"""
extern "C" __global__ void scale(float* out, const float* in, float factor, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i] * factor;
}
"""
TOTAL = 64 << 20  # bytes of float32 input, cut in N chunks
STREAMS = (1, 2, 4, 8)


def scale_twin(grid, block, out, data, factor: float, n):
    out.view(np.float32, n)[:] = data.view(np.float32, n) * np.float32(factor)


class Pipeline:
    """The buffers for one run: pinned host input/output, device chunks, 8 streams."""

    def __init__(self) -> None:
        library = cuctx.Library.from_source(SOURCE, sim_kernels={"scale": scale_twin})
        self.scale = library["scale"]
        n = TOTAL // 4
        self.host_in = cuctx.pinned_empty(n, np.float32)
        self.host_in[:] = 1
        self.host_out = cuctx.pinned_empty(n, np.float32)
        self.dev_in = cuctx.empty(n, np.float32)
        self.dev_out = cuctx.empty(n, np.float32)
        self.streams = [cuctx.Stream() for _ in range(max(STREAMS))]
        cuctx.current_context().synchronize()

    def run(self, chunks: int, phases: str = "hkd") -> tuple[float, float]:
        """(GPU ms, wall ms) of ``phases`` (h: HtoD, k: kernel, d: DtoH) over ``chunks``
        streams, chunk i on stream i."""
        n = self.host_in.size // chunks
        streams = self.streams[:chunks]
        first, last = cuctx.Event(timing=True), cuctx.Event(timing=True)
        cuctx.current_context().synchronize()
        wall = time.perf_counter()
        first.record(streams[0])
        for s in streams[1:]:
            s.wait(first)
        for i, s in enumerate(streams):
            part = slice(i * n, (i + 1) * n)
            if "h" in phases:
                cuctx.copy(self.dev_in[part], self.host_in[part], stream=s)
            if "k" in phases:
                self.scale[-(-n // 256), 256, 0, s](self.dev_out[part], self.dev_in[part], 2.0, n)
            if "d" in phases:
                cuctx.copy(self.host_out[part], self.dev_out[part], stream=s)
        for s in streams[1:]:
            streams[0].wait(s)
        last.record(streams[0])
        last.synchronize()
        return last - first, (time.perf_counter() - wall) * 1e3


def best(fn, rounds: int = 5) -> tuple[float, float]:
    return min((fn() for _ in range(rounds)), key=lambda r: r[0])


def speedups(pipeline: Pipeline) -> dict[int, float]:
    """The pipeline's speedup on N streams over one stream, per N."""
    one = best(lambda: pipeline.run(1))[0]
    return {n: one / best(lambda n=n: pipeline.run(n))[0] for n in STREAMS}


def main() -> None:
    start("times are the sim's virtual clock (its timing model), not a GPU's")
    with cuctx.Device(0):
        pipeline = Pipeline()
        phases = {p: best(lambda p=p: pipeline.run(1, p))[0] for p in "hkd"}
        ideal = max(phases.values())
        print(
            f"copy/compute/copy of {TOTAL >> 20} MiB: HtoD {phases['h']:.3f} ms, kernel "
            f"{phases['k']:.3f} ms, DtoH {phases['d']:.3f} ms alone; ideal (the longest "
            f"phase) {ideal:.3f} ms"
        )
        untimed = {}
        for n in STREAMS:
            gpu, wall = untimed[n] = best(lambda n=n: pipeline.run(n))
            print(
                f"  {n} stream(s): {gpu:.3f} ms GPU time, {wall:.3f} ms wall; "
                f"achieved/ideal = {ideal / gpu:.2f}"
            )
        compare_with_timeline(pipeline, untimed)


def compare_with_timeline(pipeline: Pipeline, untimed: dict[int, tuple[float, float]]) -> None:
    """Each N once inside a timeline: does what it shows agree with the events and the
    wall clock, and how much longer does the pipeline take inside it than without (issue
    16's goal: at most 1.1x)?"""
    print("\n== the same pipeline inside cuctx.timeline()")
    source = None
    for n in STREAMS:
        pipeline.run(n)  # warm: the first launch under a trace sink takes the checked path
        with cuctx.timeline() as tl:
            gpu, wall = pipeline.run(n)
        summary, source = tl.summary(), tl.source
        span = summary["span_ns"] / 1e6
        overlap = max((d["copy_compute_overlap"] for d in summary["devices"].values()), default=0.0)
        print(
            f"  {n} stream(s): timeline span {span:.3f} ms, events {gpu:.3f} ms "
            f"(timeline/events {span / gpu:.2f}; events/untimed {gpu / untimed[n][0]:.2f}), "
            f"wall {wall:.3f} ms; copy/compute overlap {overlap:.0%}"
        )
    print(f"  timeline source: {source}")


if __name__ == "__main__":
    run(main)
