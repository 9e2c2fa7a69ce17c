"""Pinned host-to-device and device-to-host bandwidth at 64 MiB: cuctx.copy against the same
copy through raw cuda.bindings (cuMemcpy*Async on the same stream and memory) and through
PyTorch (copy_ with non_blocking=True from/to pinned memory). Goal: cuctx/baseline >= 0.97.

Then the host cost of one copy, as benchmarks/overlap.py's pipeline makes them: an 8 MiB
slice of a page-locked array to a slice of a device array (``cuctx.copy(dev[a:b],
host[a:b], stream=s)``, slicing included) and back, in batches of 16 submissions (synchronized
between batches, only the submissions timed, the best batch counts), against the same
driver call from C (benchmarks/copy_c.c, built at run time with gcc) and through raw
cuda.bindings; also the copy of views sliced beforehand, the slicing alone, and the copy of
a slice inside ``cuctx.timeline()`` (what a timeline adds per copy). Ratios are to C.

On the sim the "raw" copy goes to the SimDriver, there is no C or PyTorch baseline, and the
numbers show the sim's speed, not a GPU's.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

import cuctx
from _bench import best_time, compare, run, start

NBYTES = 64 << 20
REPEAT = 10  # copies per measurement, then one synchronize


def gb_per_s(copy_once, sync) -> float:
    sync()
    start = time.perf_counter()
    for _ in range(REPEAT):
        copy_once()
    sync()
    return REPEAT * NBYTES / (time.perf_counter() - start) / 1e9


def torch_baselines(n: int):
    try:
        import torch
    except ImportError as exc:
        print(f"note: PyTorch cannot be imported ({exc}); no PyTorch baseline")
        return {}, {}
    if not torch.cuda.is_available():
        return {}, {}
    host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    device = torch.empty(n, dtype=torch.uint8, device="cuda")
    stream = torch.cuda.Stream()
    sync = stream.synchronize

    def h2d():
        with torch.cuda.stream(stream):
            device.copy_(host, non_blocking=True)

    def d2h():
        with torch.cuda.stream(stream):
            host.copy_(device, non_blocking=True)

    return ({"torch": lambda: gb_per_s(h2d, sync)}, {"torch": lambda: gb_per_s(d2h, sync)})


def main() -> None:
    backend, raw = start("on the sim these are NumPy copy speeds, not a GPU's")
    drv = backend.driver
    with cuctx.Device(0):
        stream = cuctx.Stream()
        host = cuctx.pinned_empty(NBYTES, np.uint8)
        host[:] = 1
        arr = cuctx.empty(NBYTES, np.uint8, stream=stream)
        raw_host = cuctx.pinned_empty(NBYTES, np.uint8)
        raw_arr = cuctx.empty(NBYTES, np.uint8, stream=stream)
        raw_dev = raw_arr.ptr
        h, address = stream._handle, raw_host.__array_interface__["data"][0]
        h2d_raw, d2h_raw = drv.cuMemcpyHtoDAsync, drv.cuMemcpyDtoHAsync
        sync = stream.synchronize
        torch_h2d, torch_d2h = torch_baselines(NBYTES) if backend.name == "cuda" else ({}, {})

        compare(
            "pinned host to device, 64 MiB",
            {
                "cuctx": lambda: gb_per_s(lambda: cuctx.copy(arr, host, stream), sync),
                raw: lambda: gb_per_s(lambda: h2d_raw(raw_dev, address, NBYTES, h), sync),
                **torch_h2d,
            },
            unit="GB/s",
            higher_is_better=True,
        )
        compare(
            "pinned device to host, 64 MiB",
            {
                "cuctx": lambda: gb_per_s(lambda: cuctx.copy(host, arr, stream), sync),
                raw: lambda: gb_per_s(lambda: d2h_raw(address, raw_dev, NBYTES, h), sync),
                **torch_d2h,
            },
            unit="GB/s",
            higher_is_better=True,
        )
        host_cost(backend, raw)


# -- the host cost of one copy --------------------------------------------------------------

CHUNK, SLICES = 8 << 20, 8  # benchmarks/overlap.py's pipeline: 64 MiB in 8 chunks
BATCH = 16  # copies submitted per timed batch (the GPU takes ~2.4 ms for them)


def per_copy(submit, sync, batches: int) -> float:
    """ns per copy of the best batch: BATCH calls ``submit(i)`` (slice i % SLICES), timed;
    then a synchronize, not timed."""
    best = float("inf")
    for _ in range(batches):
        sync()
        start = time.perf_counter_ns()
        for i in range(BATCH):
            submit(i % SLICES)
        best = min(best, time.perf_counter_ns() - start)
    sync()
    return best / BATCH


def c_program(batches: int):
    """The C program's two numbers, {"HtoD": ns, "DtoH": ns}, measured in one run of it."""
    cuda = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    exe = Path(tempfile.gettempdir()) / "cuctx_copy_c"
    subprocess.run(
        [
            "gcc",
            "-O2",
            "-o",
            str(exe),
            str(Path(__file__).with_name("copy_c.c")),
            f"-I{cuda}/include",
            "-lcuda",
        ],
        check=True,
    )

    def measure() -> dict[str, float]:
        out = subprocess.run(
            [str(exe), str(CHUNK), str(SLICES), str(BATCH), str(batches)],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        return {kind: float(ns) for kind, ns in (line.split() for line in out.splitlines())}

    return measure


def host_cost(backend, raw: str) -> None:
    gpu = backend.name == "cuda"
    batches = 30 if gpu else 3  # on the sim each batch copies 128 MiB in NumPy when synced
    n = CHUNK // 4
    host = cuctx.pinned_empty(SLICES * n, np.float32)
    host[:] = 1
    stream = cuctx.Stream()
    dev = cuctx.empty(SLICES * n, np.float32, stream=stream)
    parts = [slice(i * n, (i + 1) * n) for i in range(SLICES)]
    host_views, dev_views = [host[p] for p in parts], [dev[p] for p in parts]
    drv, h, sync = backend.driver, stream._handle, stream.synchronize
    h2d, d2h = drv.cuMemcpyHtoDAsync, drv.cuMemcpyDtoHAsync
    dev_ptr, host_ptr = dev.ptr, host.__array_interface__["data"][0]
    copy = cuctx.copy

    def in_timeline(measure):
        def measured():
            with cuctx.timeline():
                return measure()

        return measured

    def candidates(to_device: bool) -> dict:
        if to_device:

            def raw_call(i):
                h2d(dev_ptr + i * CHUNK, host_ptr + i * CHUNK, CHUNK, h)

            def of_slices(i):
                copy(dev[parts[i]], host[parts[i]], stream=stream)

            def of_views(i):
                copy(dev_views[i], host_views[i], stream=stream)
        else:

            def raw_call(i):
                d2h(host_ptr + i * CHUNK, dev_ptr + i * CHUNK, CHUNK, h)

            def of_slices(i):
                copy(host[parts[i]], dev[parts[i]], stream=stream)

            def of_views(i):
                copy(host_views[i], dev_views[i], stream=stream)

        return {
            f"{raw} call": lambda: per_copy(raw_call, sync, batches),
            "cuctx.copy of slices": lambda: per_copy(of_slices, sync, batches),
            "cuctx.copy of views": lambda: per_copy(of_views, sync, batches),
            "... in cuctx.timeline()": in_timeline(lambda: per_copy(of_slices, sync, batches)),
        }

    c_measure = None
    if gpu:
        try:
            c_measure = c_program(batches)
        except (OSError, subprocess.CalledProcessError) as exc:
            print(f"(no C baseline: {exc})")
    measures = {"HtoD": candidates(True), "DtoH": candidates(False)}
    best: dict[tuple[str, str], float] = {}
    for _ in range(5):  # rounds interleaved, so drift hits every candidate alike
        if c_measure is not None:
            for kind, ns in c_measure().items():
                best[kind, "C"] = min(best.get((kind, "C"), ns), ns)
        for kind, group in measures.items():
            for name, measure in group.items():
                ns = measure()
                best[kind, name] = min(best.get((kind, name), ns), ns)
    slicing = best_time(lambda: dev[parts[3]], inner=1000) * 1e9
    base = "C" if c_measure is not None else f"{raw} call"
    print(
        f"\n== host cost per copy of an {CHUNK >> 20} MiB slice, page-locked, batches of "
        f"{BATCH} (lower is better; ratios to the {base})"
    )
    for kind in measures:
        for name in (["C"] if c_measure is not None else []) + list(measures[kind]):
            ns = best[kind, name]
            print(f"  {kind} {name:<26} {ns:9.0f} ns   {ns / best[kind, base]:6.2f}x {base}")
    print(f"  dev[a:b] (a DeviceArray slice) {slicing:9.0f} ns")


if __name__ == "__main__":
    run(main)
