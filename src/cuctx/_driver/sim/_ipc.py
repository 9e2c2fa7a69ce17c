"""IPC of the sim: a memory pool shared with another process, whose sim maps the same bytes.

An IPC pool (cuMemPoolCreate with CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) keeps its blocks
in a *segment*: a shared-memory file (``memfd_create``, or an unlinked temporary file where
there is none) whose first page names the pool (a key, its device, its base address) and
whose later pages hold the blocks, each at ``address - base``. cuMemPoolExportToShareableHandle
gives a new descriptor of that file; another process's sim imports it
(cuMemPoolImportFromShareableHandle) and maps the blocks that cuMemPoolImportPointer names,
at the exporter's addresses where its own address space has room. Writes in one process are
the other's reads, as on a GPU. Descriptors travel over Unix sockets (SCM_RIGHTS); the
pointer's export data is 64 plain bytes.

What an H100 answered (driver 580, scripts/probe_ipc.py), and the sim answers alike:
- a pointer of a pool not exported to a handle yet, of a non-IPC pool, an inner pointer, or
  one whose free is queued: CUDA_ERROR_INVALID_VALUE; the export data of one allocation is
  the same each time (and again for a later allocation at the same address);
- an import lands at the exporter's address; importing it again returns the same pointer,
  and one free unmaps it for both (no reference count); importing the pool twice gives the
  same pool, also in its own process; destroying an import succeeds each time;
- an imported pool allocates nothing, exports nothing and answers no attribute
  (CUDA_ERROR_INVALID_VALUE); an imported pointer cannot be exported again; importing a
  descriptor of a file that is no pool is CUDA_ERROR_UNKNOWN;
- the exporter may free or destroy what is imported: its calls succeed, and the importer
  still reads the bytes it had. The sim differs there: once the exporter's pool gives the
  block back to the device, the importer reads zeros, and before that, the exporter's next
  allocation there. Either way it is a use after free: importers free first.
- The sim's choice: a pointer imported into a pool that its own process exported is
  CUDA_ERROR_INVALID_VALUE (an H100 accepts it; what it maps was not measured).
- cuMemGetAddressRange of an imported pointer answers the size of the exporter's block (the
  allocation rounded up to 512 bytes: the export data, the same for any allocation at that
  address, does not say more); what an H100 answers was not measured.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import random
import struct
import tempfile
import uuid
import weakref

import numpy as np
from cuda.bindings.driver import CUdeviceptr, CUmemoryPool, CUmemPoolPtrExportData

from ._common import INVALID_VALUE, NOT_INITIALIZED, NOT_PERMITTED, OK, UNKNOWN
from ._memory import Block
from ._pools import POSIX_FD, SimPool

PAGE = mmap.PAGESIZE
_HEADER = struct.Struct("<8s16sqQ")  # magic, key, device, base address
_EXPORT = struct.Struct("<8s16sQQQ")  # magic, key, offset, size, address (64 bytes padded)
_MAGIC = b"cuctxsim"
_REGION, _SPAN = 1 << 48, 1 << 40  # IPC pools' addresses: above the others, 1 TiB each
_SLOTS = 1 << 12


class Segment:
    """The shared memory of one IPC pool, as this process maps it."""

    __slots__ = ("fd", "key", "device", "base", "end", "__weakref__")

    def __init__(self, fd: int, key: bytes, device: int, base: int):
        self.fd = fd  # this process's own descriptor, closed when the segment goes
        self.key = key
        self.device = device
        self.base = base  # where this process maps offset 0
        self.end = PAGE  # the next free offset (the exporter's; page 0 is the header)
        weakref.finalize(self, os.close, fd)

    @classmethod
    def create(cls, device: int, base: int) -> Segment:
        if hasattr(os, "memfd_create"):
            fd = os.memfd_create("cuctx-sim-pool", os.MFD_CLOEXEC)
        else:  # an unlinked file: gone with its last descriptor, as a memfd
            fd, path = tempfile.mkstemp(prefix="cuctx-sim-pool-")
            os.unlink(path)
        key = uuid.uuid4().bytes
        os.ftruncate(fd, PAGE)
        os.pwrite(fd, _HEADER.pack(_MAGIC, key, device, base), 0)
        return cls(fd, key, device, base)

    @staticmethod
    def header(fd: int) -> tuple[bytes, int, int] | None:
        """(key, device, base) of the segment behind ``fd``, or None if it is not one."""
        try:
            raw = os.pread(fd, _HEADER.size, 0)
        except OSError:
            return None
        if len(raw) != _HEADER.size:
            return None
        magic, key, device, base = _HEADER.unpack(raw)
        return (key, device, base) if magic == _MAGIC else None

    def place(self, size: int) -> int:
        """A new block's offset: never one given before (as addresses), a page apart."""
        offset = self.end
        self.end += -(-(size + PAGE) // PAGE) * PAGE
        os.ftruncate(self.fd, self.end)
        return offset

    def map(self, offset: int, size: int) -> np.ndarray | None:
        """The bytes [offset, offset + size) of the file, shared; None past its end."""
        if offset % PAGE or offset + size > os.fstat(self.fd).st_size:
            return None
        return np.frombuffer(mmap.mmap(self.fd, size, offset=offset), np.uint8)


def _release_pages(data: np.ndarray) -> None:
    """Give a dropped block's pages back to the system (punch them out of the file)."""
    buffer = data.base
    if isinstance(buffer, mmap.mmap) and hasattr(mmap, "MADV_REMOVE"):
        buffer.madvise(mmap.MADV_REMOVE)


def _check_handle_type(handleType) -> None:
    if not hasattr(handleType, "value"):  # what cuda.bindings raises for a plain int
        raise AttributeError(f"'{type(handleType).__name__}' object has no attribute 'value'")


class IpcModel:
    """cuMemPoolExportToShareableHandle, cuMemPoolImportFromShareableHandle,
    cuMemPoolExportPointer, cuMemPoolImportPointer, and frees of imported pointers."""

    def _init_ipc(self):
        self._imported_pools: dict[bytes, SimPool] = {}  # by segment key

    def _free_slot(self) -> int:
        used = {p.segment.base for p in self._mempools.values() if p.segment is not None}
        while True:
            base = _REGION + random.randrange(_SLOTS) * _SPAN
            if base not in used:
                return base

    def _open_pool(self, pool: SimPool) -> None:
        if pool.ipc:
            pool.segment = Segment.create(pool.device, self._free_slot())
        super()._open_pool(pool)

    def _block_memory(self, size: int, pool):
        segment = pool.segment if pool is not None else None
        if segment is None:
            return super()._block_memory(size, pool)
        offset = segment.place(size)
        return segment.base + offset, segment.map(offset, size)

    def _block_dropped(self, block) -> None:
        pool = block.pool
        if pool is not None and pool.segment is not None and not pool.imported:
            _release_pages(block.data)
        super()._block_dropped(block)

    # -- pools ------------------------------------------------------------------------------

    def cuMemPoolExportToShareableHandle(self, pool, handleType, flags):
        _check_handle_type(handleType)
        if not self._initialized:
            return (NOT_INITIALIZED, None)
        found = self._pool(pool)
        if (
            found is None
            or found.imported
            or not found.ipc
            or handleType != POSIX_FD
            or int(flags) != 0
        ):
            return (INVALID_VALUE, None)
        found.shared = True  # its pointers may be exported from now on
        return (OK, os.dup(found.segment.fd))  # a new descriptor, the caller's to close

    def cuMemPoolImportFromShareableHandle(self, handle, handleType, flags):
        _check_handle_type(handleType)
        if not isinstance(handle, int):
            raise TypeError(
                f"Provided argument is of type {type(handle)} but expected Type "
                f"{type(None)}, {int} or object with Buffer Protocol"
            )
        if not self._initialized:
            return (NOT_INITIALIZED, None)
        if handleType != POSIX_FD or flags:
            return (INVALID_VALUE, None)
        found = Segment.header(handle)
        if found is None or self._device(found[1]) is None:
            return (UNKNOWN, None)  # an H100's answer for a file that is no pool
        key, device, base = found
        with self._lock:
            pool = self._imported_pools.get(key)
            if pool is None:  # an H100 gives the same pool for a second import
                pool = SimPool(next(self._pool_handles), device, imported=True)
                used = {p.segment.base for p in self._mempools.values() if p.segment is not None}
                pool.segment = Segment(
                    os.dup(handle), key, device, base if base not in used else self._free_slot()
                )
                self._imported_pools[key] = pool
                self._mempools[pool.handle] = pool
        return (OK, CUmemoryPool(pool.handle))

    def cuMemPoolDestroy(self, pool):
        with self._lock:
            found = self._pool(pool)
            if found is None or not found.imported:
                return super().cuMemPoolDestroy(pool)
            # Its imported pointers stay mapped until freed.
            found.destroyed = True
            del self._mempools[found.handle]
            del self._imported_pools[found.segment.key]
        return (OK,)

    # -- pointers -----------------------------------------------------------------------------

    def cuMemPoolExportPointer(self, ptr):
        block = self._blocks.get(int(ptr or 0))
        pool = block.pool if block is not None else None
        if pool is None or pool.imported or not pool.shared or not block.live or block.pooled:
            return (INVALID_VALUE, None)
        data = CUmemPoolPtrExportData()
        payload = _EXPORT.pack(
            _MAGIC, pool.segment.key, block.base - pool.segment.base, block.size, block.base
        )
        ctypes.memmove(data.getPtr(), payload, len(payload))
        return (OK, data)

    def cuMemPoolImportPointer(self, pool, shareData):
        if not isinstance(shareData, CUmemPoolPtrExportData):
            raise TypeError(
                "Argument 'shareData' has incorrect type (expected "
                "cuda.bindings.driver.CUmemPoolPtrExportData, got "
                f"{type(shareData).__name__})"
            )
        magic, key, offset, size, _ = _EXPORT.unpack(
            ctypes.string_at(shareData.getPtr(), _EXPORT.size)
        )
        err, ctx = self._work_context()
        if err:
            return (err, None)
        with self._lock:
            found = self._pool(pool)
            if (
                found is None
                or not found.imported
                or magic != _MAGIC
                or key != found.segment.key
                or self._exporter_of(key) is not None
            ):
                return (INVALID_VALUE, None)  # an own pool's pointer too (H100)
            address = found.segment.base + offset
            old = self._blocks.get(address)
            if old is not None and old.pool is found and old.live and not old.pooled:
                return (OK, CUdeviceptr(address))  # mapped already: not counted again
            data = found.segment.map(offset, size)
            if data is None:
                return (INVALID_VALUE, None)
            if old is not None:
                self._drop_block(old)
            block = self._imported_block(address, size, found, ctx, data)
        return (OK, CUdeviceptr(block.base))

    def _exporter_of(self, key: bytes) -> SimPool | None:
        for pool in self._mempools.values():
            if pool.segment is not None and not pool.imported and pool.segment.key == key:
                return pool
        return None

    def _imported_block(self, address: int, size: int, pool: SimPool, ctx, data):
        block = Block(address, size, pool.device, ctx, data, pool)
        block.counted = False  # the exporter's device memory, not this process's
        block.ordered = True  # a pool's: outlives contexts
        self._add_block(block)
        block.allocate(size, ctx)
        return block

    def _imported(self, dptr):
        block = self._blocks.get(int(dptr or 0))
        return (
            block if block is not None and block.pool is not None and block.pool.imported else None
        )

    def cuMemFreeAsync(self, dptr, hStream):
        block = self._imported(dptr)
        if block is None:
            return super().cuMemFreeAsync(dptr, hStream)
        with self._lock:
            err, _ = self._stream(hStream)
            if err:
                return (err,)
            if not block.live or block.pooled:
                return (INVALID_VALUE,)
            block.pooled = True  # freed: a second free is refused at once
            alloc = block.current

            def unmap():
                block.end(alloc)
                if self._blocks.get(block.base) is block:
                    self._drop_block(block)

            return (self._enqueue(hStream, unmap, label="free"),)

    def cuMemFree(self, dptr):
        block = self._imported(dptr)
        if block is None:
            return super().cuMemFree(dptr)
        if self._in_host_function():
            return (NOT_PERMITTED,)
        err, _ = self._work_context()
        if err:
            return (err,)
        if not block.live or block.pooled:
            return (INVALID_VALUE,)
        err = self._synchronize_context(block.ctx)  # cuMemFree waits for the device
        with self._lock:
            if self._blocks.get(block.base) is block:
                self._drop_block(block)
        return (err or OK,)
