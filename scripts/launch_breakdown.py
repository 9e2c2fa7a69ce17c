"""Dev tool: where a cuctx launch spends its host time, piece by piece, on the real driver,
all in one process and interleaved (absolute numbers drift between processes)."""

import ctypes
import time

import numpy as np
from cuda.bindings import driver as drv

import cuctx
from cuctx.kernels._compiler import compile_source

SRC = 'extern "C" __global__ void empty(float* p, int n) {}'
N = 128


def per_call(fn, sync, rounds=20):
    best = 1e9
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(N):
            fn()
        best = min(best, (time.perf_counter() - t) / N)
        sync()
    return best * 1e9


cc = cuctx.Device(0).compute_capability
image = compile_source(SRC, arch=f"sm_{cc.major}{cc.minor}", cache_dir=False).image
lib = cuctx.Library.from_bytes(image)
kernel = lib["empty"]
cuctx.Device(0).set_current()
stream = cuctx.Stream()
data = cuctx.zeros(256, np.float32)
launcher = kernel[1, 32, 0, stream]
launcher(data, 3)
launcher(data, 3)
print("fast path generated:", launcher._fast is not None)
sync = stream.synchronize
h = stream._handle
err, raw_lib = drv.cuLibraryLoadData(image, None, None, 0, None, None, 0)
raw_fn = drv.CUfunction(int(drv.cuLibraryGetKernel(raw_lib, b"empty")[1]))
err, raw_stream = drv.cuStreamCreate(1)
p, n = ctypes.c_void_p(data.ptr), ctypes.c_int(3)
packed = (ctypes.c_void_p * 2)(ctypes.addressof(p), ctypes.addressof(n))
addr = ctypes.addressof(packed)
buffer, go = launcher._local.state
cases = {
    "raw: raw library, raw stream": (
        lambda: drv.cuLaunchKernel(raw_fn, 1, 1, 1, 32, 1, 1, 0, raw_stream, addr, 0),
        lambda: drv.cuStreamSynchronize(raw_stream),
    ),
    "raw: cuctx kernel, cuctx stream": (
        lambda: drv.cuLaunchKernel(kernel._function, 1, 1, 1, 32, 1, 1, 0, h, addr, 0),
        sync,
    ),
    "raw: raw library, cuctx stream": (
        lambda: drv.cuLaunchKernel(raw_fn, 1, 1, 1, 32, 1, 1, 0, h, addr, 0),
        sync,
    ),
    "cuctx go() (bound driver call)": (go, sync),
    "cuctx launcher(data, 3)": (lambda: launcher(data, 3), sync),
    "cuctx fast path only (no __call__)": (lambda: launcher._fast((data, 3)), sync),
}
best = {}
for _ in range(5):
    for name, (fn, s) in cases.items():
        best[name] = min(best.get(name, 1e12), per_call(fn, s))
for name, ns in best.items():
    print(f"  {name:<36} {ns:7.0f} ns")
