"""What the real driver does with copies and memsets issued while another device's context is
current, with page-locked memory allocated without the portable flag used by another
device, and with copies between devices in a stream capture (issue 21; dev tool: run on a
machine with two GPUs, ``python scripts/probe_multi_device.py [case ...]``).

Each case runs twice in child processes, in raw cuda.bindings calls: on the GPUs and on the
sim (its SimDriver has the same functions), and prints one JSON line: the case, what each
answered, and whether they agree. Where they disagree the sim is wrong: mirror the GPU in
src/cuctx/_driver/sim/ (``_memory._copy_context``, ``_host``, ``_capture_ops``) and in the
tests that assert the sim's model (tests/core/test_multi_device.py).

Device 0 and device 1 are used through their primary contexts c0 and c1; s0 and s1 are
non-blocking streams of them; p0 and p1 are cuMemAlloc'd buffers of N bytes. "async" is
cuStreamQuery right after a small copy queued behind a long memset: CUDA_ERROR_NOT_READY
when the copy call returned at once (the host memory was page-locked for it), CUDA_SUCCESS
when the call waited for the copy (pageable, staged).
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"

PRELUDE = r"""
import ctypes, json, sys
import numpy as np
from cuda.bindings import driver as cb
if BACKEND == "sim":
    from cuctx._driver.sim.driver import SimDriver
    d = SimDriver(2)
else:
    d = cb
out = {}
def name(r):
    r = r[0] if isinstance(r, tuple) else r
    return r.name if hasattr(r, "name") else repr(r)
def ok(r):
    assert not (r[0] if isinstance(r, tuple) else r), r
    return r[1] if isinstance(r, tuple) and len(r) == 2 else r
N = 1 << 12
ok(d.cuInit(0))
dev0, dev1 = ok(d.cuDeviceGet(0)), ok(d.cuDeviceGet(1))
c0, c1 = ok(d.cuDevicePrimaryCtxRetain(dev0)), ok(d.cuDevicePrimaryCtxRetain(dev1))
def current(c):
    ok(d.cuCtxSetCurrent(c if c is not None else cb.CUcontext(0)))
current(c1); s1 = ok(d.cuStreamCreate(1)); p1 = int(ok(d.cuMemAlloc(N))); q1 = int(ok(d.cuMemAlloc(N)))
def fill(dptr, value, stream):
    ok(d.cuMemsetD8Async(dptr, value, N, stream)); ok(d.cuStreamSynchronize(stream))
fill(p1, 7, s1); fill(q1, 0, s1)
current(c0); s0 = ok(d.cuStreamCreate(1)); p0 = int(ok(d.cuMemAlloc(N))); fill(p0, 5, s0)
portable = int(ok(d.cuMemHostAlloc(N, cb.CU_MEMHOSTALLOC_PORTABLE)))  # made in c0
def host_bytes(address):
    return np.ctypeslib.as_array((ctypes.c_uint8 * N).from_address(address))
def first(dptr):  # the first byte of device memory, read in its own device's context
    v = np.zeros(1, np.uint8); ok(d.cuMemcpyDtoH(v.ctypes.data, dptr, 1)); return int(v[0])
def synced(stream):
    return name(d.cuStreamSynchronize(stream))
BIG = 1 << 30 if BACKEND == "cuda" else 1 << 20  # the sim's query answers alike, sooner
def behind_long_work(stream, copy):
    # a copy queued behind ~8 GiB of memsets on `stream`: (its code, cuStreamQuery after it)
    big = int(ok(d.cuMemAlloc(BIG)))
    for _ in range(8):
        ok(d.cuMemsetD8Async(big, 1, BIG, stream))
    code = name(copy())
    query = name(d.cuStreamQuery(stream))
    ok(d.cuStreamSynchronize(stream)); ok(d.cuMemFree(big))
    return code, query
def capture_mode():
    return cb.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
def captured_dtod(peer_access):
    # device 0's memory copied to device 1's by a graph captured on s0
    current(c0)
    if peer_access:
        out["enable_c0_to_c1"] = name(d.cuCtxEnablePeerAccess(c1, 0))
    out["begin"] = name(d.cuStreamBeginCapture(s0, capture_mode()))
    out["copy"] = name(d.cuMemcpyDtoDAsync(q1, p0, N, s0))
    err, graph = d.cuStreamEndCapture(s0); out["end"] = name(err)
    if not err:
        err, exe = d.cuGraphInstantiate(graph, 0); out["instantiate"] = name(err)
        if not err:
            out["launch"] = name(d.cuGraphLaunch(exe, s0)); out["sync"] = synced(s0)
            current(c1); out["value"] = first(q1)
"""

CASES = {
    # -- copies and memsets of device 1's memory on s1, with each context current ----------
    "dtoh_on_s1": r"""
for who, c in (("c0_current", c0), ("c1_current", c1), ("none_current", None)):
    current(c); host_bytes(portable)[:] = 0
    out[who] = name(d.cuMemcpyDtoHAsync(portable, p1, N, s1)); out[who + "_sync"] = synced(s1)
    out[who + "_value"] = int(host_bytes(portable)[0])
""",
    "htod_on_s1": r"""
host_bytes(portable)[:] = 9
for who, c in (("c0_current", c0), ("c1_current", c1), ("none_current", None)):
    current(c); out[who] = name(d.cuMemcpyHtoDAsync(q1, portable, N, s1)); out[who + "_sync"] = synced(s1)
current(c1); out["value"] = first(q1)
""",
    "dtod_on_s1": r"""
for who, c in (("c0_current", c0), ("c1_current", c1), ("none_current", None)):
    current(c); out[who] = name(d.cuMemcpyDtoDAsync(q1, p1, N, s1)); out[who + "_sync"] = synced(s1)
""",
    "copy2d_on_s1": r"""
copy = cb.CUDA_MEMCPY2D()
copy.srcMemoryType = copy.dstMemoryType = cb.CUmemorytype.CU_MEMORYTYPE_DEVICE
copy.srcDevice, copy.dstDevice, copy.srcPitch, copy.dstPitch = p1, q1, 64, 64
copy.WidthInBytes, copy.Height = 32, N // 64
for who, c in (("c0_current", c0), ("c1_current", c1)):
    current(c); out[who] = name(d.cuMemcpy2DAsync(copy, s1)); out[who + "_sync"] = synced(s1)
""",
    "memset_on_s1": r"""
for who, c, v in (("c0_current", c0, 3), ("c1_current", c1, 4), ("none_current", None, 6)):
    current(c); out[who] = name(d.cuMemsetD8Async(q1, v, N, s1)); out[who + "_sync"] = synced(s1)
    current(c1); out[who + "_value"] = first(q1)
""",
    "alloc_free_host_func_on_s1": r"""
current(c0)
err, p = d.cuMemAllocAsync(N, s1); out["alloc_c0_current"] = name(err)
if not err:
    out["alloc_device"] = int(ok(d.cuPointerGetAttribute(cb.CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p)))
    out["free_c0_current"] = name(d.cuMemFreeAsync(p, s1))
ran = []
@ctypes.CFUNCTYPE(None, ctypes.c_void_p)
def fn(_): ran.append(1)
out["host_func_c0_current"] = name(d.cuLaunchHostFunc(s1, cb.CUhostFn(ctypes.cast(fn, ctypes.c_void_p).value), 0))
out["sync"] = synced(s1); out["host_func_ran"] = len(ran)
""",
    "peer_copy_on_s1_c0_current": r"""
current(c0)
out["peer_1_to_1"] = name(d.cuMemcpyPeerAsync(q1, c1, p1, c1, N, s1)); out["sync"] = synced(s1)
out["peer_0_to_1"] = name(d.cuMemcpyPeerAsync(q1, c1, p0, c0, N, s1)); out["sync2"] = synced(s1)
current(c1); out["value"] = first(q1)
""",
    # -- peer access: does it make device 1's memory pass the check in c0? -----------------
    "dtoh_on_s1_c0_current_with_peer_access": r"""
current(c0); out["enable_c0_to_c1"] = name(d.cuCtxEnablePeerAccess(c1, 0))
out["dtoh"] = name(d.cuMemcpyDtoHAsync(portable, p1, N, s1)); out["sync"] = synced(s1)
out["dtod_on_s1"] = name(d.cuMemcpyDtoDAsync(q1, p1, N, s1)); out["sync2"] = synced(s1)
out["disable"] = name(d.cuCtxDisablePeerAccess(c1))
""",
    "dtod_between_devices_on_s0_without_peer_access": r"""
current(c0); out["dtod"] = name(d.cuMemcpyDtoDAsync(q1, p0, N, s0)); out["sync"] = synced(s0)
current(c1); out["value"] = first(q1)
""",
    "dtod_between_devices_on_s0_with_peer_access": r"""
current(c0); out["enable_c0_to_c1"] = name(d.cuCtxEnablePeerAccess(c1, 0))
out["dtod"] = name(d.cuMemcpyDtoDAsync(q1, p0, N, s0)); out["sync"] = synced(s0)
current(c1); out["value"] = first(q1)
""",
    # -- page-locked memory without the portable flag, used by the other device -----------
    "non_portable_pinned_on_s1": r"""
current(c0); local = int(ok(d.cuMemHostAlloc(N, 0)))  # non-portable, made in c0
current(c1)
out["portable_dtoh"], out["portable_async"] = behind_long_work(s1, lambda: d.cuMemcpyDtoHAsync(portable, p1, N, s1))
out["non_portable_dtoh"], out["non_portable_async"] = behind_long_work(s1, lambda: d.cuMemcpyDtoHAsync(local, p1, N, s1))
out["non_portable_value"] = int(host_bytes(local)[0])
out["non_portable_htod"], out["non_portable_htod_async"] = behind_long_work(s1, lambda: d.cuMemcpyHtoDAsync(q1, local, N, s1))
pageable = np.zeros(N, np.uint8)
out["pageable_dtoh"], out["pageable_async"] = behind_long_work(s1, lambda: d.cuMemcpyDtoHAsync(pageable.ctypes.data, p1, N, s1))
current(c0); ok(d.cuMemFreeHost(local))
""",
    "non_portable_registered_on_s1": r"""
buf = np.zeros(N, np.uint8)
current(c0); out["register"] = name(d.cuMemHostRegister(buf.ctypes.data, N, 0))
current(c1)
out["dtoh"], out["async"] = behind_long_work(s1, lambda: d.cuMemcpyDtoHAsync(buf.ctypes.data, p1, N, s1))
out["value"] = int(buf[0])
current(c0); out["unregister"] = name(d.cuMemHostUnregister(buf.ctypes.data))
""",
    # -- copies between devices in a capture -----------------------------------------------
    "peer_copy_in_capture": r"""
current(c0); out["begin"] = name(d.cuStreamBeginCapture(s0, capture_mode()))
out["peer"] = name(d.cuMemcpyPeerAsync(p1, c1, p0, c0, N, s0))
err, status = d.cuStreamIsCapturing(s0); out["status"] = name(err) if err else status.name
err, graph = d.cuStreamEndCapture(s0); out["end"] = name(err); out["graph"] = bool(int(graph or 0))
out["query_after"] = name(d.cuStreamQuery(s0))
""",
    "dtod_between_devices_in_capture_without_peer_access": r"""
captured_dtod(peer_access=False)
""",
    "dtod_between_devices_in_capture_with_peer_access": r"""
captured_dtod(peer_access=True)
""",
}


def run_case(body: str, backend: str) -> dict:
    # what a case saw up to an exception (a sticky fault fails every later call) is kept
    code = (
        f"BACKEND = {backend!r}\n"
        + PRELUDE
        + "try:\n"
        + textwrap.indent(body, "    ")
        + "\nexcept Exception as exc:\n    out['raised'] = repr(exc)[:300]\n"
        + "print(json.dumps(out))\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]))
    try:
        run = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env
        )
    except subprocess.TimeoutExpired:
        return {"timeout": "120 s (deadlock?)"}
    line = (run.stdout.strip().splitlines() or [""])[-1]
    return (
        json.loads(line)
        if line.startswith("{")
        else {"rc": run.returncode, "stderr": run.stderr[-600:]}
    )


def main() -> None:
    only = sys.argv[1:]
    for case, body in CASES.items():
        if only and case not in only:
            continue
        gpu, sim = run_case(body, "cuda"), run_case(body, "sim")
        differ = sorted(k for k in gpu.keys() | sim.keys() if gpu.get(k) != sim.get(k))
        print(
            json.dumps(
                {"case": case, "agree": not differ, "differ": differ, "gpu": gpu, "sim": sim}
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
