"""Device memory of the sim.

The address space: one virtual address space for the whole process, as under CUDA's unified
addressing. Pointers are plain integers, unique across devices and contexts, and the
allocation a pointer falls in tells its device. Every allocation lives in a *block* (a range
of addresses with NumPy bytes behind it); block addresses are never handed out twice, so a
stale pointer into a released block stays invalid for ever.

Checking accesses: driver calls (cuMemcpy*, cuMemset*) check their ranges when called and
answer CUDA_ERROR_INVALID_VALUE, as the real driver does; so is a copy's device memory that
the *current* context does not reach, whatever its stream's context (`_copy_context`), and
a host-located pool's memory where a copy names device memory (it is host memory:
`_unified`; memsets take it). The work they queue remembers the allocation it was checked
against and checks again when it runs: valid while that
allocation's free has not run (even if the block already holds a later, smaller allocation
on the freeing stream); after it has run, valid only where a later allocation of the block
covers the bytes (the GPU would touch the new owner's data: a race the sim shows as such).
Anything else is CUDA_ERROR_ILLEGAL_ADDRESS, which is sticky and poisons the context (the
stream engine does that for any op returning it). Kernel twins have only addresses, so
`_device_view` accepts any range that some not yet freed allocation of the block covers.

Stream-ordered allocation, pools and their reuse are in `_pools` (a block then belongs to a
pool); blocks of IPC pools have shared memory behind them (`_ipc`), managed memory is a block
at its host address (`_managed`). The memsets are in `_memsets`.

Arguments: sizes and memset values are converted as cuda.bindings converts C arguments
(a negative size or a value too large is an OverflowError), so the sim never queues work
that NumPy would refuse when it runs.
"""

from __future__ import annotations

import bisect

import numpy as np
from cuda.bindings.driver import CUdeviceptr, CUpointer_attribute

from ._cargs import size_t
from ._common import (
    CONTEXT_IS_DESTROYED,
    ILLEGAL_ADDRESS,
    INVALID_CONTEXT,
    INVALID_VALUE,
    NOT_FOUND,
    NOT_PERMITTED,
    NOT_SUPPORTED,
    OK,
    OUT_OF_MEMORY,
)
from ._host import HostMemory, HostSide
from ._memsets import Memsets
from ._pitched import PitchedCopies
from ._timing import DTOD, DTOH, HTOD, PTOP, peer_copy_time
from ._unified import UnifiedCopies, copy_bytes, host_located

ADDRESS_BASE = 0x7000_0000_0000  # where the device address space starts (CUDA's is similar)
ALIGNMENT = 512  # cuMemAlloc's alignment


class Allocation:
    """One allocation made in a block. Its memory is valid until its free has run (a block
    may already hold the next allocation by then, on the freeing stream: stream order makes
    that safe). Queued copies and memsets remember the allocation they were checked against
    when queued, so they are checked against it, not against whatever reuses the block."""

    __slots__ = ("block", "length", "live")

    def __init__(self, block: "Block", length: int):
        self.block = block
        self.length = length
        self.live = True


class Block:
    """A range of device addresses with bytes behind it, used by one allocation at a time."""

    __slots__ = (
        "base",
        "size",
        "device",
        "ctx",
        "data",
        "current",
        "valid",
        "pooled",
        "free_stream",
        "released",
        "ordered",
        "graph",
        "pool",
        "counted",
    )

    def __init__(self, base: int, size: int, device: int, ctx, data=None, pool=None):
        self.base = base
        self.size = size  # capacity
        self.device = device
        self.ctx = ctx  # the context of the allocation using it
        # calloc: pages are only touched when written
        self.data = np.zeros(size, np.uint8) if data is None else data
        self.pool = pool  # the `_pools.SimPool` it belongs to (None: cuMemAlloc, graphs)
        self.counted = True  # in the device's memory (not: imported, managed)
        self.current: Allocation | None = None  # the latest allocation
        self.valid: list[Allocation] = []  # allocations whose free has not run yet
        self.pooled = False  # in the pool (freed or its free queued), not allocated
        self.free_stream = None  # the SimStream whose queued free put it in the pool
        self.released = False  # that free has run: any stream may reuse it
        self.ordered = False  # from the device's pool (cuMemAllocAsync): outlives its context
        self.graph = None  # a graph allocation's state (`_graph_memory.GraphMemory`)

    @property
    def length(self) -> int:
        """Bytes of the current allocation (what a new call is checked against)."""
        return self.current.length if self.current is not None else 0

    @property
    def live(self) -> bool:
        return self.current is not None and self.current.live

    def reach(self) -> int:
        """Bytes from the base that some not yet freed allocation covers: what work running
        now (a kernel twin, queued before the reuse) may touch."""
        return max((a.length for a in self.valid), default=0)

    def allocate(self, nbytes: int, ctx) -> int:
        self.ctx = ctx
        self.current = Allocation(self, nbytes)
        self.valid.append(self.current)
        self.pooled = False
        self.free_stream = None
        self.released = False
        return self.base

    def end(self, alloc: Allocation) -> None:
        """``alloc``'s free has run: its memory is invalid unless a later allocation holds it."""
        alloc.live = False
        if alloc in self.valid:
            self.valid.remove(alloc)
        if alloc is self.current:
            self.released = True


class DeviceSpan:
    """Device bytes a queued op will touch, in the allocation they were checked against."""

    __slots__ = ("alloc", "offset", "nbytes")

    def __init__(self, alloc: Allocation, offset: int, nbytes: int):
        self.alloc = alloc
        self.offset = offset
        self.nbytes = nbytes

    def get(self):
        """(CUresult, uint8 ndarray) when the op runs. Once the allocation's free has run,
        the bytes are valid only where a later allocation of the block covers them (the op
        then touches the new owner's data, as a GPU would); elsewhere: ILLEGAL_ADDRESS."""
        block = self.alloc.block
        end = self.offset + self.nbytes
        if not self.alloc.live and end > block.reach():
            return ILLEGAL_ADDRESS, None
        return OK, block.data[self.offset : end]


class MemoryModel(PitchedCopies, UnifiedCopies, Memsets, HostMemory):
    """cuMemAlloc*, cuMemFree*, cuMemcpy*, cuMemset*, cuPointerGetAttribute (host memory
    in `HostMemory`, 2D and 3D copies in `PitchedCopies`, cuMemcpyAsync in `UnifiedCopies`,
    memsets in `Memsets`)."""

    def _init_memory(self):
        self._next_address = ADDRESS_BASE
        self._bases: list[int] = []  # sorted block bases, for finding a pointer's block
        self._blocks: dict[int, Block] = {}
        self._in_use = [0] * len(self._devices)  # bytes of blocks per device
        self._init_host()

    # -- the address space ----------------------------------------------------------------

    def _block_at(self, ptr: int) -> Block | None:
        i = bisect.bisect_right(self._bases, ptr) - 1
        if i < 0:
            return None
        block = self._blocks[self._bases[i]]
        return block if ptr < block.base + block.size else None

    def _live_range(self, ptr: int, nbytes: int) -> Block | None:
        """The block whose current, live allocation holds all of [ptr, ptr + nbytes), or
        None (what a call is checked against when it is made)."""
        block = self._block_at(int(ptr))
        if block is None or not block.live or int(ptr) + nbytes > block.base + block.length:
            return None
        return block

    def _device_span(self, ptr: int, nbytes: int) -> DeviceSpan | None:
        """[ptr, ptr + nbytes) in the current allocation, for work queued now; or None."""
        block = self._live_range(ptr, nbytes)
        return None if block is None else DeviceSpan(block.current, ptr - block.base, nbytes)

    def _device_view(self, ptr, nbytes: int):
        """(CUresult, uint8 ndarray) viewing device bytes [ptr, ptr + nbytes), for kernel
        twins, which have only the address: it must lie in an allocation whose free has not
        run. Outside: CUDA_ERROR_ILLEGAL_ADDRESS, which poisons the context when the op
        running returns it."""
        ptr = int(ptr)
        block = self._block_at(ptr)
        if block is None or nbytes < 0 or ptr + nbytes > block.base + block.reach():
            return ILLEGAL_ADDRESS, None
        offset = ptr - block.base
        return OK, block.data[offset : offset + nbytes]

    @staticmethod
    def _block_size(nbytes: int) -> int:
        return -(-nbytes // ALIGNMENT) * ALIGNMENT

    def _new_block(self, nbytes: int, device: int, ctx, pool=None) -> Block | None:
        """A fresh block (of ``pool``), releasing idle pool blocks of the device first if it
        would not fit; None: out of memory."""
        size = self._block_size(nbytes)
        if size > self._free_bytes(device):
            self._trim_device(device)
            if size > self._free_bytes(device):
                return None
        base, data = self._block_memory(size, pool)
        block = Block(base, size, device, ctx, data, pool)
        self._add_block(block)
        self._in_use[device] += size
        return block

    def _block_memory(self, size: int, pool) -> tuple[int, np.ndarray | None]:
        """(address, bytes or None for fresh zeros) of a new block; `_ipc` gives IPC pools
        shared memory."""
        base = self._next_address
        self._next_address += size + ALIGNMENT  # a gap: running off the end is never valid
        return base, None

    def _add_block(self, block: Block) -> None:
        bisect.insort(self._bases, block.base)  # IPC and managed blocks lie elsewhere
        self._blocks[block.base] = block

    def _free_bytes(self, device: int) -> int:
        spec = self._devices[device]
        return spec.total_mem - spec.reserved - self._in_use[device]

    def _drop_block(self, block: Block) -> None:
        i = bisect.bisect_left(self._bases, block.base)
        if (
            i < len(self._bases)
            and self._bases[i] == block.base
            and self._blocks.get(block.base) is block
        ):
            del self._bases[i]
            del self._blocks[block.base]
        if block.counted:
            self._in_use[block.device] -= block.size
        for alloc in block.valid:
            alloc.live = False
        block.valid.clear()
        if block.current is not None:
            block.current.live = False
        self._block_dropped(block)

    def _device_bytes_in_use(self, ordinal: int) -> int:
        return self._in_use[ordinal] + super()._device_bytes_in_use(ordinal)

    def _release_context_resources(self, ctx):
        # First (`_pools`): the streams ran their work, frees queued in a poisoned context
        # gave their blocks back to their pools.
        super()._release_context_resources(ctx)
        with self._lock:
            for block in [b for b in self._blocks.values() if b.ctx is ctx]:
                if block.ordered and block.live:
                    # A pool owns it: destroying or resetting the context does not free it;
                    # a free from another context does (measured on an H100).
                    continue
                if block.pooled:
                    block.pool.free.remove(block)
                self._drop_block(block)

    # -- allocation -----------------------------------------------------------------------

    def cuMemAlloc(self, bytesize):
        nbytes = size_t(bytesize)
        if self._in_host_function():
            return (NOT_PERMITTED, None)  # as on an H100, driver 580
        err, ctx = self._work_context()
        if err:
            return (err, None)
        if nbytes == 0:
            return (INVALID_VALUE, None)
        with self._lock:
            block = self._new_block(nbytes, ctx.device, ctx)
            if block is None:
                return (OUT_OF_MEMORY, None)
            return (OK, CUdeviceptr(block.allocate(nbytes, ctx)))

    def cuMemFree(self, dptr):
        if self._in_host_function():
            return (NOT_PERMITTED,)  # it waits for the device, which runs this host function
        err, ctx = self._work_context()
        if err:
            return (err,)
        block = self._blocks.get(int(dptr))
        if block is None or not block.live or block.pooled:
            return (INVALID_VALUE,)
        err = self._synchronize_context(block.ctx)  # cuMemFree waits for the device
        with self._lock:
            if block.base in self._blocks:
                self._drop_block(block)
        return (err or OK,)

    # -- copies ---------------------------------------------------------------------------

    def _copy(
        self,
        hStream,
        nbytes: int,
        run,
        host: HostSide | None,
        label: str,
        kind: str,
        cost_ns: int | None = None,
    ):
        """Queue ``run`` (which copies); drain the stream when the host side is pageable."""
        pageable = host is not None and not host.pinned
        if pageable and self._in_host_function():
            return (NOT_PERMITTED,)  # a synchronous copy would wait for this host function
        err = self._enqueue(
            hStream, run, nbytes=nbytes, label=label, kind=kind, pageable=pageable, cost_ns=cost_ns
        )
        if err or not pageable:
            return (err,)
        return (self._drain(hStream),)

    def _checked(self, hStream, *device_ranges, in_current: bool = True, device_only: bool = True):
        """The call-time checks of a copy or memset: a usable stream, live device ranges
        that, ``in_current``, the context a copy is checked against reaches
        (`_copy_context`; memsets and peer copies, which name their contexts, are not
        checked so), and, ``device_only`` (copies), are not a host pool's host memory
        (`_unified`). Returns (CUresult, [DeviceSpan per range])."""
        err, ctx = self._stream_context(hStream)
        if err:
            return err, None
        spans = [self._device_span(p, n) for p, n in device_ranges]
        if any(span is None or device_only and host_located(span.alloc.block) for span in spans):
            return INVALID_VALUE, None
        if in_current:
            checker = self._copy_context(ctx)
            if not all(self._may_reach(checker, span.alloc.block) for span in spans):
                return INVALID_VALUE, None
        return OK, spans

    def _copy_context(self, stream_ctx):
        """The context a copy's device memory is checked against: the *current* one, not the
        stream's; the stream's only while no context is current. NVIDIA's CCCL found that the
        driver's memcpy entry points validate device pointers against the current context
        (NVIDIA/cccl#9997: CUDA_ERROR_INVALID_VALUE for another device's context; #9615:
        fine with an empty context stack, and memsets are not affected), as two H200s
        answered cuctx (issue 21). Memory of that context's device, or that it has peer or
        pool access to (`_may_reach`), passes."""
        stack = self._stack()
        return stack[-1] if stack else stream_ctx

    def _host_copy(self, hStream, device: int, host: int, n: int, to_device: bool):
        err, spans = self._checked(hStream, (device, n))
        if err or n == 0:
            return (err,)
        side = self._host_side(host, n)
        if side is None:
            return (INVALID_VALUE,)
        run = copy_bytes(side, spans[0]) if to_device else copy_bytes(spans[0], side)
        return self._copy(
            hStream, n, run, side, "HtoD" if to_device else "DtoH", HTOD if to_device else DTOH
        )

    def cuMemcpyHtoDAsync(self, dstDevice, srcHost, ByteCount, hStream):
        return self._host_copy(hStream, int(dstDevice), int(srcHost), size_t(ByteCount), True)

    def cuMemcpyDtoHAsync(self, dstHost, srcDevice, ByteCount, hStream):
        return self._host_copy(hStream, int(srcDevice), int(dstHost), size_t(ByteCount), False)

    def _device_copy(self, hStream, dst: int, src: int, n: int, label: str, peer_contexts=None):
        """A copy between device pointers; with ``peer_contexts`` (the destination's and the
        source's SimContext), cuMemcpyPeerAsync's, which names them: its memory is not
        checked against the current context, and it goes over the link only where one of the
        two reaches the other's memory (else staged, `_timing`)."""
        err, spans = self._checked(hStream, (dst, n), (src, n), in_current=peer_contexts is None)
        if err or n == 0:
            return (err,)
        target, source = spans

        run = copy_bytes(source, target)
        if target.alloc.block.device == source.alloc.block.device:
            return self._copy(hStream, n, run, None, label, DTOD)
        # Between devices: checked against a context that reaches both sides, or a peer copy.
        direct = peer_contexts is None or any(
            self._may_reach(ctx, span.alloc.block)
            for ctx, span in zip(peer_contexts, (source, target))
        )
        return self._copy(hStream, n, run, None, label, PTOP, peer_copy_time(n, direct))

    def cuMemcpyDtoDAsync(self, dstDevice, srcDevice, ByteCount, hStream):
        return self._device_copy(hStream, int(dstDevice), int(srcDevice), size_t(ByteCount), "DtoD")

    def cuMemcpyPeerAsync(self, dstDevice, dstContext, srcDevice, srcContext, ByteCount, hStream):
        n, dst, src = size_t(ByteCount), int(dstDevice), int(srcDevice)
        contexts = []
        for ctx, ptr in ((dstContext, dst), (srcContext, src)):
            target = self._lookup(ctx)
            if target is None:
                return (INVALID_CONTEXT,)
            if target.destroyed:
                return (CONTEXT_IS_DESTROYED,)
            block = self._live_range(ptr, n)
            if n and (block is None or block.device != target.device):
                return (INVALID_VALUE,)
            contexts.append(target)
        return self._device_copy(hStream, dst, src, n, "peer", tuple(contexts))

    def cuMemcpyHtoD(self, dstDevice, srcHost, ByteCount):
        return self._synchronous(self.cuMemcpyHtoDAsync(dstDevice, srcHost, ByteCount, 0))

    def cuMemcpyDtoH(self, dstHost, srcDevice, ByteCount):
        return self._synchronous(self.cuMemcpyDtoHAsync(dstHost, srcDevice, ByteCount, 0))

    def cuMemcpyDtoD(self, dstDevice, srcDevice, ByteCount):
        return self._synchronous(self.cuMemcpyDtoDAsync(dstDevice, srcDevice, ByteCount, 0))

    def _synchronous(self, result):
        """The synchronous copies: the legacy stream's copy, waited for."""
        return result if result[0] else (self._drain(0),)

    # -- pointer queries ------------------------------------------------------------------

    def cuMemGetAddressRange(self, dptr):
        """The base and size of the live allocation holding ``dptr`` (CUDA_ERROR_NOT_FOUND
        where none does)."""
        err, _ = self._work_context()
        if err:
            return (err, None, None)
        block = self._block_at(int(dptr or 0))
        if (
            block is None
            or not block.live
            or block.pooled
            or int(dptr) >= block.base + block.length
        ):
            return (NOT_FOUND, None, None)
        return (OK, CUdeviceptr(block.base), block.length)

    def cuPointerGetAttribute(self, attribute, ptr):
        if attribute != CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
            return (NOT_SUPPORTED, None)  # the one cuctx asks for
        block = self._block_at(int(ptr))
        if block is None or not block.live:
            return (INVALID_VALUE, None)
        return (OK, block.device)
