"""Dev tool: does the device's pool get back stream-ordered memory whose free was queued
behind a kernel that faulted, once the context is reset? The sim says yes (see "Decisions"
in docs/ARCHITECTURE.md); this asks a GPU. Raw cuda.bindings, one process per case:

- control: allocate, free, synchronize, reset: the free ran;
- queued free behind a fault: allocate, launch a kernel that writes to address 0, queue
  the free, synchronize (700, sticky), reset;
- live across a fault: allocate, fault, reset, never free (the pool keeps it: measured).

Each case prints the device's free memory (after trimming the default pool to 0) before the
allocation and after the reset, in MiB.

    usage: python scripts/probe_pool_fault.py
"""

import subprocess
import sys

SETUP = r"""
import numpy as np
from cuda.bindings import driver as d, nvrtc

def ok(result):
    err = result[0] if isinstance(result, tuple) else result
    assert int(err) == 0, result
    return result[1] if isinstance(result, tuple) and len(result) == 2 else result

ok(d.cuInit(0))
dev = ok(d.cuDeviceGet(0))

def open_primary():
    ctx = ok(d.cuDevicePrimaryCtxRetain(dev))
    ok(d.cuCtxSetCurrent(ctx))
    return ctx

def free_mib():
    pool = ok(d.cuDeviceGetDefaultMemPool(dev))
    ok(d.cuMemPoolTrimTo(pool, 0))
    err, free, _ = d.cuMemGetInfo()
    assert int(err) == 0, err
    return free / 2**20

def reset():
    ok(d.cuDevicePrimaryCtxRelease(dev))
    ok(d.cuDevicePrimaryCtxReset(dev))
    open_primary()

src = b'extern "C" __global__ void bad(int* p) { *(volatile int*)0 = 1; }'
prog = ok(nvrtc.nvrtcCreateProgram(src, b"bad.cu", 0, [], []))
major = ok(d.cuDeviceGetAttribute(
    d.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev))
minor = ok(d.cuDeviceGetAttribute(
    d.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev))
ok(nvrtc.nvrtcCompileProgram(prog, 1, [f"--gpu-architecture=sm_{major}{minor}".encode()]))
size = ok(nvrtc.nvrtcGetCUBINSize(prog))
cubin = b" " * size
ok(nvrtc.nvrtcGetCUBIN(prog, cubin))

open_primary()
stream = ok(d.cuStreamCreate(0))
NBYTES = 256 << 20

def fault():
    module = ok(d.cuModuleLoadData(cubin))
    kernel = ok(d.cuModuleGetFunction(module, b"bad"))
    arg = np.array([0], dtype=np.uint64)
    params = np.array([arg.ctypes.data], dtype=np.uint64)
    ok(d.cuLaunchKernel(kernel, 1, 1, 1, 1, 1, 1, 0, stream, params.ctypes.data, 0))

before = free_mib()
ptr = ok(d.cuMemAllocAsync(NBYTES, stream))
ok(d.cuStreamSynchronize(stream))
"""
CASES = {
    "control (free ran, then reset)": """
ok(d.cuMemFreeAsync(ptr, stream)); ok(d.cuStreamSynchronize(stream)); reset()
""",
    "free queued behind a fault, reset": """
fault(); print("free queued:", d.cuMemFreeAsync(ptr, stream)[0].name)
print("synchronize:", d.cuStreamSynchronize(stream)[0].name); reset()
""",
    "live across a fault, reset": """
fault(); print("synchronize:", d.cuStreamSynchronize(stream)[0].name); reset()
""",
}
REPORT = """
after = free_mib()
print(f"free before {before:.0f} MiB, after the reset {after:.0f} MiB: "
      f"{before - after:.0f} MiB still held")
"""

for name, code in CASES.items():
    proc = subprocess.run(
        [sys.executable, "-c", SETUP + code + REPORT], capture_output=True, text=True, timeout=120
    )
    out = proc.stdout.strip().replace("\n", "; ")
    print(f"{name:36} -> {out or 'CRASH rc=%d %s' % (proc.returncode, proc.stderr[-300:])}")
