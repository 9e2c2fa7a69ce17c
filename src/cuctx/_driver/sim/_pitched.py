"""2D and 3D copies of the sim: cuMemcpy2D(Async) and cuMemcpy3D(Async), taking
cuda.bindings' own CUDA_MEMCPY2D / CUDA_MEMCPY3D.

Each side is host or device memory: CU_MEMORYTYPE_HOST names it by ``srcHost``/``dstHost``,
CU_MEMORYTYPE_DEVICE and CU_MEMORYTYPE_UNIFIED by ``srcDevice``/``dstDevice`` (unified:
device or host memory by where the address falls, as under unified addressing, `_unified`;
a device address may also be page-locked host memory of cuMemHostAlloc or
cuMemHostRegister, which has the same address on the device, but not a host-located pool's
memory: CUDA_ERROR_INVALID_VALUE, as the 1D copies answer).
CUDA arrays are not modelled: CU_MEMORYTYPE_ARRAY answers CUDA_ERROR_NOT_SUPPORTED. A side
is ``Depth`` slices of ``Height`` rows of ``WidthInBytes`` bytes; rows lie ``Pitch`` apart,
slices ``Pitch * Height`` apart (the side's ``srcHeight``/``dstHeight``), and the copy starts
at ``X + Y * Pitch + Z * Pitch * Height`` from the side's address.

Checked when called (CUDA_ERROR_INVALID_VALUE, as the driver documents): an unset memory
type, a pitch below ``XInBytes + WidthInBytes`` or above CU_DEVICE_ATTRIBUTE_MAX_PITCH, a
slice height below ``Y + Height`` where slices are stepped over (more than one slice, or a
Z offset); and, as the sim's 1D copies are checked, a device side outside the
live allocation it starts in, or a host side that is null, unmapped or a device address.
An empty copy (a zero extent) is a successful no-op. The copy is queued like the 1D copies:
asynchronous unless a host side is pageable, when the stream is drained before returning;
the synchronous forms are the legacy stream's copy, waited for.
"""

from __future__ import annotations

import numpy as np
from cuda.bindings.driver import CUDA_MEMCPY2D, CUDA_MEMCPY3D, CUmemorytype

from ._common import INVALID_VALUE, NOT_SUPPORTED, OK
from ._timing import copy_kind
from ._unified import host_located, pageable_side

HOST, DEVICE = CUmemorytype.CU_MEMORYTYPE_HOST, CUmemorytype.CU_MEMORYTYPE_DEVICE
ARRAY, UNIFIED = CUmemorytype.CU_MEMORYTYPE_ARRAY, CUmemorytype.CU_MEMORYTYPE_UNIFIED
_MAX_PITCH = "CU_DEVICE_ATTRIBUTE_MAX_PITCH"


class _Side:
    """One side of a pitched copy, resolved when the call is made."""

    __slots__ = ("start", "pitch", "slice", "extent", "host", "bytes")

    def __init__(self, start: int, pitch: int, slice_: int, extent: int):
        self.start = start
        self.pitch = pitch
        self.slice = slice_
        self.extent = extent
        self.host = False  # host memory (a HostSide), not device memory (a DeviceSpan)
        self.bytes = None  # a DeviceSpan or a HostSide: .get() -> (CUresult, uint8 ndarray)


def _checked_type(copy, expected):
    if copy is not None and not isinstance(copy, expected):
        # What cuda.bindings raises, so code that runs on the sim runs on the driver.
        raise TypeError(
            f"Argument 'pCopy' has incorrect type (expected "
            f"cuda.bindings.driver.{expected.__name__}, got {type(copy).__name__})"
        )


class PitchedCopies:
    """cuMemcpy2D, cuMemcpy2DAsync, cuMemcpy3D, cuMemcpy3DAsync."""

    def cuMemcpy2DAsync(self, pCopy, hStream):
        _checked_type(pCopy, CUDA_MEMCPY2D)
        return self._pitched_copy(pCopy, hStream, depth=1, three_d=False)

    def cuMemcpy3DAsync(self, pCopy, hStream):
        _checked_type(pCopy, CUDA_MEMCPY3D)
        depth = pCopy.Depth if pCopy is not None else 0
        return self._pitched_copy(pCopy, hStream, depth=depth, three_d=True)

    def cuMemcpy2D(self, pCopy):
        return self._synchronous(self.cuMemcpy2DAsync(pCopy, 0))

    def cuMemcpy3D(self, pCopy):
        return self._synchronous(self.cuMemcpy3DAsync(pCopy, 0))

    def _pitched_copy(self, copy, hStream, depth: int, three_d: bool):
        if copy is None:
            return (INVALID_VALUE,)
        err, ctx = self._stream_context(hStream)
        if err:
            return (err,)
        err, plan = self._pitched_plan(copy, depth, three_d, self._copy_context(ctx))
        if err or plan is None:
            return (err,)
        nbytes, run, host, kind = plan
        return self._copy(hStream, nbytes, run, host, "copy3D" if three_d else "copy2D", kind)

    def _pitched_plan(self, copy, depth: int, three_d: bool, reach_from=None):
        """(CUresult, (bytes, operation, the pageable host side or None, the activity
        kind)) for ``copy`` checked now; (OK, None) for an empty copy. With
        ``reach_from`` (a context), device memory it does not reach is CUDA_ERROR_INVALID_VALUE
        (`_copy_context`). Graph copy nodes share it."""
        width, height = copy.WidthInBytes, copy.Height
        sides = []
        for prefix in ("src", "dst"):
            err, side = self._pitched_side(copy, prefix, width, height, depth, three_d, reach_from)
            if err:
                return err, None
            sides.append(side)
        if not (width and height and depth):
            return OK, None
        source, target = sides
        shape = (depth, height, width)

        def run():
            err, src_bytes = source.bytes.get()
            if not err:
                err, dst_bytes = target.bytes.get()
            if err:
                return err
            src = np.ndarray(shape, np.uint8, src_bytes, strides=(source.slice, source.pitch, 1))
            dst = np.ndarray(shape, np.uint8, dst_bytes, strides=(target.slice, target.pitch, 1))
            dst[...] = src  # NumPy copies through a buffer when the two overlap

        between = (
            not (source.host or target.host)
            and source.bytes.alloc.block.device != target.bytes.alloc.block.device
        )
        return OK, (
            width * height * depth,
            run,
            pageable_side(source.bytes, target.bytes),
            copy_kind(source.host, target.host, between),
        )

    def _pitched_side(
        self, copy, prefix: str, width: int, height: int, depth: int, three_d: bool, reach_from=None
    ):
        """(CUresult, _Side) for the source (``prefix`` "src") or destination ("dst")."""

        def field(name: str):
            return getattr(copy, prefix + name)

        try:
            kind = field("MemoryType")
        except ValueError:  # never set, or not a CUmemorytype: cuda.bindings cannot read it
            return INVALID_VALUE, None
        if kind == ARRAY:
            return NOT_SUPPORTED, None  # the sim has no CUDA arrays
        x, y, pitch = field("XInBytes"), field("Y"), field("Pitch")
        # A level of detail only means something for CUDA arrays: the driver ignores it for
        # host and device memory (measured on an H100).
        z, rows = (field("Z"), field("Height")) if three_d else (0, 0)
        if pitch < x + width or pitch > self._spec["attributes"][_MAX_PITCH]:
            return INVALID_VALUE, None
        if (depth > 1 or z) and rows < y + height:
            return INVALID_VALUE, None
        address = int(field("Host")) if kind == HOST else int(field("Device"))
        slice_ = pitch * rows
        start = address + x + y * pitch + z * slice_
        extent = (depth - 1) * slice_ + (height - 1) * pitch + width
        side = _Side(start, pitch, slice_, extent)
        if not (width and height and depth):
            return OK, side
        if kind == UNIFIED:
            err, side.bytes, side.host = self._unified_side(start, extent, reach_from)
            return err, (None if err else side)
        block = self._block_at(address) if kind == DEVICE else None
        if kind == DEVICE and (
            block is None
            and not self._pinned(start, extent)
            or block is not None
            and host_located(block)
        ):
            return INVALID_VALUE, None  # neither device memory nor cuMemHostAlloc'd memory
        side.host = block is None
        side.bytes = (
            self._host_side(start, extent) if side.host else self._device_span(start, extent)
        )
        if side.bytes is None or (
            reach_from is not None
            and not side.host
            and not self._may_reach(reach_from, side.bytes.alloc.block)
        ):
            return INVALID_VALUE, None
        return OK, side
