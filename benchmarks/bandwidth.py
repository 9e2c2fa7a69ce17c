"""Pinned host-to-device and device-to-host bandwidth at 64 MiB: cuctx.copy against the same
copy through raw cuda.bindings (cuMemcpy*Async on the same stream and memory) and through
PyTorch (copy_ with non_blocking=True from/to pinned memory). Goal: cuctx/baseline >= 0.97.

On the sim the "raw" copy goes to the SimDriver and there is no PyTorch baseline; the
numbers then show the sim's speed, not a GPU's.
"""

from __future__ import annotations

import time

import numpy as np

import cuctx
from _bench import compare, run, start

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

        compare("pinned host to device, 64 MiB", {
            "cuctx": lambda: gb_per_s(lambda: cuctx.copy(arr, host, stream), sync),
            raw: lambda: gb_per_s(lambda: h2d_raw(raw_dev, address, NBYTES, h), sync),
            **torch_h2d,
        }, unit="GB/s", higher_is_better=True)
        compare("pinned device to host, 64 MiB", {
            "cuctx": lambda: gb_per_s(lambda: cuctx.copy(host, arr, stream), sync),
            raw: lambda: gb_per_s(lambda: d2h_raw(address, raw_dev, NBYTES, h), sync),
            **torch_d2h,
        }, unit="GB/s", higher_is_better=True)


if __name__ == "__main__":
    run(main)
