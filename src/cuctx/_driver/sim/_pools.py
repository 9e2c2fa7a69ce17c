"""Stream-ordered memory pools of the sim: each device's default pool and explicit pools
(cuMemPoolCreate), allocations from them (cuMemAllocAsync, cuMemAllocFromPoolAsync), their
frees (cuMemFreeAsync), attributes, trimming and destruction. Explicit pools hold device
memory, page-locked host memory (CU_MEM_LOCATION_TYPE_HOST) or managed memory preferring a
device (CU_MEM_ALLOCATION_TYPE_MANAGED), as CUDA 13 makes them; the blocks of the last two
are host-addressable (`_managed`; a host pool's is host memory to copies, `_unified`), and
neither takes an IPC handle type (the CUDA 13 documentation: CUDA_ERROR_INVALID_VALUE). Host
NUMA locations are not modelled (CUDA_ERROR_NOT_SUPPORTED).

Reuse: a freed block goes back to its pool at once, and a later allocation *on the same
stream* may reuse it straight away (stream order makes that safe: the work queued for the
old allocation runs first); allocations on other streams may reuse it only after the free
has run. The memory stays valid for the work queued before the free; after the free has run,
an access is an illegal address (a use after free that a GPU would let slip).

Release: blocks whose free has run go back to the device when a stream, an event or a
context of the device is synchronized, while the pool holds more than its release threshold
(default 0, as the driver's); cuMemPoolTrimTo releases them while at least minBytesToKeep
stays reserved; an allocation that would not fit releases them first.

What an H100 answered (driver 580, scripts/probe_ipc.py), and the sim answers alike: a pool
reserves memory in 32 MiB chunks and ``maxSize`` rounds up to that granularity (a limit of 1
byte lets 32 MiB be reserved); used memory counts the bytes asked for; a pool needs no
current context; a destroyed pool's live allocations stay usable until freed, while its
handle answers CUDA_ERROR_INVALID_VALUE; the default pool cannot be destroyed; a context
reset frees nothing of a pool; asking for 0 bytes gives a null pointer. The sim keeps one
block per allocation where the driver sub-allocates chunks, so its reserved bytes are the
sum of its blocks (each rounded up to 512 bytes), not whole chunks.
"""

from __future__ import annotations

import itertools

from cuda.bindings.driver import (
    CUdeviceptr,
    CUmemAllocationHandleType,
    CUmemAllocationType,
    CUmemLocationType,
    CUmemoryPool,
    CUmemPool_attribute,
    CUmemPoolProps,
    cuuint64_t,
)

from ._cargs import size_t
from ._common import (
    INVALID_DEVICE,
    INVALID_VALUE,
    NOT_INITIALIZED,
    NOT_SUPPORTED,
    OK,
    OUT_OF_MEMORY,
)

A = CUmemPool_attribute
POSIX_FD = CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
GRANULE = 32 << 20  # an H100 pool's reservation chunk, to which maxSize rounds up
_POOL_BASE, _POOL_STEP = 0x9001_0000_0000, 0x100  # default-pool handles, one per device
_REUSE = (
    A.CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES,
    A.CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC,
    A.CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES,
)
# cuda.bindings 13 reads and writes these five as cuuint64_t, the reuse flags as int, and
# raises TypeError for every other attribute before calling the driver.
_SIZES = (
    A.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
    A.CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
    A.CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH,
    A.CU_MEMPOOL_ATTR_USED_MEM_CURRENT,
    A.CU_MEMPOOL_ATTR_USED_MEM_HIGH,
)


class SimPool:
    """One memory pool: its blocks not in use (``free``), what it holds and its settings.
    An IPC pool has a shared-memory ``segment`` (`_ipc`); an imported one maps another
    process's segment and allocates nothing."""

    __slots__ = (
        "handle",
        "device",
        "default",
        "free",
        "limit",
        "threshold",
        "used",
        "used_high",
        "reserved",
        "reserved_high",
        "reuse",
        "access",
        "destroyed",
        "ipc",
        "shared",
        "imported",
        "segment",
        "location",
        "__weakref__",
    )

    def __init__(
        self,
        handle: int,
        device: int,
        *,
        default: bool = False,
        limit: int = 0,
        ipc: bool = False,
        imported: bool = False,
        location: str = "device",
    ):
        self.handle = handle
        self.device = device  # a host pool's: -1 (it serves every device granted access)
        self.location = location  # "device", "host" (page-locked) or "managed"
        self.default = default
        self.free: list = []  # blocks freed (or with a free queued), in order
        self.limit = limit  # maxSize rounded up to GRANULE; 0: the device's memory
        self.threshold = 0  # CU_MEMPOOL_ATTR_RELEASE_THRESHOLD
        self.used = self.used_high = 0  # bytes asked for by live allocations
        self.reserved = self.reserved_high = 0  # bytes of its blocks
        self.reuse = {attr: 1 for attr in _REUSE}  # kept, not modelled
        self.access: dict = {}  # device ordinal -> CUmemAccess_flags (the owner: implicit)
        self.destroyed = False
        self.ipc = ipc  # created with CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        self.shared = False  # exported to a shareable handle (pointers may be exported)
        self.imported = imported
        self.segment = None  # the shared memory of an IPC pool (`_ipc.Segment`)


class PoolModel:
    """cuDeviceGetDefaultMemPool, cuMemPoolCreate/Destroy, cuMemAllocAsync,
    cuMemAllocFromPoolAsync, cuMemFreeAsync, cuMemPoolGet/SetAttribute, cuMemPoolTrimTo."""

    def _init_pools(self):
        self._pool_handles = itertools.count(0x9002_0000_0000, _POOL_STEP)
        self._mempools: dict[int, SimPool] = {}  # by handle; destroyed ones until emptied
        self._pools_destroyed_early = 0  # destroyed with frees of their memory still queued
        self._default_pools = [
            SimPool(_POOL_BASE + _POOL_STEP * i, i, default=True) for i in range(len(self._devices))
        ]
        for pool in self._default_pools:
            self._mempools[pool.handle] = pool

    def _pool(self, pool) -> SimPool | None:
        """The usable pool with this handle, or None (unknown or destroyed)."""
        found = self._mempools.get(int(pool or 0))
        return None if found is None or found.destroyed else found

    def _device_pools(self, device: int):
        """The pools whose memory a synchronize of ``device`` may give back (host pools' too:
        any device's streams may free into them)."""
        return [p for p in self._mempools.values() if p.device in (device, -1) and not p.imported]

    # -- creation and destruction ------------------------------------------------------------

    def cuDeviceGetDefaultMemPool(self, dev):
        if not self._initialized:
            return (NOT_INITIALIZED, None)
        if self._device(dev) is None:
            return (INVALID_DEVICE, None)
        return (OK, CUmemoryPool(self._default_pools[int(dev)].handle))

    def cuMemPoolCreate(self, poolProps):
        if poolProps is not None and not isinstance(poolProps, CUmemPoolProps):
            raise TypeError(
                "Argument 'poolProps' has incorrect type (expected "
                "cuda.bindings.driver.CUmemPoolProps, got "
                f"{type(poolProps).__name__})"
            )
        if not self._initialized:
            return (NOT_INITIALIZED, None)
        err, location, device = self._pool_location(poolProps)
        if err:
            return (err, None)
        handle_types = int(poolProps.handleTypes)
        if handle_types not in (0, int(POSIX_FD)) or handle_types and location != "device":
            return (INVALID_VALUE, None)  # host and managed pools: no IPC (CUDA 13 docs)
        max_size = size_t(poolProps.maxSize)
        with self._lock:
            pool = SimPool(
                next(self._pool_handles),
                device,
                limit=-(-max_size // GRANULE) * GRANULE,
                ipc=bool(handle_types),
                location=location,
            )
            self._open_pool(pool)
            self._mempools[pool.handle] = pool
        return (OK, CUmemoryPool(pool.handle))

    def _pool_location(self, props):
        """(CUresult, "device" | "host" | "managed", device ordinal or -1) of new pool props:
        device memory of a device, page-locked host memory (CU_MEM_LOCATION_TYPE_HOST, whose
        id the driver ignores), managed memory preferring a device (CUDA 13 pools)."""
        if props is None:
            return INVALID_VALUE, None, None
        kind, where = props.allocType, props.location
        if (
            kind == CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
            and where.type == CUmemLocationType.CU_MEM_LOCATION_TYPE_HOST
        ):
            return OK, "host", -1
        if kind not in (
            CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED,
            CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_MANAGED,
        ):
            return INVALID_VALUE, None, None
        if where.type != CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE:
            return NOT_SUPPORTED, None, None  # host NUMA nodes and the rest: not modelled
        if self._device(where.id) is None:
            return INVALID_VALUE, None, None  # as on an H100 (device 7 of 1)
        managed = kind == CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_MANAGED
        return OK, "managed" if managed else "device", int(where.id)

    def _open_pool(self, pool: SimPool) -> None:
        """Give a new pool what it needs beyond its bookkeeping (`_ipc`: shared memory)."""

    def cuMemPoolDestroy(self, pool):
        with self._lock:
            found = self._pool(pool)
            if found is None or found.default:
                return (INVALID_VALUE,)
            # Live allocations stay usable until freed (measured on an H100); what the pool
            # holds beyond them goes back as soon as their frees have run. Frees still queued
            # are counted (see SimControls.pools_destroyed_early).
            self._pools_destroyed_early += any(block.valid for block in found.free)
            found.destroyed = True
            self._release(found, 0)
            if not found.reserved and not found.free:  # (else its last block's drop does)
                self._mempools.pop(found.handle, None)
        return (OK,)

    # -- allocation and free -------------------------------------------------------------------

    def cuMemAllocAsync(self, bytesize, hStream):
        nbytes = size_t(bytesize)
        with self._lock:
            err, stream = self._stream(hStream)
            if err:
                return (err, None)
            return self._pool_allocate(nbytes, self._default_pools[stream.ctx.device], stream)

    def cuMemAllocFromPoolAsync(self, bytesize, pool, hStream):
        nbytes = size_t(bytesize)
        with self._lock:
            err, stream = self._stream(hStream)
            if err:
                return (err, None)
            found = self._pool(pool)
            if found is None or found.imported:  # an imported pool allocates nothing
                return (INVALID_VALUE, None)
            return self._pool_allocate(nbytes, found, stream)

    def _pool_allocate(self, nbytes: int, pool: SimPool, stream):
        if nbytes == 0:  # as on driver 580: success, and a null pointer
            return (OK, CUdeviceptr(0))
        ctx = stream.ctx
        block = self._reusable(nbytes, pool, stream) or self._pool_block(nbytes, pool, ctx)
        if block is None:
            return (OUT_OF_MEMORY, None)
        block.ordered = True
        pool.used += nbytes
        pool.used_high = max(pool.used_high, pool.used)
        return (OK, CUdeviceptr(block.allocate(nbytes, ctx)))

    def _reusable(self, nbytes: int, pool: SimPool, stream):
        """The smallest block of the pool that fits and that ``stream`` may use now: one freed
        on it, or one whose free has run. Blocks more than twice too big are left alone."""
        fits = [
            b
            for b in pool.free
            if nbytes <= b.size <= 2 * nbytes + 512 and (b.free_stream is stream or b.released)
        ]
        if not fits:
            return None
        block = min(fits, key=lambda b: b.size)
        pool.free.remove(block)
        return block

    def _pool_block(self, nbytes: int, pool: SimPool, ctx):
        """A new block for ``pool``, within its maxSize (its idle blocks released first)."""
        size = self._block_size(nbytes)
        if pool.limit and pool.reserved + size > pool.limit:
            self._release(pool, 0)
            if pool.reserved + size > pool.limit:
                return None
        block = self._new_block(nbytes, pool.device, ctx, pool)
        if block is not None:
            pool.reserved += block.size
            pool.reserved_high = max(pool.reserved_high, pool.reserved)
        return block

    def _block_dropped(self, block) -> None:
        pool = block.pool
        if pool is not None and not pool.imported:
            if not block.pooled and block.current is not None:  # cuMemFree of a live one
                pool.used -= block.current.length
            pool.reserved -= block.size
            if pool.destroyed and not pool.reserved and not pool.free:
                self._mempools.pop(pool.handle, None)
        super()._block_dropped(block)

    def cuMemFreeAsync(self, dptr, hStream):
        with self._lock:
            err, stream = self._stream(hStream)
            if err:
                return (err,)
            block = self._blocks.get(int(dptr or 0))
            if block is None or not block.live or block.pooled:
                return (INVALID_VALUE,)
            pool = block.pool
            if pool is None:  # cuMemAlloc memory: the device's default pool takes it
                pool = block.pool = self._default_pools[block.device]
                pool.reserved += block.size
            block.pooled = True
            block.free_stream = stream
            pool.free.append(block)
            alloc = block.current
            pool.used -= alloc.length

            def free():
                block.end(alloc)

            return (self._enqueue(hStream, free, label="free"),)

    # -- release ---------------------------------------------------------------------------------

    def _release(self, pool: SimPool, keep: int, *, trim: bool = False) -> None:
        """Give back blocks of ``pool`` whose free has run: while it holds more than ``keep``
        bytes (a release threshold), or, with ``trim``, while ``keep`` bytes stay reserved
        (cuMemPoolTrimTo: an H100 keeps a 32 MiB chunk when asked to keep 1 MiB)."""
        for block in [b for b in pool.free if b.released]:
            if (pool.reserved - block.size < keep) if trim else (pool.reserved <= keep):
                continue
            pool.free.remove(block)
            self._drop_block(block)

    def _release_idle(self, device: int) -> None:
        """A synchronize waited for the device's work: pools above their threshold give back."""
        for pool in self._device_pools(device):
            self._release(pool, 0 if pool.destroyed else pool.threshold)

    def _device_synchronized(self, device: int) -> None:
        with self._lock:
            self._release_idle(device)
        super()._device_synchronized(device)

    def _trim_device(self, device: int) -> None:
        for pool in self._device_pools(device):
            self._release(pool, 0)

    def _synchronize_context(self, ctx):
        err = super()._synchronize_context(ctx)
        self._device_synchronized(ctx.device)
        return err

    def _release_context_resources(self, ctx):
        super()._release_context_resources(ctx)
        with self._lock:
            for pool in self._device_pools(ctx.device):
                for block in pool.free:
                    if not block.released and block.free_stream.ctx is ctx:
                        # A poisoned context's queued work never runs, frees included; its
                        # streams are gone, so nothing orders a reuse after them: the pool
                        # has the block back (the driver cannot free it twice either).
                        block.end(block.current)

    def cuMemPoolTrimTo(self, pool, minBytesToKeep):
        keep = size_t(minBytesToKeep)
        with self._lock:
            found = self._pool(pool)
            if found is None or found.imported:
                return (INVALID_VALUE,)
            self._release(found, keep, trim=True)
        return (OK,)

    # -- attributes ------------------------------------------------------------------------------

    def cuMemPoolGetAttribute(self, pool, attr):
        if attr not in _SIZES and attr not in _REUSE:
            raise TypeError(f"Unsupported attribute: {attr.name}")
        found = self._pool(pool)
        if found is None or found.imported:  # an imported pool answers none (H100)
            return (INVALID_VALUE, None)
        if attr in _REUSE:
            return (OK, found.reuse[attr])
        value = {
            A.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: found.threshold,
            A.CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: found.reserved,
            A.CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH: found.reserved_high,
            A.CU_MEMPOOL_ATTR_USED_MEM_CURRENT: found.used,
            A.CU_MEMPOOL_ATTR_USED_MEM_HIGH: found.used_high,
        }[attr]
        return (OK, cuuint64_t(value))

    def cuMemPoolSetAttribute(self, pool, attr, value):
        if attr not in _SIZES and attr not in _REUSE:
            raise TypeError(f"Unsupported attribute: {attr.name}")
        if attr in _SIZES and not hasattr(value, "getPtr"):  # cuda.bindings takes cuuint64_t
            raise AttributeError(f"'{type(value).__name__}' object has no attribute 'getPtr'")
        number = int(value)
        found = self._pool(pool)
        if found is None or found.imported:
            return (INVALID_VALUE,)
        with self._lock:
            if attr in _REUSE:
                found.reuse[attr] = number
            elif attr == A.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
                found.threshold = number
            elif number:  # only a reset of a high watermark to 0 is allowed (H100)
                return (INVALID_VALUE,)
            elif attr == A.CU_MEMPOOL_ATTR_USED_MEM_HIGH:
                found.used_high = found.used
            elif attr == A.CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
                found.reserved_high = found.reserved
            else:  # the current amounts are read-only
                return (INVALID_VALUE,)
        return (OK,)
