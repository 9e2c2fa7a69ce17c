"""Managed memory of the sim (cuMemAllocManaged): one allocation that the host and the device
both address, at the same pointer.

The block's bytes are an anonymous mapping of this process, and its device address is their
host address, so host code reads and writes them through the pointer, as under Unified
Memory. Device work runs when its stream is drained, so the host sees what a kernel wrote
once it synchronized, as CUDA asks. Managed memory is not counted by cuMemGetInfo (an H100
shows none of it until the device touches it), is freed by cuMemFree
(cuMemFreeAsync: CUDA_ERROR_NOT_SUPPORTED, as on an H100) and with its context.

What an H100 answered (driver 580, scripts/probe_ipc.py): 0 bytes, and flags other than
CU_MEM_ATTACH_GLOBAL or CU_MEM_ATTACH_HOST, are CUDA_ERROR_INVALID_VALUE; the pointer is a
host address the host can dereference.
"""

from __future__ import annotations

import mmap

import numpy as np
from cuda.bindings.driver import CUdeviceptr, CUmemAttach_flags

from ._cargs import size_t, unsigned
from ._common import INVALID_VALUE, NOT_PERMITTED, NOT_SUPPORTED, OK, OUT_OF_MEMORY
from ._memory import Block

_FLAGS = (int(CUmemAttach_flags.CU_MEM_ATTACH_GLOBAL), int(CUmemAttach_flags.CU_MEM_ATTACH_HOST))


class ManagedModel:
    """cuMemAllocManaged; cuMemFree and cuMemFreeAsync of managed memory."""

    def _init_managed(self):
        self._managed: set[int] = set()  # bases of managed blocks
        # Bytes of managed blocks their context took down: host code may still hold views
        # of them, which must not point at unmapped memory (a crash); kept for the process.
        self._orphaned: list[np.ndarray] = []

    def cuMemAllocManaged(self, bytesize, flags):
        nbytes, flags = size_t(bytesize), unsigned(flags, 32, "unsigned int")
        if self._in_host_function():
            return (NOT_PERMITTED, None)
        err, ctx = self._work_context()
        if err:
            return (err, None)
        if nbytes == 0 or flags not in _FLAGS:
            return (INVALID_VALUE, None)
        with self._lock:
            block = self._host_block(nbytes, ctx.device, ctx)
            if block is None:  # more than the host maps, or its address is a device block's
                return (OUT_OF_MEMORY, None)
            block.allocate(nbytes, ctx)
            self._managed.add(block.base)
        return (OK, CUdeviceptr(block.base))

    def _host_block(self, nbytes: int, device: int, ctx, pool=None):
        """A block whose device address is the host address of its bytes (an anonymous
        mapping: page-aligned, zeroed), not counted in the device's memory; None when the
        host cannot map it or a device block holds that address."""
        size = self._block_size(nbytes)
        try:
            data = np.frombuffer(mmap.mmap(-1, size), np.uint8)
        except (OSError, OverflowError):
            return None
        base = data.ctypes.data
        if self._block_at(base) is not None or self._block_at(base + size - 1) is not None:
            return None
        block = Block(base, size, device, ctx, data, pool)
        block.counted = False
        self._add_block(block)
        return block

    def _new_block(self, nbytes: int, device: int, ctx, pool=None):
        # Host and managed pools (`_pools`) hold host-addressable memory, as managed memory.
        if pool is not None and pool.location != "device":
            return self._host_block(nbytes, device if device >= 0 else ctx.device, ctx, pool)
        return super()._new_block(nbytes, device, ctx, pool)

    def cuMemFree(self, dptr):
        base = int(dptr or 0)
        if base not in self._managed:
            return super().cuMemFree(dptr)
        self._managed.discard(base)  # freed here, not orphaned (`_block_dropped`)
        result = super().cuMemFree(dptr)
        if base in self._blocks:  # refused: still allocated
            self._managed.add(base)
        return result

    def cuMemFreeAsync(self, dptr, hStream):
        if int(dptr or 0) in self._managed:
            return (NOT_SUPPORTED,)
        return super().cuMemFreeAsync(dptr, hStream)

    def _reach(self, ctx, block) -> str | None:
        # Managed memory is reachable from every device (concurrent managed access: H100),
        # a managed pool's too.
        if (
            block.base in self._managed
            or block.pool is not None
            and block.pool.location == "managed"
        ):
            return "rw"
        return super()._reach(ctx, block)

    def _block_dropped(self, block) -> None:
        if block.base in self._managed:  # not by cuMemFree: its context went
            self._managed.discard(block.base)
            self._orphaned.append(block.data)
        super()._block_dropped(block)
