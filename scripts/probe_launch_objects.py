"""Dev tool (GPU): why does the same raw cuLaunchKernel cost more on cuctx's objects than on
objects cuda.bindings made itself (benchmarks/launch.py: "cuda.bindings (void**)" against
"same objects, raw void**")? Builds both sets exactly as the benchmark does, then times every
mix of kernel handle, stream and argument memory, interleaved, in batches of 128 with a
synchronize between batches, and prints the best and the median ns per launch, and the GPU's
own time per launch (events around a batch: when it exceeds the host's, the queue fills)."""

import ctypes
import itertools
import statistics
import time

import numpy as np
from cuda.bindings import driver as drv

import cuctx
from cuctx.kernels._compiler import compile_source

SRC = r"""
extern "C" __global__ void empty(float* p, int n) {}
extern "C" __global__ void spin(long long cycles) {  // holds its stream: launches queue up
    long long start = clock64();
    while (clock64() - start < cycles) {}
}"""
BATCH, ROUNDS = 128, 60


def ok(result):
    err, *rest = result
    assert int(err) == 0, (err, rest)
    return rest[0] if len(rest) == 1 else rest


cuctx.Device(0).set_current()  # the primary context stays retained for the raw objects
cc = cuctx.Device(0).compute_capability
image = compile_source(SRC, arch=f"sm_{cc.major}{cc.minor}", cache_dir=False).image
# cuda.bindings' own objects, as benchmarks/launch.py's bindings_candidates makes them
bind_lib = ok(drv.cuLibraryLoadData(image, None, None, 0, None, None, 0))
bind_fn = drv.CUfunction(int(ok(drv.cuLibraryGetKernel(bind_lib, b"empty"))))
with cuctx.Device(0):
    bind_stream = ok(drv.cuStreamCreate(1))
    bind_ptr = int(ok(drv.cuMemAlloc(1024)))
# cuctx's, as cuctx_candidates makes them
library = cuctx.Library.from_bytes(image)
kernel = library["empty"]
with cuctx.Device(0):
    data = cuctx.zeros(256, np.float32)
    cx_stream = cuctx.Stream()
kernels = {"bindings fn": bind_fn, "cuctx fn": kernel._function}
streams = {"bindings stream": bind_stream, "cuctx stream": cx_stream._handle}
memories = {"cuMemAlloc": bind_ptr, "cuctx pool": data.ptr}
packs = {}
for name, ptr in memories.items():
    p, n = ctypes.c_void_p(ptr), ctypes.c_int(3)
    packed = (ctypes.c_void_p * 2)(ctypes.addressof(p), ctypes.addressof(n))
    packs[name] = (ctypes.addressof(packed), (p, n, packed))
start, end = ok(drv.cuEventCreate(0)), ok(drv.cuEventCreate(0))
spin = library["spin"]._function
cycles = ctypes.c_longlong(4_000_000)  # about 2 ms at 1.98 GHz: longer than a batch
spin_args = (ctypes.c_void_p * 1)(ctypes.addressof(cycles))
times = {}
gpu = {}
combos = [
    (*c, held)
    for c in itertools.product(kernels, streams, memories)
    for held in ("", "behind spin")
]
for r in range(ROUNDS):
    for combo in combos if r % 2 == 0 else combos[::-1]:
        k, s, m = kernels[combo[0]], streams[combo[1]], packs[combo[2]][0]
        launch = drv.cuLaunchKernel
        if combo[3]:
            ok(launch(spin, 1, 1, 1, 1, 1, 1, 0, s, ctypes.addressof(spin_args), 0))
        ok(drv.cuEventRecord(start, s))
        t = time.perf_counter_ns()
        for _ in range(BATCH):
            launch(k, 1, 1, 1, 32, 1, 1, 0, s, m, 0)
        t = time.perf_counter_ns() - t
        ok(drv.cuEventRecord(end, s))
        ok(drv.cuEventSynchronize(end))
        times.setdefault(combo, []).append(t / BATCH)
        gpu.setdefault(combo, []).append(ok(drv.cuEventElapsedTime(start, end)) * 1e6 / BATCH)
print(
    f"{'kernel':<12} {'stream':<16} {'memory':<11} {'queue':<12} {'best':>6} {'median':>7} "
    f"{'GPU/launch':>10}"
)
for combo in sorted(times, key=lambda c: statistics.median(times[c])):
    print(
        f"{combo[0]:<12} {combo[1]:<16} {combo[2]:<11} {combo[3] or 'empty':<12} "
        f"{min(times[combo]):6.0f} "
        f"{statistics.median(times[combo]):7.0f} {statistics.median(gpu[combo]):10.0f}"
    )
print(
    "stream flags/priority:",
    {n: (ok(drv.cuStreamGetFlags(s)), ok(drv.cuStreamGetPriority(s))) for n, s in streams.items()},
)
print(
    "stream contexts:",
    {n: int(ok(drv.cuStreamGetCtx(s))) for n, s in streams.items()},
    "current:",
    int(ok(drv.cuCtxGetCurrent())),
)
