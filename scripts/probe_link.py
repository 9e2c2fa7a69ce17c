"""Issue 24's closing checks, one or two lines each, on the backend CUCTX_BACKEND names (run it
on a GPU, and with CUCTX_BACKEND=sim beside it):

1. an LTO link: a C++ kernel and a device function compiled separately to LTO-IR, run;
2. a PTX -> cubin compile, the cubin loaded and run;
3. a link error with the linker's log (a kernel whose device function is missing);
4. the driver's linker (nvJitLink hidden) linking the same pieces without LTO;
5. the occupancy queries for clusters and dynamic shared memory (the sim models them).

    python scripts/probe_link.py
"""

import numpy as np

import cuctx
from cuctx.devcode._kinds import is_cubin
from cuctx.kernels import _jitlink

KERNEL = r"""
extern __device__ float scale(float x, float by);
extern "C" __global__ void scale_all(float* y, float by, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = scale(y[i], by);
}"""
DEVICE_FUNCTION = "__device__ float scale(float x, float by) { return x * by; }"


def scale_all_on_the_sim(grid, block, y, by, n):
    y.view(np.float32, n)[:] *= np.float32(by)


def run(library):
    y = cuctx.to_device(np.arange(6, dtype=np.float32))
    library["scale_all"][1, 32](y, 2.0, 6)
    return y.to_host().tolist()


device = cuctx.Device(0)
arch = "sm_{}{}".format(*device.compute_capability)
print(
    f"backend {cuctx.backend().name}, {device.name} ({arch}), "
    f"nvJitLink {_jitlink.nvjitlink_version()}"
)

ltoir = cuctx.compile_source(
    DEVICE_FUNCTION, arch=arch, target="ltoir", name="scale.cu", cache_dir=False
)
lib = cuctx.Library.link(
    [KERNEL, ltoir], lto=True, cache_dir=False, sim_kernels={"scale_all": scale_all_on_the_sim}
)
print(
    f"1. LTO link ({len(ltoir.image)} bytes of LTO-IR + C++ kernel) -> {lib!r}: "
    f"scale_all(arange(6), 2) = {run(lib)}"
)

ptx = cuctx.compile_source(
    'extern "C" __global__ void fill(int* p, int v) { p[threadIdx.x] = v; }',
    arch=arch,
    target="ptx",
    cache_dir=False,
)
cubin = cuctx.compile_source(ptx.image, arch=arch, language="ptx", cache_dir=False)
fill = cuctx.Library.from_bytes(
    cubin.image, sim_kernels={"fill": lambda grid, block, p, v: p.view(np.int32, block[0]).fill(v)}
)
out = cuctx.zeros(4, np.int32)
fill["fill"][1, 4](out, 7)
print(
    f"2. PTX ({len(ptx.image)} bytes) -> cubin ({cubin.kind}, {len(cubin.image)} bytes, "
    f"a cubin: {is_cubin(cubin.image)}): fill -> {out.to_host().tolist()}"
)

try:
    cuctx.Library.link([("kernel.cu", KERNEL)], lto=True, cache_dir=False)
    print("3. link error: none raised (unexpected)")
except cuctx.LinkError as error:
    print("3. link error: " + " | ".join(str(error).splitlines()[:2]))
    print("   log: " + " | ".join(error.log.splitlines()))

real = _jitlink.nvjitlink_version
_jitlink.nvjitlink_version = lambda: None
try:
    lib = cuctx.Library.link(
        [KERNEL, DEVICE_FUNCTION], cache_dir=False, sim_kernels={"scale_all": scale_all_on_the_sim}
    )
    print(f"4. driver's linker: {run(lib)}")
except cuctx.CudaError as error:
    print(f"4. driver's linker: {type(error).__name__}: {str(error).splitlines()[0]}")
finally:
    _jitlink.nvjitlink_version = real

kernel = lib["scale_all"]
print(
    f"5. suggest_block_size(lambda b: 4*b) = {tuple(kernel.suggest_block_size(lambda b: 4 * b))}"
    f", available_dynamic_shared_memory(2, 256) = "
    f"{kernel.available_dynamic_shared_memory(2, 256)}, max_cluster_size(128) = "
    f"{kernel.max_cluster_size(128)}, max_active_clusters(c, 128) for c in 1,2,4,8 = "
    f"{[kernel.max_active_clusters(c, 128) for c in (1, 2, 4, 8)]}, with 1024 threads and "
    f"48 KiB: {[kernel.max_active_clusters(c, 1024, 49152) for c in (1, 2, 4, 8)]}"
)
