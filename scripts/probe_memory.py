"""Dev tool: what the real driver answers for the memory misuse the sim models
(tests/memory/test_memory.py::test_sim_driver_answers_misuse_like_the_driver). Each step runs in
its own process, because misuse may crash or poison the context."""

import subprocess
import sys

SETUP = """
import numpy as np
from cuda.bindings import driver as d
d.cuInit(0); _, dev = d.cuDeviceGet(0); _, ctx = d.cuCtxCreate(None, 0, dev)
_, arr = d.cuMemAlloc(32)
host = np.zeros(4); address = host.__array_interface__["data"][0]
"""
STEPS = {
    "cuMemAllocAsync(0)": "r = d.cuMemAllocAsync(0, 0)",
    "HtoDAsync past the end": "r = d.cuMemcpyHtoDAsync(int(arr) + 32, address, 8, 0); r = (r[0], d.cuCtxSynchronize()[0])",
    "DtoH past the end": "r = d.cuMemcpyDtoH(address, arr, 40)",
    "FreeAsync of an inner pointer": "r = d.cuMemFreeAsync(int(arr) + 8, 0)",
    "FreeHost of pageable memory": "r = d.cuMemFreeHost(address)",
    "HostUnregister of unregistered": "r = d.cuMemHostUnregister(address)",
    "double cuMemFree": "d.cuMemFree(arr); r = d.cuMemFree(arr)",
}
for name, code in STEPS.items():
    proc = subprocess.run(
        [sys.executable, "-c", SETUP + code + "\nprint([getattr(x, 'name', x) for x in r])"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    print(
        f"{name:32} -> {proc.stdout.strip() or 'CRASH rc=%d %s' % (proc.returncode, proc.stderr[-200:])}"
    )
