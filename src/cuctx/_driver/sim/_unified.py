"""Copies whose sides the sim infers from their addresses, as the driver does under unified
addressing: cuMemcpyAsync and cuMemcpy (1D), and the CU_MEMORYTYPE_UNIFIED sides of
cuMemcpy2D/3D (`_pitched`).

Each side is, by where its address falls: memory of a sim block (device memory, managed
memory, a pool's), or host memory (page-locked ranges, or any other mapped host memory,
which is pageable). Memory of a host-located pool (`_pools`: CU_MEM_LOCATION_TYPE_HOST) is
a block, but host memory: it is page-locked, so its copies are asynchronous and timed as
host copies, and it is not checked against the current context. Whether the driver checks
a host pool's memory against the pool's access list in these copies was not measured; the
sim lets any context's copy use it, as page-locked host memory of cuMemHostAlloc.

Host memory is not device memory: the copies that name a side as device memory
(cuMemcpyHtoDAsync, cuMemcpyDtoHAsync, cuMemcpyDtoDAsync, cuMemcpyPeerAsync, and
CU_MEMORYTYPE_DEVICE in cuMemcpy2D/3D) answer CUDA_ERROR_INVALID_VALUE for a host pool's
memory there. Measured for cuMemcpyHtoDAsync (two H200s, driver 580, CUDA 13.0); the others
are refused by the same rule, not measured. Memsets take it (the CUDA documentation: a
memset of page-locked host memory is synchronous with the host, so it is allowed).
"""

from __future__ import annotations

from ._cargs import size_t
from ._common import INVALID_VALUE, OK
from ._host import HostSide
from ._timing import copy_kind


def copy_bytes(source, target):
    """The work of a copy between two spans (device or host): their bytes, at run time."""

    def run():
        err, src_bytes = source.get()
        if not err:
            err, dst_bytes = target.get()
        if err:
            return err
        dst_bytes[:] = src_bytes  # NumPy copies through a buffer when the ranges overlap

    return run


def host_located(block) -> bool:
    """Whether ``block`` is memory of a host-located pool: host memory with a block's
    address."""
    return block.pool is not None and block.pool.location == "host"


def pageable_side(*sides) -> HostSide | None:
    """The first pageable host side of a copy's sides (DeviceSpans or HostSides), which
    makes the copy synchronous; None when it has none."""
    return next((s for s in sides if isinstance(s, HostSide) and not s.pinned), None)


class UnifiedCopies:
    """cuMemcpyAsync, cuMemcpy; each side resolved by `_unified_side`."""

    def _unified_side(self, address: int, nbytes: int, reach_from):
        """(CUresult, the bytes (a DeviceSpan or HostSide), host memory?) of one side of a
        copy, resolved from its address when the call is made. Device memory must lie in a
        live allocation that ``reach_from`` (a context, `_copy_context`) reaches; host
        memory must be mapped (`_host_side`)."""
        block = self._block_at(address)
        if block is None:
            side = self._host_side(address, nbytes)
            return (INVALID_VALUE if side is None else OK), side, True
        span = self._device_span(address, nbytes)
        if span is None:
            return INVALID_VALUE, None, False
        if host_located(block):
            return OK, span, True
        if reach_from is not None and not self._may_reach(reach_from, block):
            return INVALID_VALUE, None, False
        return OK, span, False

    def cuMemcpyAsync(self, dst, src, ByteCount, hStream):
        """Queued as the sim's other copies (synchronous with a pageable side, timed by the
        kind of its sides); 0 bytes is a successful no-op once the stream is checked, as an
        empty 2D copy is."""
        n = size_t(ByteCount)
        err, ctx = self._stream_context(hStream)
        if err or n == 0:
            return (err,)
        reach_from = self._copy_context(ctx)
        err, source, source_host = self._unified_side(int(src), n, reach_from)
        if not err:
            err, target, target_host = self._unified_side(int(dst), n, reach_from)
        if err:
            return (err,)

        run = copy_bytes(source, target)
        between = (
            not (source_host or target_host)
            and source.alloc.block.device != target.alloc.block.device
        )
        kind = copy_kind(source_host, target_host, between)
        return self._copy(
            hStream, n, run, pageable_side(source, target), kind.removeprefix("memcpy "), kind
        )

    def cuMemcpy(self, dst, src, ByteCount):
        return self._synchronous(self.cuMemcpyAsync(dst, src, ByteCount, 0))
