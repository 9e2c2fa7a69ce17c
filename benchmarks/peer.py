"""Two GPUs: copy bandwidth between them and the latency of a cross-device event wait,
cuctx against raw cuda.bindings, PyTorch and the link's own figure.

- Copies of 256 MiB, device 0 -> 1 and 1 -> 0, each on a stream of the destination device:
  cuctx.copy against cuMemcpyPeerAsync on the same stream and memory, first without peer
  access, then with it enabled both ways (Device.enable_peer_access). With peer access,
  PyTorch's ``tensor.to("cuda:1")`` and ``dst.copy_(src)`` join (PyTorch enables peer access
  for its own copies between devices, so it has no line without). Goal: cuctx/raw >= 0.97.
- The link's figure per direction: active NVLink links x their speed, from NVML (the
  nvidia-ml-py package) or ``nvidia-smi nvlink -s``; "unknown" when neither says.
- A cross-device event wait, timed from the host: record an event on device 0, make a
  stream of device 1 wait for it, record there and synchronize that record; against the same
  chain in raw cuda.bindings and PyTorch, and against cuctx's chain within one device.

It needs two GPUs: on one GPU or on the sim it says why it measures nothing and exits 0.
"""

from __future__ import annotations

import re
import subprocess
import time

import numpy as np
from cuda.bindings.driver import CUevent_flags, CUstream_flags

import cuctx
from _bench import best_time, compare, run, start

NBYTES = 256 << 20
REPEAT = 10  # copies per measurement, then one synchronize
INNER = 2000  # event chains per measurement


def gb_per_s(copy_once, sync) -> float:
    sync()
    begin = time.perf_counter()
    for _ in range(REPEAT):
        copy_once()
    sync()
    return REPEAT * NBYTES / (time.perf_counter() - begin) / 1e9


# -- the link -------------------------------------------------------------------------------


def link_figure(d0: cuctx.Device, d1: cuctx.Device) -> tuple[float | None, str]:
    """(GB/s each way or None, how it was found): NVML first, then nvidia-smi."""
    try:
        import pynvml
    except ImportError:
        why = "nvidia-ml-py is not installed"
    else:
        try:
            return _nvml_link(pynvml, d0, d1)
        except pynvml.NVMLError as exc:
            why = f"NVML: {exc}"
    figure, how = _smi_link(d0)
    return figure, f"{how}; {why}"


def _nvml_link(nvml, d0: cuctx.Device, d1: cuctx.Device) -> tuple[float | None, str]:
    nvml.nvmlInit()
    try:
        h0 = nvml.nvmlDeviceGetHandleByUUID(d0.uuid)
        h1 = nvml.nvmlDeviceGetHandleByUUID(d1.uuid)
        active = 0
        for link in range(nvml.NVML_NVLINK_MAX_LINKS):
            try:
                active += nvml.nvmlDeviceGetNvLinkState(h0, link) == nvml.NVML_FEATURE_ENABLED
            except nvml.NVMLError:
                continue  # a link this device does not have
        [speed] = nvml.nvmlDeviceGetFieldValues(h0, [nvml.NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON])
        status = nvml.nvmlDeviceGetP2PStatus(h0, h1, nvml.NVML_P2P_CAPS_INDEX_NVLINK)
    finally:
        nvml.nvmlShutdown()
    between = "yes" if status == nvml.NVML_P2P_STATUS_OK else "no"
    if not active or speed.nvmlReturn != nvml.NVML_SUCCESS:
        return None, f"NVML: no active NVLink on device 0 (peer over NVLink: {between})"
    per_link = speed.value.uiVal / 1000
    return active * per_link, (
        f"NVML: {active} active NVLink links x {per_link:.3f} GB/s; "
        f"device 0 to 1 over NVLink: {between}"
    )


def _smi_link(d0: cuctx.Device) -> tuple[float | None, str]:
    try:
        out = subprocess.run(
            ["nvidia-smi", "nvlink", "-s", "-i", d0.uuid],
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"nvidia-smi nvlink -s: {exc}"
    speeds = [float(s) for s in re.findall(r"Link \d+: ([\d.]+) GB/s", out)]
    if not speeds:
        return None, "nvidia-smi nvlink -s: no active link on device 0"
    return sum(speeds), f"nvidia-smi nvlink -s: {len(speeds)} active links"


# -- copies ---------------------------------------------------------------------------------


def torch_copies(src_device: int, dst_device: int) -> dict:
    """PyTorch's two ways of copying between devices, or none (with the reason printed)."""
    try:
        import torch
    except ImportError as exc:
        print(f"note: PyTorch cannot be imported ({exc}); no PyTorch baseline")
        return {}
    if torch.cuda.device_count() < 2:
        print("note: PyTorch sees fewer than two GPUs; no PyTorch baseline")
        return {}
    src = torch.ones(NBYTES, dtype=torch.uint8, device=f"cuda:{src_device}")
    dst = torch.empty(NBYTES, dtype=torch.uint8, device=f"cuda:{dst_device}")
    target = f"cuda:{dst_device}"

    def sync():
        torch.cuda.synchronize(src_device)
        torch.cuda.synchronize(dst_device)

    return {
        f'torch .to("{target}")': lambda: gb_per_s(lambda: src.to(target, non_blocking=True), sync),
        "torch copy_": lambda: gb_per_s(lambda: dst.copy_(src, non_blocking=True), sync),
    }


def copies(
    backend, raw: str, src, dst, stream: cuctx.Stream, title: str, figure: float | None, extra: dict
) -> None:
    """Compare the copies of ``src`` into ``dst`` on ``stream`` (with ``extra`` baselines
    and the link's figure)."""
    peer, n = backend.driver.cuMemcpyPeerAsync, NBYTES
    args = (dst.ptr, dst.context._handle, src.ptr, src.context._handle, n, stream._handle)
    candidates = {
        "cuctx": lambda: gb_per_s(lambda: cuctx.copy(dst, src, stream), stream.synchronize),
        raw: lambda: gb_per_s(lambda: peer(*args), stream.synchronize),
        **extra,
    }
    if figure is not None:
        candidates["link"] = lambda: figure
    compare(
        f"device {src.device.ordinal} to {dst.device.ordinal}, {n >> 20} MiB, {title}",
        candidates,
        unit="GB/s",
        higher_is_better=True,
    )


# -- a cross-device event wait ----------------------------------------------------------------


def event_waits(backend, raw: str, d0: cuctx.Device, d1: cuctx.Device) -> None:
    drv = backend.driver
    s0, s0b, s1 = cuctx.Stream(d0), cuctx.Stream(d0), cuctx.Stream(d1)
    with d0:
        e0 = cuctx.Event()
        e0b = cuctx.Event()
    with d1:
        e1 = cuctx.Event()

    def chain(first, second, done):
        def run():
            first.record(e0)
            second.wait(e0)
            second.record(done)
            done.synchronize()

        return run

    flags = int(CUevent_flags.CU_EVENT_DISABLE_TIMING)
    non_blocking = int(CUstream_flags.CU_STREAM_NON_BLOCKING)
    with d0:
        raw_s0, raw_e0 = drv.cuStreamCreate(non_blocking)[1], drv.cuEventCreate(flags)[1]
    with d1:
        raw_s1, raw_e1 = drv.cuStreamCreate(non_blocking)[1], drv.cuEventCreate(flags)[1]
    record, wait, synchronize = drv.cuEventRecord, drv.cuStreamWaitEvent, drv.cuEventSynchronize

    def raw_chain():
        record(raw_e0, raw_s0)
        wait(raw_s1, raw_e0, 0)
        record(raw_e1, raw_s1)
        synchronize(raw_e1)

    us = lambda fn: best_time(fn, inner=INNER, rounds=3) * 1e6
    candidates = {
        "cuctx": lambda: us(chain(s0, s1, e1)),
        raw: lambda: us(raw_chain),
        **torch_chain(us),
        "cuctx, one device": lambda: us(chain(s0, s0b, e0b)),
    }
    compare(
        "event recorded on device 0, waited for on device 1, recorded there, synchronized"
        " (host round trip)",
        candidates,
        unit="us",
    )
    for name, handle in (
        ("cuEventDestroy", raw_e0),
        ("cuEventDestroy", raw_e1),
        ("cuStreamDestroy", raw_s0),
        ("cuStreamDestroy", raw_s1),
    ):
        getattr(drv, name)(handle)


def torch_chain(us) -> dict:
    try:
        import torch
    except ImportError:
        return {}  # said once, with the copies
    if torch.cuda.device_count() < 2:
        return {}
    ts0, ts1 = torch.cuda.Stream(device=0), torch.cuda.Stream(device=1)
    e0, e1 = torch.cuda.Event(), torch.cuda.Event()

    def run():
        e0.record(ts0)
        ts1.wait_event(e0)
        e1.record(ts1)
        e1.synchronize()

    return {"torch": lambda: us(run)}


def main() -> None:
    backend, raw = start("the sim's copies between devices are its model, not measurements")
    devices = cuctx.devices()
    if backend.name != "cuda" or len(devices) < 2:
        where = "a GPU" if backend.name == "cuda" else f"the {backend.name} backend"
        print(
            f"skipped: copies and waits between devices need two GPUs; {where} has "
            f"{len(devices)} device(s). Run it on a machine with two."
        )
        return
    d0, d1 = devices[:2]
    figure, how = link_figure(d0, d1)
    print(
        "link between device 0 and 1: "
        + (f"{figure:.1f} GB/s each way ({how})" if figure else f"unknown ({how})")
    )
    a0, a1 = (cuctx.full(NBYTES, 1, np.uint8, device=d) for d in (d0, d1))
    s0, s1 = cuctx.Stream(d0), cuctx.Stream(d1)  # each direction on its destination's
    d0.synchronize()
    d1.synchronize()
    copies(backend, raw, a0, a1, s1, "no peer access", figure, {})
    copies(backend, raw, a1, a0, s0, "no peer access", figure, {})
    if d0.can_access_peer(d1) and d1.can_access_peer(d0):
        d0.enable_peer_access(d1)
        d1.enable_peer_access(d0)
        copies(backend, raw, a0, a1, s1, "peer access enabled", figure, torch_copies(0, 1))
        copies(backend, raw, a1, a0, s0, "peer access enabled", figure, torch_copies(1, 0))
        d0.disable_peer_access(d1)
        d1.disable_peer_access(d0)
    else:
        print(
            "note: the devices cannot access each other (cuDeviceCanAccessPeer is 0): no "
            "measurement with peer access"
        )
    event_waits(backend, raw, d0, d1)


if __name__ == "__main__":
    run(main)
