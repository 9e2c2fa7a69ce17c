"""Device and host memory of the sim.

The address space: one virtual address space for the whole process, as under CUDA's unified
addressing. Pointers are plain integers, unique across devices and contexts, and the
allocation a pointer falls in tells its device. Every allocation is a *block* (a range of
addresses with NumPy bytes behind it); block addresses are never handed out twice, so a
stale pointer into a released block stays invalid for ever.

Checking accesses: driver calls (cuMemcpy*, cuMemset*) check their ranges when called and
answer CUDA_ERROR_INVALID_VALUE, as the real driver does. Queued work checks again when it
runs: an access outside every live allocation then is CUDA_ERROR_ILLEGAL_ADDRESS, which is
sticky and poisons the context (the stream engine does that for any op returning it).
Kernel twins get memory through `_device_view`, which applies the same check.

Stream-ordered allocation (cuMemAllocAsync / cuMemFreeAsync) models a device's default
memory pool: a freed block goes back to the pool at once, and a later allocation *on the
same stream* may reuse it straight away (stream order makes that safe); allocations on other
streams may reuse it only after the free has run. The memory stays live for the work queued
before the free; after the free has run, an access is an illegal address (a use after free
that a GPU would let slip). Pool blocks whose free has run are released back to the device
when a context synchronizes or an allocation would not fit otherwise (the pool's release
threshold is 0, the driver's default).

Host memory: cuMemHostAlloc and cuMemHostRegister make page-locked ranges. A copy whose host
side lies in one is asynchronous; any other host memory is pageable and the copy drains its
stream before returning, as CUDA's pageable copies are synchronous. Host memory is not owned
by a context here (allocations are portable), so tearing a context down leaves it alone.
"""

from __future__ import annotations

import bisect

import numpy as np
from cuda.bindings.driver import CUdeviceptr, CUpointer_attribute, CUresult

from ._common import CONTEXT_IS_DESTROYED, INVALID_CONTEXT, INVALID_VALUE, OK

ILLEGAL_ADDRESS = CUresult.CUDA_ERROR_ILLEGAL_ADDRESS
OUT_OF_MEMORY = CUresult.CUDA_ERROR_OUT_OF_MEMORY
ALREADY_REGISTERED = CUresult.CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED
NOT_REGISTERED = CUresult.CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED

ADDRESS_BASE = 0x7000_0000_0000  # where the device address space starts (CUDA's is similar)
ALIGNMENT = 512  # cuMemAlloc's alignment
_HOST_ALLOC_FLAGS = 0x1 | 0x2 | 0x4  # PORTABLE, DEVICEMAP, WRITECOMBINED
_HOST_REGISTER_FLAGS = 0x1 | 0x2 | 0x4 | 0x8  # PORTABLE, DEVICEMAP, IOMEMORY, READ_ONLY


class Block:
    """A range of device addresses with bytes behind it, used by one allocation at a time."""

    __slots__ = ("base", "size", "device", "ctx", "data", "length", "live", "generation",
                 "pooled", "free_stream", "released")

    def __init__(self, base: int, size: int, device: int, ctx):
        self.base = base
        self.size = size  # capacity
        self.device = device
        self.ctx = ctx  # the context of the allocation using it
        self.data = np.zeros(size, np.uint8)  # calloc: pages are only touched when written
        self.length = 0  # bytes of the current allocation (accesses are checked against it)
        self.live = False
        self.generation = 0  # bumped on each reuse, so a stale free does not kill a reuse
        self.pooled = False  # in the pool (freed or its free queued), not allocated
        self.free_stream = None  # the SimStream whose queued free put it in the pool
        self.released = False  # that free has run: any stream may reuse it

    def allocate(self, nbytes: int, ctx) -> int:
        self.ctx = ctx
        self.length = nbytes
        self.live = True
        self.pooled = False
        self.free_stream = None
        self.released = False
        self.generation += 1
        return self.base


class _Raw:
    """Exposes raw host memory to NumPy without copying (the sim reads and writes the
    caller's host memory exactly where the driver would)."""

    def __init__(self, address: int, nbytes: int):
        self.__array_interface__ = {"data": (address, False), "shape": (nbytes,),
                                    "typestr": "|u1", "version": 3}


class MemoryModel:
    """cuMemAlloc*, cuMemFree*, cuMemcpy*, cuMemset*, cuMemHost*, cuPointerGetAttribute."""

    def _init_memory(self):
        self._next_address = ADDRESS_BASE
        self._bases: list[int] = []  # sorted block bases, for finding a pointer's block
        self._blocks: dict[int, Block] = {}
        self._pools: list[list[Block]] = [[] for _ in self._devices]  # pooled blocks
        self._in_use = [0] * len(self._devices)  # bytes of blocks per device
        self._host_starts: list[int] = []  # sorted starts of page-locked ranges
        self._host_ranges: dict[int, tuple] = {}  # start -> (end, NumPy buffer or None)

    # -- the address space ----------------------------------------------------------------

    def _block_at(self, ptr: int) -> Block | None:
        i = bisect.bisect_right(self._bases, ptr) - 1
        if i < 0:
            return None
        block = self._blocks[self._bases[i]]
        return block if ptr < block.base + block.size else None

    def _live_range(self, ptr: int, nbytes: int) -> Block | None:
        """The live allocation holding all of [ptr, ptr + nbytes), or None."""
        block = self._block_at(int(ptr))
        if block is None or not block.live or int(ptr) + nbytes > block.base + block.length:
            return None
        return block

    def _device_view(self, ptr, nbytes: int):
        """(CUresult, uint8 ndarray) viewing device bytes [ptr, ptr + nbytes), for queued
        work and kernel twins. Outside every live allocation: CUDA_ERROR_ILLEGAL_ADDRESS,
        which poisons the context when the op running returns it."""
        ptr = int(ptr)
        block = self._live_range(ptr, nbytes)
        if block is None:
            return ILLEGAL_ADDRESS, None
        offset = ptr - block.base
        return OK, block.data[offset:offset + nbytes]

    def _new_block(self, nbytes: int, device: int, ctx) -> Block | None:
        """A fresh block, releasing idle pool blocks first if it would not fit; None: OOM."""
        size = -(-nbytes // ALIGNMENT) * ALIGNMENT
        if size > self._free_bytes(device):
            self._trim_pool(device)
            if size > self._free_bytes(device):
                return None
        block = Block(self._next_address, size, device, ctx)
        self._next_address += size + ALIGNMENT  # a gap: running off the end is never valid
        self._bases.append(block.base)  # addresses only grow, so the list stays sorted
        self._blocks[block.base] = block
        self._in_use[device] += size
        return block

    def _free_bytes(self, device: int) -> int:
        spec = self._devices[device]
        return spec.total_mem - spec.reserved - self._in_use[device]

    def _drop_block(self, block: Block) -> None:
        i = bisect.bisect_left(self._bases, block.base)
        del self._bases[i]
        del self._blocks[block.base]
        self._in_use[block.device] -= block.size
        block.live = False

    def _trim_pool(self, device: int) -> None:
        pool = self._pools[device]
        for block in [b for b in pool if b.released]:
            pool.remove(block)
            self._drop_block(block)

    def _device_bytes_in_use(self, ordinal: int) -> int:
        return self._in_use[ordinal] + super()._device_bytes_in_use(ordinal)

    def _synchronize_context(self, ctx):
        err = super()._synchronize_context(ctx)
        with self._lock:
            self._trim_pool(ctx.device)
        return err

    def _release_context_resources(self, ctx):
        super()._release_context_resources(ctx)  # runs the queued work first
        with self._lock:
            for block in [b for b in self._blocks.values() if b.ctx is ctx]:
                if block.pooled:
                    self._pools[block.device].remove(block)
                self._drop_block(block)

    # -- allocation -----------------------------------------------------------------------

    def cuMemAlloc(self, bytesize):
        err, ctx = self._work_context()
        if err:
            return (err, None)
        if int(bytesize) <= 0:
            return (INVALID_VALUE, None)
        with self._lock:
            block = self._new_block(int(bytesize), ctx.device, ctx)
            if block is None:
                return (OUT_OF_MEMORY, None)
            return (OK, CUdeviceptr(block.allocate(int(bytesize), ctx)))

    def cuMemFree(self, dptr):
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

    def cuMemAllocAsync(self, bytesize, hStream):
        nbytes = int(bytesize)
        with self._lock:
            err, stream = self._stream(hStream)
            if err:
                return (err, None)
            if nbytes == 0:  # as on driver 580: success, and a null pointer
                return (OK, CUdeviceptr(0))
            if nbytes < 0:
                return (INVALID_VALUE, None)
            ctx = stream.ctx
            block = self._reusable(nbytes, ctx.device, stream) \
                or self._new_block(nbytes, ctx.device, ctx)
            if block is None:
                return (OUT_OF_MEMORY, None)
            return (OK, CUdeviceptr(block.allocate(nbytes, ctx)))

    def _reusable(self, nbytes: int, device: int, stream) -> Block | None:
        """The smallest pool block that fits and that ``stream`` may use now: one freed on
        it, or one whose free has run. Blocks more than twice too big are left alone."""
        pool = self._pools[device]
        fits = [b for b in pool if nbytes <= b.size <= 2 * nbytes + ALIGNMENT
                and (b.free_stream is stream or b.released)]
        if not fits:
            return None
        block = min(fits, key=lambda b: b.size)
        pool.remove(block)
        return block

    def cuMemFreeAsync(self, dptr, hStream):
        with self._lock:
            err, stream = self._stream(hStream)
            if err:
                return (err,)
            block = self._blocks.get(int(dptr))
            if block is None or not block.live or block.pooled:
                return (INVALID_VALUE,)
            block.pooled = True
            block.free_stream = stream
            self._pools[block.device].append(block)
            generation = block.generation

            def free():
                if block.generation == generation:  # not reused on this stream meanwhile
                    block.live = False
                    block.released = True
            return (self._enqueue(hStream, free, label="free"),)

    # -- copies ---------------------------------------------------------------------------

    def _host_view(self, address: int, nbytes: int) -> np.ndarray:
        """Host bytes [address, address + nbytes): a slice of the sim's own page-locked
        buffer when it is one (which keeps that buffer alive while work is queued)."""
        start, end, buffer = self._host_range(address)
        if buffer is not None and address + nbytes <= end:
            return buffer[address - start:address - start + nbytes]
        return np.asarray(_Raw(address, nbytes))

    def _host_range(self, address: int):
        i = bisect.bisect_right(self._host_starts, address) - 1
        if i >= 0:
            start = self._host_starts[i]
            end, buffer = self._host_ranges[start]
            if address < end:
                return start, end, buffer
        return None, None, None

    def _pinned(self, address: int, nbytes: int) -> bool:
        start, end, _ = self._host_range(address)
        return start is not None and address + nbytes <= end

    def _copy(self, hStream, nbytes: int, run, host: int | None, label: str):
        """Queue ``run`` (which copies); drain the stream when the host side is pageable."""
        err = self._enqueue(hStream, run, nbytes=nbytes, label=label)
        if err or host is None or self._pinned(host, nbytes):
            return (err,)
        return (self._drain(hStream),)

    def _checked(self, hStream, *device_ranges):
        """The call-time checks of a copy: a usable stream, live device ranges."""
        err, _ = self._stream_context(hStream)
        if err:
            return err
        if any(self._live_range(p, n) is None for p, n in device_ranges):
            return INVALID_VALUE
        return OK

    def cuMemcpyHtoDAsync(self, dstDevice, srcHost, ByteCount, hStream):
        n, dst, src = int(ByteCount), int(dstDevice), int(srcHost)
        err = self._checked(hStream, (dst, n))
        if err or n == 0:
            return (err,)
        host = self._host_view(src, n)

        def run():
            err, view = self._device_view(dst, n)
            if err:
                return err
            view[:] = host
        return self._copy(hStream, n, run, src, "HtoD")

    def cuMemcpyDtoHAsync(self, dstHost, srcDevice, ByteCount, hStream):
        n, dst, src = int(ByteCount), int(dstHost), int(srcDevice)
        err = self._checked(hStream, (src, n))
        if err or n == 0:
            return (err,)
        host = self._host_view(dst, n)

        def run():
            err, view = self._device_view(src, n)
            if err:
                return err
            host[:] = view
        return self._copy(hStream, n, run, dst, "DtoH")

    def _device_copy(self, hStream, dst: int, src: int, n: int, label: str):
        err = self._checked(hStream, (dst, n), (src, n))
        if err or n == 0:
            return (err,)

        def run():
            err, source = self._device_view(src, n)
            if not err:
                err, target = self._device_view(dst, n)
            if err:
                return err
            target[:] = source  # NumPy copies through a buffer when the ranges overlap
        return self._copy(hStream, n, run, None, label)

    def cuMemcpyDtoDAsync(self, dstDevice, srcDevice, ByteCount, hStream):
        return self._device_copy(hStream, int(dstDevice), int(srcDevice), int(ByteCount), "DtoD")

    def cuMemcpyPeerAsync(self, dstDevice, dstContext, srcDevice, srcContext, ByteCount, hStream):
        n, dst, src = int(ByteCount), int(dstDevice), int(srcDevice)
        for ctx, ptr in ((dstContext, dst), (srcContext, src)):
            target = self._lookup(ctx)
            if target is None:
                return (INVALID_CONTEXT,)
            if target.destroyed:
                return (CONTEXT_IS_DESTROYED,)
            block = self._live_range(ptr, n)
            if n and (block is None or block.device != target.device):
                return (INVALID_VALUE,)
        return self._device_copy(hStream, dst, src, n, "peer")

    def cuMemcpyHtoD(self, dstDevice, srcHost, ByteCount):
        return self._synchronous(self.cuMemcpyHtoDAsync(dstDevice, srcHost, ByteCount, 0))

    def cuMemcpyDtoH(self, dstHost, srcDevice, ByteCount):
        return self._synchronous(self.cuMemcpyDtoHAsync(dstHost, srcDevice, ByteCount, 0))

    def cuMemcpyDtoD(self, dstDevice, srcDevice, ByteCount):
        return self._synchronous(self.cuMemcpyDtoDAsync(dstDevice, srcDevice, ByteCount, 0))

    def _synchronous(self, result):
        """The synchronous copies: the legacy stream's copy, waited for."""
        return result if result[0] else (self._drain(0),)

    # -- memset ---------------------------------------------------------------------------

    def _memset(self, hStream, dst: int, span: int, align: int, write, label: str):
        if dst % align:
            return (INVALID_VALUE,)
        err = self._checked(hStream, (dst, span))
        if err or span == 0:
            return (err,)

        def run():
            err, view = self._device_view(dst, span)
            if err:
                return err
            write(view)
        return (self._enqueue(hStream, run, nbytes=span, label=label),)

    def cuMemsetD8Async(self, dstDevice, uc, N, hStream):
        def write(view):
            view[:] = int(uc)
        return self._memset(hStream, int(dstDevice), int(N), 1, write, "memset8")

    def cuMemsetD16Async(self, dstDevice, us, N, hStream):
        def write(view):
            view.view(np.uint16)[:] = int(us)
        return self._memset(hStream, int(dstDevice), 2 * int(N), 2, write, "memset16")

    def cuMemsetD32Async(self, dstDevice, ui, N, hStream):
        def write(view):
            view.view(np.uint32)[:] = int(ui)
        return self._memset(hStream, int(dstDevice), 4 * int(N), 4, write, "memset32")

    def cuMemsetD2D32Async(self, dstDevice, dstPitch, ui, Width, Height, hStream):
        pitch, width, height = int(dstPitch), int(Width), int(Height)
        if pitch < 4 * width:
            return (INVALID_VALUE,)
        span = (height - 1) * pitch + 4 * width if width and height else 0

        def write(view):
            rows = np.ndarray((height, width), np.uint32, buffer=view, strides=(pitch, 4))
            rows[...] = int(ui)
        return self._memset(hStream, int(dstDevice), span, 4, write, "memset2D32")

    # -- host memory ----------------------------------------------------------------------

    def _add_host_range(self, start: int, end: int, buffer) -> CUresult:
        i = bisect.bisect_left(self._host_starts, start)
        before = self._host_starts[i - 1] if i else None
        after = self._host_starts[i] if i < len(self._host_starts) else None
        if (before is not None and self._host_ranges[before][0] > start) \
                or (after is not None and after < end):
            return ALREADY_REGISTERED
        self._host_starts.insert(i, start)
        self._host_ranges[start] = (end, buffer)
        return OK

    def _remove_host_range(self, start: int, owned: bool) -> bool:
        entry = self._host_ranges.get(start)
        if entry is None or (entry[1] is not None) != owned:
            return False
        del self._host_ranges[start]
        self._host_starts.remove(start)
        return True

    def cuMemHostAlloc(self, bytesize, Flags):
        err, _ = self._work_context()
        if err:
            return (err, None)
        if int(bytesize) <= 0 or int(Flags) & ~_HOST_ALLOC_FLAGS:
            return (INVALID_VALUE, None)
        buffer = np.zeros(int(bytesize), np.uint8)
        address = buffer.__array_interface__["data"][0]
        with self._lock:
            self._add_host_range(address, address + buffer.size, buffer)
        return (OK, address)

    def cuMemFreeHost(self, p):
        with self._lock:
            if not self._remove_host_range(int(p), owned=True):
                return (INVALID_VALUE,)
        return (OK,)

    def cuMemHostRegister(self, p, bytesize, Flags):
        err, _ = self._work_context()
        if err:
            return (err,)
        start, n = int(p), int(bytesize)
        if start == 0 or n <= 0 or int(Flags) & ~_HOST_REGISTER_FLAGS:
            return (INVALID_VALUE,)
        with self._lock:
            return (self._add_host_range(start, start + n, None),)

    def cuMemHostUnregister(self, p):
        err, _ = self._work_context()
        if err:
            return (err,)
        with self._lock:
            return (OK,) if self._remove_host_range(int(p), owned=False) else (NOT_REGISTERED,)

    # -- pointer queries ------------------------------------------------------------------

    def cuPointerGetAttribute(self, attribute, ptr):
        if attribute != CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
            return (CUresult.CUDA_ERROR_NOT_SUPPORTED, None)  # the one cuctx asks for
        block = self._block_at(int(ptr))
        if block is None or not block.live:
            return (INVALID_VALUE, None)
        return (OK, block.device)
