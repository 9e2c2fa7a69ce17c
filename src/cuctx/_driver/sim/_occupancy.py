"""Occupancy of the sim: the CUDA occupancy calculator's rules for sm_90 (warps, blocks,
registers and shared memory per multiprocessor), the thread and dynamic shared memory limits
of a kernel, and cuOccupancy*."""

from __future__ import annotations

from typing import TYPE_CHECKING

from cuda.bindings.driver import CUdevice_attribute

from ._common import INVALID_HANDLE, NOT_SUPPORTED, OK

if TYPE_CHECKING:
    from ...devcode._layout import KernelImage
    from ._library import SimKernel

A = CUdevice_attribute


class OccupancyModel:
    """cuOccupancyMaxActiveBlocksPerMultiprocessor, cuOccupancyMaxPotentialBlockSize."""

    def _occupancy_kernel(self, func):
        err, ctx = self._work_context()
        if err:
            return err, None, None
        kernel = self._kernel(func)
        if kernel is None:
            return INVALID_HANDLE, None, None
        return OK, kernel, self._devices[ctx.device].attributes

    def cuOccupancyMaxActiveBlocksPerMultiprocessor(self, func, blockSize, dynamicSMemSize):
        err, kernel, spec = self._occupancy_kernel(func)
        if err:
            return (err, None)
        return (OK, occupancy(kernel, int(blockSize), int(dynamicSMemSize), spec))

    def cuOccupancyMaxPotentialBlockSize(self, func, blockSizeToDynamicSMemSize,
                                         dynamicSMemSize, blockSizeLimit):
        err, kernel, spec = self._occupancy_kernel(func)
        if err:
            return (err, None, None)
        if blockSizeToDynamicSMemSize not in (None, 0):
            return (NOT_SUPPORTED, None, None)
        limit = max_threads(kernel.image, spec)
        if int(blockSizeLimit) > 0:
            limit = min(limit, int(blockSizeLimit))
        best_size, best_warps = 0, -1
        for size in range(limit - limit % 32 or limit, 0, -32):
            warps = occupancy(kernel, size, int(dynamicSMemSize), spec) * (-(-size // 32))
            if warps > best_warps:
                best_size, best_warps = size, warps
        blocks = occupancy(kernel, best_size, int(dynamicSMemSize), spec)
        return (OK, blocks * spec[A.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT], best_size)


def max_threads(image: KernelImage, spec: dict) -> int:
    """Threads per block the kernel can run with: its launch bounds, the device's limit and
    what its registers allow (allocated per warp in units of 256)."""
    limit = min(image.max_threads, spec[A.CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK])
    if image.regs:
        per_warp = -(-image.regs * 32 // 256) * 256
        limit = min(limit, spec[A.CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK] // per_warp * 32)
    return limit


def dynamic_limit(kernel: SimKernel, device: int, spec: dict) -> int:
    """Dynamic shared memory a launch may ask for: 48 KiB less the static part, unless the
    user raised CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES."""
    default = spec[A.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK] - kernel.image.shared
    return kernel.max_dynamic_shared.get(device, max(default, 0))


def occupancy(kernel: SimKernel, threads: int, dynamic_shared: int, spec: dict) -> int:
    """Resident blocks per multiprocessor, limited by warps, blocks, registers and shared
    memory (the CUDA occupancy calculator's rules for sm_90)."""
    if threads <= 0 or threads > max_threads(kernel.image, spec):
        return 0
    warps = -(-threads // 32)
    limits = [spec[A.CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR] // 32 // warps,
              spec[A.CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR]]
    if kernel.image.regs:
        per_warp = -(-kernel.image.regs * 32 // 256) * 256
        limits.append(spec[A.CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR]
                      // per_warp // warps)
    shared = kernel.image.shared + dynamic_shared
    if shared:
        per_block = -(-(shared + spec[A.CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK])
                      // 128) * 128
        limits.append(spec[A.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR] // per_block)
    return max(min(limits), 0)
