"""Occupancy of the sim: the CUDA occupancy calculator's rules for sm_90 (warps, blocks,
registers and shared memory per multiprocessor), the thread and dynamic shared memory limits
of a kernel, and cuOccupancy* (clusters: a model of an H100's GPCs).

The cluster model is fitted to what an H100 80GB HBM3 (driver 580) answered in
scripts/probe_link.py (its item 5) for a kernel resident 16 times per SM in blocks of 128
threads and twice in blocks of 1024 threads with 48 KiB of dynamic shared memory:
cuOccupancyMaxActiveClusters for clusters of 1, 2, 4 and 8 blocks gave 1056, 528, 248, 124
and 264, 132, 62, 30; cuOccupancyMaxPotentialClusterSize gave 8. Each figure below is the
one that explains them:

- at most 8 blocks of a cluster launch per SM (``_CLUSTER_BLOCKS_PER_SM``): single-block
  clusters of 128 threads are 1056 = 132 x 8, not the 132 x 16 that the occupancy of such
  blocks gives, while those of 1024 threads are 264 = 132 x 2, so it is a ceiling, not a
  share;
- a cluster runs on one GPC, and one of more than 2 blocks on at most 16 of its SMs
  (``_GPC_CLUSTER_SMS``; 16 is also the largest cluster an H100 runs at all): clusters of 2
  take every SM (528 = 132 x 8 / 2, 132 = 132 x 2 / 2) but those of 4 and 8 leave 8 SMs
  out (248 = 124 x 8 / 4, 124 = 124 x 8 / 8), two in each GPC of 18;
- the 132 SMs in 8 GPCs of 18, 18, 18, 18, 16, 16, 14, 14 (``_H100_GPCS``): clusters per GPC
  are its SMs (at most 16 for more than 2 blocks) times the blocks per SM, over the cluster
  size, rounded down; with 2 blocks per SM that gives 6 x 8 + 2 x 7 = 62 clusters of 4 and
  6 x 4 + 2 x 3 = 30 of 8. Among the splits of 132 SMs into 8 GPCs of at most 9 TPCs (a
  full GH100's) this is the only one that gives all eight answers.

Which TPCs are fused off varies from chip to chip, and the answers for clusters of 3, 5, 6
and 7 blocks were not measured (the 16-SM rule may start at 3 or 4):
scripts/probe_cluster_occupancy.py prints a GPU's answers beside the sim's.
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING

from cuda.bindings.driver import CUdevice_attribute, CUlaunchAttributeID

from ._common import INVALID_CLUSTER_SIZE, INVALID_HANDLE, INVALID_VALUE, OK

if TYPE_CHECKING:
    from ...devcode._layout import KernelImage
    from ._library import SimKernel

A = CUdevice_attribute


class OccupancyModel:
    """cuOccupancyMaxActiveBlocksPerMultiprocessor, cuOccupancyMaxPotentialBlockSize,
    cuOccupancyAvailableDynamicSMemPerBlock, cuOccupancyMaxPotentialClusterSize,
    cuOccupancyMaxActiveClusters."""

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

    def cuOccupancyMaxPotentialBlockSize(
        self, func, blockSizeToDynamicSMemSize, dynamicSMemSize, blockSizeLimit
    ):
        """The CUDA occupancy calculator's search: from the largest block size down in
        warps, the one with the most resident threads (the largest among equals), its
        dynamic shared memory from the callback when there is one (a C function pointer,
        ``size_t fn(int blockSize)``, as the driver calls it)."""
        err, kernel, spec = self._occupancy_kernel(func)
        if err:
            return (err, None, None)
        pointer = int(blockSizeToDynamicSMemSize or 0)
        shared_for = _B2D(pointer) if pointer else None
        limit = max_threads(kernel.image, spec)
        if int(blockSizeLimit) > 0:
            limit = min(limit, int(blockSizeLimit))
        full = spec[A.CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR]
        best_size = best_threads = best_blocks = 0
        for aligned in range(-(-limit // 32) * 32, 0, -32):
            size = min(limit, aligned)
            shared = shared_for(size) if shared_for else int(dynamicSMemSize)
            blocks = occupancy(kernel, size, shared, spec)
            if blocks * size > best_threads:
                best_size, best_threads, best_blocks = size, blocks * size, blocks
            if best_threads == full:
                break
        return (OK, best_blocks * spec[A.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT], best_size)

    def cuOccupancyAvailableDynamicSMemPerBlock(self, func, numBlocks, blockSize):
        """The most dynamic shared memory a block of ``blockSize`` may take with
        ``numBlocks`` of them resident per multiprocessor; INVALID_VALUE when that many do
        not fit even without it."""
        err, kernel, spec = self._occupancy_kernel(func)
        if err:
            return (err, None)
        blocks, threads = int(numBlocks), int(blockSize)
        if blocks <= 0 or occupancy(kernel, threads, 0, spec) < blocks:
            return (INVALID_VALUE, None)
        share = spec[A.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR] // blocks
        share = (
            share // 128 * 128
            - kernel.image.shared
            - spec[A.CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK]
        )
        limit = dynamic_limit(kernel, self._work_context()[1].device, spec)
        return (OK, max(min(share, limit), 0))

    def cuOccupancyMaxPotentialClusterSize(self, func, config):
        """The largest cluster whose blocks fit in the smallest GPC at once (a cluster runs
        on one GPC), at most the portable 8."""
        err, kernel, spec = self._occupancy_kernel(func)
        if err:
            return (err, None)
        per_sm = _cluster_blocks_per_sm(kernel, config, spec)
        sms = min(_cluster_sms(gpc, _PORTABLE_CLUSTER) for gpc in _gpcs(spec))
        return (OK, min(_PORTABLE_CLUSTER, sms * per_sm))

    def cuOccupancyMaxActiveClusters(self, func, config):
        """Clusters of the config's size resident at once: per GPC, the blocks its SMs take
        from a cluster launch over the cluster size (the module's docstring tells why)."""
        err, kernel, spec = self._occupancy_kernel(func)
        if err:
            return (err, None)
        cluster = _cluster_size(config)
        if cluster is None:
            return (INVALID_VALUE, None)  # no cluster in the config, none set for the kernel
        if not 1 <= cluster <= _PORTABLE_CLUSTER:
            return (INVALID_CLUSTER_SIZE, None)
        per_sm = _cluster_blocks_per_sm(kernel, config, spec)
        return (OK, sum(_cluster_sms(gpc, cluster) * per_sm // cluster for gpc in _gpcs(spec)))


# An H100 SXM's 132 SMs in its 8 GPCs (66 TPCs of 2 SMs), as its cluster answers show them.
_H100_GPCS = (18, 18, 18, 18, 16, 16, 14, 14)
_CLUSTER_BLOCKS_PER_SM = 8
_GPC_CLUSTER_SMS = 16  # the SMs of a GPC that take clusters larger than a TPC's 2
_TPC_SMS = 2
_PORTABLE_CLUSTER = 8
_CLUSTER_ATTRIBUTE = CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
_B2D = ctypes.CFUNCTYPE(ctypes.c_size_t, ctypes.c_int)  # CUoccupancyB2DSize


def _gpcs(spec: dict) -> tuple[int, ...]:
    count = spec[A.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT]
    if count == sum(_H100_GPCS):
        return _H100_GPCS
    return (16,) * (count // 16) + ((count % 16,) if count % 16 else ())


def _cluster_sms(gpc: int, cluster: int) -> int:
    """The SMs of a GPC of ``gpc`` SMs that take clusters of ``cluster`` blocks."""
    return gpc if cluster <= _TPC_SMS else min(gpc, _GPC_CLUSTER_SMS)


def _cluster_blocks_per_sm(kernel: SimKernel, config, spec: dict) -> int:
    """Blocks of the config's size an SM takes from a cluster launch: its occupancy, at most
    8."""
    per_sm = occupancy(kernel, _threads(config), int(config.sharedMemBytes), spec)
    return min(per_sm, _CLUSTER_BLOCKS_PER_SM)


def _threads(config) -> int:
    return int(config.blockDimX) * int(config.blockDimY) * int(config.blockDimZ)


def _cluster_size(config) -> int | None:
    for attr in list(config.attrs or ())[: int(config.numAttrs)]:
        if attr.id == _CLUSTER_ATTRIBUTE:
            dim = attr.value.clusterDim
            return int(dim.x) * int(dim.y) * int(dim.z)
    return None


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
    limits = [
        spec[A.CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR] // 32 // warps,
        spec[A.CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR],
    ]
    if kernel.image.regs:
        per_warp = -(-kernel.image.regs * 32 // 256) * 256
        limits.append(
            spec[A.CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR] // per_warp // warps
        )
    shared = kernel.image.shared + dynamic_shared
    if shared:
        per_block = (
            -(-(shared + spec[A.CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK]) // 128) * 128
        )
        limits.append(spec[A.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR] // per_block)
    return max(min(limits), 0)
