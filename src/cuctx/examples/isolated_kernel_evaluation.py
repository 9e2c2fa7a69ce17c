"""Evaluating candidate kernels in worker processes: a fault or a hang costs one worker.

A harness that tries generated kernels (what KernelBench or an autotuner does) meets
kernels that write out of bounds or never finish. On a GPU a sticky fault leaves the whole
process unable to do CUDA work, and a hung kernel cannot be stopped, so each candidate runs
in a `cuctx.IsolatedExecutor` worker: a fault is an exception, a hang is a timeout, the
worker is replaced (from a warm standby) and the evaluation goes on. The input and each
candidate's output live in a ``MemoryPool(device, ipc=True)``: the worker writes the
caller's array, and the caller checks it.
"""

from __future__ import annotations

import time

import numpy as np

import cuctx

N = 1 << 16
TIMEOUT_S = 3.0  # a candidate's budget: compile (cached), launch, synchronize

# Each candidate computes out = 2 * x, or tries to.
HEADER = 'extern "C" __global__ void scale(float* out, const float* x, int n) {\n'
CANDIDATES = {
    "scale_simple": HEADER
    + """
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = 2.0f * x[i];
}""",
    "scale_overrun": HEADER
    + """
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i + (1ll << 38)] = 2.0f * x[i];  // an index a terabyte past the end
}""",
    "scale_grid_stride": HEADER
    + """
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x)
        out[i] = x[i] + x[i];
}""",
    "scale_squared": HEADER
    + """
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = x[i] * x[i];  // the wrong formula
}""",
    "scale_spin": HEADER
    + """
    volatile const float* v = x;
    while (v[0] >= 0.0f) {}  // waits for a value that never comes
}""",
    "scale_unguarded": HEADER
    + """
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    out[i * 4096] = 2.0f * x[i];  // no bounds check, and a stride far too large
}""",
}


# What the simulated GPU runs for each candidate: the same computation, the same bug.
def twin_simple(grid, block, out, x, n):
    out.view(np.float32, n)[:] = 2 * x.view(np.float32, n)


def twin_overrun(grid, block, out, x, n):
    out.view(np.float32, n + (1 << 38))  # past the end: an illegal address


def twin_squared(grid, block, out, x, n):
    values = x.view(np.float32, n)
    out.view(np.float32, n)[:] = values * values


def twin_spin(grid, block, out, x, n):
    while x.view(np.float32, 1)[0] >= 0:
        time.sleep(0.01)


def twin_unguarded(grid, block, out, x, n):
    out.view(np.float32, grid[0] * block[0] * 4096)  # past the end: an illegal address


TWINS = {
    "scale_simple": twin_simple,
    "scale_overrun": twin_overrun,
    "scale_grid_stride": twin_simple,
    "scale_squared": twin_squared,
    "scale_spin": twin_spin,
    "scale_unguarded": twin_unguarded,
}


def evaluate(name: str, out: cuctx.DeviceArray, x: cuctx.DeviceArray) -> float:
    """In a worker: load candidate ``name`` and run it on the caller's arrays; its time in
    ms. The executor synchronizes the device after this returns, so a fault the kernel hits
    later is still this call's."""
    library = cuctx.Library.from_source(CANDIDATES[name], sim_kernels={"scale": TWINS[name]})
    kernel = library["scale"]
    start, end = cuctx.Event(timing=True), cuctx.Event(timing=True)
    start.record()
    kernel[N // 256, 256](out, x, N)
    end.record()
    end.synchronize()
    return end - start


def noop() -> None:
    """A call that only tells the worker is there."""


def main() -> None:
    for name, source in CANDIDATES.items():  # compile errors belong to the harness, and
        cuctx.Library.from_source(source, sim_kernels={"scale": TWINS[name]})  # fill the cache
    pool = cuctx.MemoryPool(0, ipc=True)
    x = cuctx.to_device(np.linspace(0, 1, N, dtype=np.float32), pool=pool)
    expected = 2 * x.to_host()
    rows, counts = [], {"correct": 0, "wrong": 0, "fault": 0, "timeout": 0}
    with cuctx.IsolatedExecutor(devices=[0], standby=True, timeout=TIMEOUT_S) as ex:
        ex.submit(noop).result()  # the worker is up
        for name in CANDIDATES:
            out = cuctx.zeros(N, np.float32, pool=pool)  # a fault may leave partial writes
            recovery = ""
            try:
                ms = ex.submit(evaluate, name, out, x).result()
            except cuctx.WorkerFaultError as exc:
                kind, result = "fault", f"fault: {exc.name}"
            except cuctx.WorkerTimeoutError:
                kind, result = "timeout", f"timeout after {TIMEOUT_S:g} s"
            else:
                error = float(np.abs(out.to_host() - expected).max())
                kind = "correct" if error == 0 else "wrong"
                result = (
                    f"{kind} ({ms:.3f} ms)"
                    if error == 0
                    else f"wrong answer (max error {error:.3g})"
                )
            if kind in ("fault", "timeout"):  # the worker was replaced: time until it serves
                lost = time.perf_counter()
                ex.submit(noop).result()
                recovery = f"{time.perf_counter() - lost:.3f} s"
            counts[kind] += 1
            rows.append((name, result, recovery))
        replaced = ex.workers[0].replaced
    print(f"{'candidate':<20} {'result':<42} next call served after")
    for name, result, recovery in rows:
        print(f"{name:<20} {result:<42} {recovery}")
    print(
        f"{len(rows)} candidates: {counts['correct']} correct, {counts['wrong']} wrong, "
        f"{counts['fault']} faults, {counts['timeout']} timeout; the worker was replaced "
        f"{replaced} times, and this process never faulted"
    )
    print(f"the caller's own arrays still work: x sums to {float(x.to_host().sum()):.1f}")
    if cuctx.backend().sim is not None:
        print("(kernel times are the simulated GPU's, modelled; recoveries are wall time)")


if __name__ == "__main__":
    main()
