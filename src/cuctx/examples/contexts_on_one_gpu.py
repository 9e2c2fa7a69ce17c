"""Contexts on one GPU, made visible with cuctx.timeline().

Three timelines of the same kind of work:
1. two streams of one context: copy in, compute, copy out on each; one stream's copies run
   while the other's kernel does (the copy/compute overlap);
2. two contexts on one device, a stream each: their kernels never run at once, the GPU
   takes turns between contexts (time slices);
3. two green contexts (`Device.partition`: the device's SMs split in two): their kernels run
   side by side, where two ordinary contexts took turns.

Each writes a Chrome trace (open it in https://ui.perfetto.dev) and, with matplotlib, a
picture (without it, one line says the pictures are skipped and how to get them); the
summary's numbers say the same thing. ``--out DIR`` keeps the files there.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading

import numpy as np

import cuctx

SOURCE = r"""
extern "C" __global__ void spin(float* x, int n, int iters) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float v = x[i];
    for (int k = 0; k < iters; ++k) v = v * 0.999f + 0.001f;  // long enough to see
    x[i] = v;
}
"""
N, ITERS = 1 << 22, 2000  # 16 MiB per array


def spin_twin(grid, block, x, n, iters):
    """The sim's stand-in for `spin`: the loop's closed form (v -> 1 geometrically)."""
    v = x.view(np.float32, n)
    v[:] = 1 + (v - 1) * np.float32(0.999) ** iters


class Output:
    """Where the timelines go: a Chrome trace each and, while matplotlib can draw, a picture."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.pictures = True

    def save(self, tl: cuctx.tools.Timeline, name: str) -> None:
        written = [tl.save(os.path.join(self.directory, f"{name}.json"))]
        if self.pictures:
            try:
                written.append(tl.save(os.path.join(self.directory, f"{name}.png")))
            except ImportError as exc:  # matplotlib is optional: say why once, keep the traces
                self.pictures = False
                print(f"  pictures skipped: {exc}")
        print(f"  written: {', '.join(written)}")


def two_streams(spin: cuctx.Kernel, out: Output) -> None:
    host = cuctx.pinned_empty((2, N), np.float32)
    host[:] = 0
    streams = [cuctx.Stream() for _ in range(2)]
    arrays = [cuctx.empty(N, np.float32, stream=s) for s in streams]

    def work() -> None:
        # The GPU starts once both streams' work is queued: a host function on the first
        # stream waits for `queued`, and the second stream waits for the first. Else what
        # overlaps would depend on how fast this host queues (inside a timeline, slowly).
        queued = threading.Event()
        streams[0].launch_host_func(queued.wait)
        try:
            streams[1].wait(streams[0])
            for i, (s, x) in enumerate(zip(streams, arrays)):
                cuctx.copy(x, host[i], stream=s)
                spin[N // 256, 256, 0, s](x, N, ITERS)
                cuctx.copy(host[i], x, stream=s)
        finally:
            queued.set()

    # Once before the timeline: the first launch loads the kernel into the context and makes
    # its launcher, the first copies plan themselves; inside the timeline that host time
    # (hundreds of microseconds each) kept the GPU waiting, and nothing overlapped.
    work()
    cuctx.current_context().synchronize()
    with cuctx.timeline() as tl:
        work()
    summary = tl.summary()
    print(summary)
    device = summary["devices"][0]
    print(
        f"two streams of one context: copy/compute overlap "
        f"{device['copy_compute_overlap_ns'] / 1e6:.3f} ms "
        f"({device['copy_compute_overlap']:.0%} of the shorter of copies and kernels)"
    )
    out.save(tl, "two_streams")


def kernels_in(contexts: list, spin: cuctx.Kernel, out: Output, name: str) -> dict:
    work = []
    for ctx in contexts:
        with ctx:
            s = cuctx.Stream()
            work.append((s, cuctx.zeros(N, np.float32, stream=s)))  # zeroed on s, used on s
    for ctx, (s, x) in zip(contexts, work):  # warm up: nothing of this is in the timeline
        with ctx:
            spin[N // 256, 256, 0, s](x, N, 1)
            ctx.synchronize()
    with cuctx.timeline() as tl:
        for _ in range(3):
            for ctx, (s, x) in zip(contexts, work):
                with ctx:
                    spin[N // 256, 256, 0, s](x, N, ITERS)
    device = tl.summary()["devices"][0]
    out.save(tl, name)
    return device


def main(directory: str | None = None) -> None:
    directory = directory or tempfile.mkdtemp(prefix="cuctx-timeline-")
    os.makedirs(directory, exist_ok=True)
    out = Output(directory)
    library = cuctx.Library.from_source(SOURCE, sim_kernels={"spin": spin_twin})
    spin = library["spin"]
    device = cuctx.Device(0)
    with device:
        two_streams(spin, out)
    contexts = [cuctx.Context.create(device) for _ in range(2)]
    for _ in contexts:  # create pushed each: leave the stack as it was
        cuctx.Context.pop()
    turns = kernels_in(contexts, spin, out, "two_contexts")
    print(
        f"two contexts on one device: kernels of both at once "
        f"{turns['contexts_overlap_ns'] / 1e6:.3f} ms (they take turns)"
    )
    for ctx in contexts:
        ctx.destroy()
    partition = getattr(device, "partition", None)
    if partition is None:
        print("green contexts: Device.partition is not available in this build")
    else:
        # Half the SMs each, in the driver's groups of 8 (an H100's 132 SMs: 64 + 64).
        half = device.properties.multiprocessor_count // 2 // 8 * 8
        with partition([half, half]) as greens:
            side = kernels_in(list(greens), spin, out, "green_contexts")
        print(
            f"two green contexts ({half} SMs each): kernels of both at once "
            f"{side['contexts_overlap_ns'] / 1e6:.3f} ms (side by side)"
        )
    print(f"timelines written to {directory} (open the .json files in https://ui.perfetto.dev)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="directory for the files (default: a new temp dir)")
    main(parser.parse_args().out)
