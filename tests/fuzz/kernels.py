"""The kernels the fuzzer launches: tiny, each with a sim twin and a NumPy model. Every
kernel walks its elements with a grid-stride loop over the flattened 3D grid and block, so
any launch configuration computes the same result (and `count` checks that every thread of
the configuration ran)."""

from __future__ import annotations

from math import prod

import numpy as np

import cuctx

SOURCE = r"""
#define GRID_STRIDE(i, n)                                                                      \
    long long nthreads = (long long)blockDim.x * blockDim.y * blockDim.z;                      \
    long long tid = threadIdx.x                                                                \
        + blockDim.x * (threadIdx.y + (long long)blockDim.y * threadIdx.z);                    \
    long long bid = blockIdx.x + gridDim.x * (blockIdx.y + (long long)gridDim.y * blockIdx.z); \
    long long stride = nthreads * gridDim.x * gridDim.y * gridDim.z;                           \
    for (long long i = bid * nthreads + tid; i < (n); i += stride)

extern "C" __global__ void axpy(float* y, const float* x, float a, int n) {
    GRID_STRIDE(i, n) y[i] += a * x[i];
}

extern "C" __global__ void iota(long long* out, long long start, int n) {
    GRID_STRIDE(i, n) out[i] = start + i;
}

extern "C" __global__ void count(unsigned int* counter) {
    atomicAdd(counter, 1u);
}
"""


# Twins: what the kernels do, for the sim. ``n <= 0`` touches nothing (the loop never runs),
# so a null pointer with n <= 0 is a valid argument.


def axpy(grid, block, y, x, a: float, n):
    if n > 0:
        yv, xv = y.view(np.float32, n), x.view(np.float32, n)
        yv[:] = yv + np.float32(a) * xv


def iota(grid, block, out, start: int, n):
    if n > 0:
        out.view(np.int64, n)[:] = np.int64(start) + np.arange(n, dtype=np.int64)


def count(grid, block, counter):
    view = counter.view(np.uint32, 1)
    view[0] = np.uint32((int(view[0]) + prod(grid) * prod(block)) & 0xFFFFFFFF)


TWINS = {"axpy": axpy, "iota": iota, "count": count}

# Parameter kinds, in order, for the argument generator: "ptr:<dtype>", "f32", "i32", "i64".
PARAMS = {
    "axpy": ("ptr:float32", "ptr:float32", "f32", "i32"),
    "iota": ("ptr:int64", "i64", "i32"),
    "count": ("ptr:uint32",),
}


def load(cache_dir: str) -> cuctx.Library:
    """The fuzz library for the active backend (compiled once; NVRTC's cache does the rest)."""
    return cuctx.Library.from_source(SOURCE, sim_kernels=TWINS, cache_dir=cache_dir)
