"""Copy, compute, copy on four streams, written with cuctx.

The CUDA programming guide's pattern: the input is cut in chunks, and each chunk goes
host-to-device, through a kernel, and device-to-host on its own stream, so one chunk's copies
overlap another's kernel. Only page-locked host memory can overlap; `cuctx.pinned_empty`
gives it. Then a classic bug: a sum on one stream that does not wait for the
normalising step queued on another.
"""

import numpy as np

import cuctx

SOURCE = r"""
extern "C" __global__ void scale(float* out, const float* in, float factor, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i] * factor;
}
"""
CHUNKS, CHUNK = 4, 1 << 20


def scale_twin(grid, block, out, data, factor: float, n):
    """The sim's stand-in for `scale`."""
    out.view(np.float32, n)[:] = data.view(np.float32, n) * np.float32(factor)


def overlap(scale: cuctx.Kernel) -> None:
    host = cuctx.pinned_empty((CHUNKS, CHUNK), np.float32)  # page-locked: copies overlap
    host[:] = np.arange(CHUNKS * CHUNK, dtype=np.float32).reshape(CHUNKS, CHUNK)
    expected = host * 2
    streams = [cuctx.Stream() for _ in range(CHUNKS)]
    start, end = cuctx.Event(timing=True), cuctx.Event(timing=True)
    start.record(streams[0])
    inputs = [cuctx.empty(CHUNK, np.float32, stream=s) for s in streams]
    outputs = [cuctx.empty(CHUNK, np.float32, stream=s) for s in streams]
    for i, stream in enumerate(streams):  # <<<grid, block, shared, stream>>> per chunk
        cuctx.copy(inputs[i], host[i], stream=stream)
        scale[CHUNK // 256, 256, 0, stream](outputs[i], inputs[i], 2.0, CHUNK)
        cuctx.copy(host[i], outputs[i], stream=stream)
    for stream in streams[1:]:
        streams[0].wait(stream)
    end.record(streams[0])
    end.synchronize()
    # The sim's events read its virtual clock: a model of the GPU's time, not a measurement.
    clock = "simulated GPU time" if cuctx.backend().sim is not None else "GPU time"
    print(
        f"{CHUNKS} chunks of {CHUNK * 4 >> 20} MiB, copy/compute/copy on {CHUNKS} streams: "
        f"{'correct' if np.array_equal(host, expected) else 'WRONG'}, {end - start:.3f} ms "
        f"of {clock}"
    )


def missing_wait(scale: cuctx.Kernel) -> None:
    data = cuctx.to_device(np.ones(CHUNK, np.float32))
    normalized = cuctx.zeros(CHUNK, np.float32)
    side = cuctx.Stream()
    for waits in (False, True):
        normalized.fill(0)
        cuctx.current_stream().synchronize()
        # The race is the point here: the checker collects what it finds (on the sim it would
        # warn by default), and the fix it names is printed.
        with cuctx.racecheck("collect") as check:
            scale[CHUNK // 256, 256](normalized, data, 1.0 / CHUNK, CHUNK)  # the current stream
            if waits:
                side.wait(cuctx.current_stream())  # the fix: torch's wait_stream
            out = cuctx.pinned_empty(CHUNK, np.float32)
            normalized.to_host(out=out, stream=side)  # the "sum" reads on another stream
            side.synchronize()
        total = float(out.sum(dtype=np.float64))
        verdict = "correct" if abs(total - 1.0) < 1e-3 else "stale: it ran before the scale"
        print(
            f"sum on another stream, {'with' if waits else 'without'} the wait: "
            f"{total:.4f} ({verdict})"
        )
        for finding in check.findings:
            print(f"  cuctx.racecheck: {finding.kind} race; fix: {finding.fix}")
        cuctx.current_stream().synchronize()


def main() -> None:
    library = cuctx.Library.from_source(SOURCE, sim_kernels={"scale": scale_twin})
    with cuctx.Device(0):
        overlap(library["scale"])
        missing_wait(library["scale"])
    print("(on the sim the missing wait is stale every time; on a GPU it is a race)")


if __name__ == "__main__":
    main()
