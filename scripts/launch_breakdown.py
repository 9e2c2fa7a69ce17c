"""Dev tool: where a cuctx launch spends its host time, piece by piece, on the real driver."""
import time, ctypes
import numpy as np
import cuctx
from cuctx.compiler import compile_source
from cuda.bindings import driver as drv

SRC = 'extern "C" __global__ void empty(float* p, int n) {}'
N = 128

def per_call(fn, sync, rounds=30):
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
k = lib["empty"]
ctx = cuctx.Device(0).set_current()
stream = cuctx.Stream()
data = cuctx.zeros(256, np.float32)
launcher = k[1, 32, 0, stream]
launcher(data, 3)
buffer, go, ptrs = launcher._local.state
plan = launcher._plan
dev = launcher._device
sync = stream.synchronize
fn = k._function
h = stream._handle
p, n = ctypes.c_void_p(data.ptr), ctypes.c_int(3)
packed = (ctypes.c_void_p * 2)(ctypes.addressof(p), ctypes.addressof(n))
addr = ctypes.addressof(packed)
print("go partial type:", type(go), getattr(go, "func", None), getattr(go, "args", None)[:3])
print("raw void** same fn/stream  ", per_call(lambda: drv.cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, h, addr, 0), sync))
print("raw with cuctx's buffer    ", per_call(lambda: drv.cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, h, ctypes.addressof(ptrs), 0), sync))
print("go() (the bound partial)   ", per_call(go, sync))
print("plan.pack only             ", per_call(lambda: plan.pack(buffer, dev, (data, 3)), lambda: None))
print("launcher(data, 3)          ", per_call(lambda: launcher(data, 3), sync))
print("launcher(data.ptr, 3)      ", per_call(lambda: launcher(data.ptr, 3), sync))
cfn = drv.CUfunction(int(drv.cuLibraryGetKernel(lib._handle, b"empty")[1]))
print("raw, a fresh CUfunction    ", per_call(lambda: drv.cuLaunchKernel(cfn, 1, 1, 1, 32, 1, 1, 0, h, addr, 0), sync))
