"""The 8-stream pipeline of benchmarks/overlap.py (per stream: copy a chunk in, scale it, copy
it out; issued breadth first here) inside cuctx.timeline(): the timeline shows the copies of
some streams running under the kernels of others, on both hot paths. On the sim its times are
the virtual clock's, so the pipeline's GPU time with and without the timeline compares exactly
(the timeline must not perturb the work it records); on a GPU the overlap must show. The GPU
starts once the host has queued the whole pipeline, so the overlap is the GPU's doing and the
timeline's: not how fast the host queues (a test of that would be a timed assertion)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import cuctx

from scenarios import library_fixture

pytestmark = [pytest.mark.usefixtures("nvrtc_cache"), pytest.mark.paths("python", "native")]

SOURCE = r"""
extern "C" __global__ void scale(float* out, const float* in, float factor, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i] * factor;
}
"""
STREAMS = 8
# Floats in all: 64 MiB, 8 MiB a stream, as in benchmarks/overlap.py (a chunk's copy: about
# 170 us on an H100's PCIe).
N = 16 << 20


def scale(grid, block, out, data, factor: float, n):
    out.view(np.float32, n)[:] = data.view(np.float32, n) * np.float32(factor)


scale.cost_ns = 120_000  # on the sim, about a chunk's copy (8 MiB at 55 GB/s: 152 us)


lib = library_fixture(SOURCE, scale=scale)


class Pipeline:
    def __init__(self, lib) -> None:
        self.scale = lib["scale"]
        self.host_in = cuctx.pinned_empty(N, np.float32)
        self.host_in[:] = np.arange(N, dtype=np.float32)
        self.host_out = cuctx.pinned_empty(N, np.float32)
        self.dev_in = cuctx.empty(N, np.float32)
        self.dev_out = cuctx.empty(N, np.float32)
        self.streams = [cuctx.Stream() for _ in range(STREAMS)]
        cuctx.current_context().synchronize()

    def run(self) -> float:
        """The pipeline's GPU time in ms (events around it)."""
        self.host_out[:] = 0
        n = N // STREAMS
        streams = self.streams
        first, last = cuctx.Event(timing=True), cuctx.Event(timing=True)
        # The GPU starts once everything is queued (a host function that waits for `queued`):
        # what overlaps is then the GPU's doing, whatever the host's speed. Without it, the
        # python path inside a CUPTI timeline on a busy H100 host queued each copy after the
        # one before had ended (overlap 0.11), though breadth first.
        queued = threading.Event()
        streams[0].launch_host_func(queued.wait)
        first.record(streams[0])
        try:
            for s in streams[1:]:
                s.wait(first)
            # Breadth first: every stream's copy in, then the kernels, then the copies out.
            parts = [slice(i * n, (i + 1) * n) for i in range(len(streams))]
            for part, s in zip(parts, streams):
                cuctx.copy(self.dev_in[part], self.host_in[part], stream=s)
            for part, s in zip(parts, streams):
                self.scale[-(-n // 256), 256, 0, s](self.dev_out[part], self.dev_in[part], 2.0, n)
            for part, s in zip(parts, streams):
                cuctx.copy(self.host_out[part], self.dev_out[part], stream=s)
            for s in streams[1:]:
                streams[0].wait(s)
            last.record(streams[0])
        finally:
            queued.set()
        last.synchronize()
        np.testing.assert_array_equal(self.host_out, self.host_in * 2)
        return last - first


@pytest.mark.host_timing
@pytest.mark.parametrize("source", ["auto", "events"])
def test_the_pipeline_shows_its_overlap_inside_a_timeline(lib, source):
    pipeline = Pipeline(lib)
    pipeline.run()  # warm: the launchers' fast paths exist
    untimed = pipeline.run()
    with cuctx.timeline(source) as tl:
        timed = pipeline.run()
    summary = tl.summary()
    device = summary["devices"][0]
    assert device["copy_ns"] > 0 and device["kernel_ns"] > 0
    assert device["copy_compute_overlap"] > 0.5  # most kernel time under other streams' copies
    copies = [r for r in tl.records if r.kind == "copy"]
    kernels = [r for r in tl.records if r.kind == "launch"]
    assert len(copies) == 2 * STREAMS and len(kernels) == STREAMS
    assert len({r.stream for r in kernels}) == STREAMS  # one track per stream
    if tl._source.clock.startswith("the sim's"):
        # The virtual clock is exact: the timeline's own work costs the GPU (almost) nothing.
        # (Event pairs add one event record per operation, which the sim charges.)
        assert timed <= untimed * 1.1
        assert summary["span_ns"] / 1e6 <= timed * 1.1
