"""Host memory of the sim: page-locked ranges (cuMemHostAlloc, cuMemHostRegister) and the
host side of copies.

A copy whose host side lies in a page-locked range is asynchronous; any other host memory
is pageable and the copy drains its stream before returning, as CUDA's pageable copies are
synchronous. Host memory is not owned by a context here, so tearing a context down leaves it
alone, and a page-locked range is page-locked for every context with or without
CU_MEMHOSTALLOC_PORTABLE / CU_MEMHOSTREGISTER_PORTABLE: the driver API's "Unified
Addressing" section says all host memory of cuMemHostAlloc is "always directly accessible
from all contexts on all devices that support unified addressing ... regardless of" those
flags (scripts/probe_multi_device.py checks that such copies stay asynchronous on another
device's stream).

The sim reads and writes the caller's host memory through NumPy, exactly where the driver
would. A bad host address would then crash the interpreter, so before NumPy touches memory
the sim owns no buffer for, it asks the kernel whether the pages are mapped (``mincore``):
a null or unmapped host range is CUDA_ERROR_INVALID_VALUE when the call is made, and a
registered range unmapped while a copy was queued is CUDA_ERROR_ILLEGAL_ADDRESS when the
copy runs (the sim's choice: the real driver would copy stale pinned pages silently).
Where ``mincore`` is missing (not Linux or macOS), only null pointers are caught.
"""

from __future__ import annotations

import bisect
import ctypes
import mmap

import numpy as np
from cuda.bindings.driver import (
    CU_MEMHOSTALLOC_DEVICEMAP,
    CU_MEMHOSTALLOC_PORTABLE,
    CU_MEMHOSTALLOC_WRITECOMBINED,
    CU_MEMHOSTREGISTER_DEVICEMAP,
    CU_MEMHOSTREGISTER_IOMEMORY,
    CU_MEMHOSTREGISTER_PORTABLE,
    CU_MEMHOSTREGISTER_READ_ONLY,
    CUresult,
)

from ._cargs import size_t
from ._common import (
    HOST_MEMORY_ALREADY_REGISTERED,
    HOST_MEMORY_NOT_REGISTERED,
    ILLEGAL_ADDRESS,
    INVALID_VALUE,
    OK,
    OUT_OF_MEMORY,
)

_HOST_ALLOC_FLAGS = (
    CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_WRITECOMBINED
)
_HOST_REGISTER_FLAGS = (
    CU_MEMHOSTREGISTER_PORTABLE
    | CU_MEMHOSTREGISTER_DEVICEMAP
    | CU_MEMHOSTREGISTER_IOMEMORY
    | CU_MEMHOSTREGISTER_READ_ONLY
)
_ADDRESS_LIMIT = 1 << 57  # above every user address, even with 5-level page tables
_PAGE = mmap.PAGESIZE
_CHUNK = 1 << 30  # mincore's answer vector is one byte a page: ask 1 GiB at a time


def _load_mincore():
    try:
        fn = ctypes.CDLL(None, use_errno=True).mincore
    except (OSError, AttributeError):
        return None
    fn.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
    fn.restype = ctypes.c_int
    return fn


_mincore = _load_mincore()


def mapped(address: int, nbytes: int) -> bool:
    """Whether host bytes [address, address + nbytes) are mapped in this process, so NumPy
    may touch them without a segfault. Write protection is not checked."""
    if address <= 0 or address + nbytes > _ADDRESS_LIMIT:
        return False
    if _mincore is None:
        return True
    start, end = address - address % _PAGE, address + nbytes
    while start < end:
        length = min(end - start, _CHUNK)
        answer = ctypes.create_string_buffer(-(-length // _PAGE))
        if _mincore(start, length, answer) != 0:  # ENOMEM: a page in the range is unmapped
            return False
        start += length
    return True


class _Raw:
    """Exposes raw host memory to NumPy without copying."""

    def __init__(self, address: int, nbytes: int):
        self.__array_interface__ = {
            "data": (address, False),
            "shape": (nbytes,),
            "typestr": "|u1",
            "version": 3,
        }


class HostSide:
    """The host side of one copy: the bytes, and whether they must be checked again when the
    copy runs (memory the sim does not own may be unmapped meanwhile)."""

    __slots__ = ("address", "nbytes", "view", "owned", "pinned")

    def __init__(self, address: int, nbytes: int, view: np.ndarray, owned: bool, pinned: bool):
        self.address = address
        self.nbytes = nbytes
        self.view = view
        self.owned = owned  # a slice of a buffer the sim allocated (kept alive by the view)
        self.pinned = pinned  # page-locked: the copy is asynchronous

    def get(self):
        """(CUresult, bytes) when the copy runs. A pageable copy runs before its call
        returns, so only registered memory needs a second look."""
        if self.owned or not self.pinned or mapped(self.address, self.nbytes):
            return OK, self.view
        return ILLEGAL_ADDRESS, None


class HostMemory:
    """cuMemHostAlloc, cuMemFreeHost, cuMemHostRegister, cuMemHostUnregister."""

    def _init_host(self):
        self._host_starts: list[int] = []  # sorted starts of page-locked ranges
        self._host_ranges: dict[int, tuple] = {}  # start -> (end, NumPy buffer or None)

    def _host_range(self, address: int):
        i = bisect.bisect_right(self._host_starts, address) - 1
        if i >= 0:
            start = self._host_starts[i]
            end, buffer = self._host_ranges[start]
            if address < end:
                return start, end, buffer
        return None, None, None

    def _host_side(self, address: int, nbytes: int) -> HostSide | None:
        """Host bytes [address, address + nbytes) for a copy, or None when NumPy must not
        touch them (null, unmapped, or the sim's own made-up device addresses)."""
        start, end, buffer = self._host_range(address)
        inside = start is not None and address + nbytes <= end
        if inside and buffer is not None:
            view = buffer[address - start : address - start + nbytes]
            return HostSide(address, nbytes, view, True, True)
        if (
            self._block_at(address) is not None
            or self._block_at(address + nbytes - 1) is not None
            or not mapped(address, nbytes)
        ):
            return None
        return HostSide(address, nbytes, np.asarray(_Raw(address, nbytes)), False, inside)

    def _pinned(self, address: int, nbytes: int) -> bool:
        start, end, _ = self._host_range(address)
        return start is not None and address + nbytes <= end

    def _add_host_range(self, start: int, end: int, buffer) -> CUresult:
        i = bisect.bisect_left(self._host_starts, start)
        before = self._host_starts[i - 1] if i else None
        after = self._host_starts[i] if i < len(self._host_starts) else None
        if (before is not None and self._host_ranges[before][0] > start) or (
            after is not None and after < end
        ):
            return HOST_MEMORY_ALREADY_REGISTERED
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
        nbytes = size_t(bytesize)
        err, _ = self._work_context()
        if err:
            return (err, None)
        if nbytes == 0 or int(Flags) & ~_HOST_ALLOC_FLAGS:
            return (INVALID_VALUE, None)
        try:
            buffer = np.zeros(nbytes, np.uint8)
        except MemoryError:  # more than the host can give: the driver's answer
            return (OUT_OF_MEMORY, None)
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
        start, n = int(p), size_t(bytesize)
        err, _ = self._work_context()
        if err:
            return (err,)
        if start == 0 or n == 0 or int(Flags) & ~_HOST_REGISTER_FLAGS:
            return (INVALID_VALUE,)
        with self._lock:
            return (self._add_host_range(start, start + n, None),)

    def cuMemHostUnregister(self, p):
        err, _ = self._work_context()
        if err:
            return (err,)
        with self._lock:
            if not self._remove_host_range(int(p), owned=False):
                return (HOST_MEMORY_NOT_REGISTERED,)
        return (OK,)
