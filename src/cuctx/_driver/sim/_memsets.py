"""Memsets of the sim: cuMemsetD8Async, cuMemsetD16Async, cuMemsetD32Async and
cuMemsetD2D32Async. Apart from `_memory` as the pitched and unified copies are: the one write
of the memory model that is no copy, with checks of its own.

Checked when called: an address not aligned to the element size is CUDA_ERROR_INVALID_VALUE;
an empty memset succeeds once its stream is usable (as on an H100); the range must lie in one
live allocation (`MemoryModel._checked`), which is not checked against the current context
(memsets are not, `MemoryModel._copy_context` says why) and may be a host pool's memory.
The queued work checks its `DeviceSpan` again when it runs, as a copy's does. Values are
converted as cuda.bindings converts C arguments (`_cargs`).
"""

from __future__ import annotations

import numpy as np

from ._cargs import size_t, unsigned
from ._common import INVALID_VALUE
from ._timing import MEMSET


class Memsets:
    """cuMemset*Async (a base of `MemoryModel`, which checks the ranges and queues the work)."""

    def _memset(self, hStream, dst: int, span: int, align: int, write, label: str):
        if dst % align:
            return (INVALID_VALUE,)
        if span == 0:  # as on an H100: cuMemsetD8Async(0, 0, 0, stream) succeeds
            return (self._stream_context(hStream)[0],)
        err, spans = self._checked(hStream, (dst, span), in_current=False, device_only=False)
        if err:
            return (err,)
        target = spans[0]

        def run():
            err, view = target.get()
            if err:
                return err
            write(view)

        return (self._enqueue(hStream, run, nbytes=span, label=label, kind=MEMSET),)

    def cuMemsetD8Async(self, dstDevice, uc, N, hStream):
        value = unsigned(uc, 8, "unsigned char")

        def write(view):
            view[:] = value

        return self._memset(hStream, int(dstDevice), size_t(N), 1, write, "memset8")

    def cuMemsetD16Async(self, dstDevice, us, N, hStream):
        value = unsigned(us, 16, "unsigned short")

        def write(view):
            view.view(np.uint16)[:] = value

        return self._memset(hStream, int(dstDevice), 2 * size_t(N), 2, write, "memset16")

    def cuMemsetD32Async(self, dstDevice, ui, N, hStream):
        value = unsigned(ui, 32, "unsigned int")

        def write(view):
            view.view(np.uint32)[:] = value

        return self._memset(hStream, int(dstDevice), 4 * size_t(N), 4, write, "memset32")

    def cuMemsetD2D32Async(self, dstDevice, dstPitch, ui, Width, Height, hStream):
        pitch, width, height = size_t(dstPitch), size_t(Width), size_t(Height)
        if pitch < 4 * width:
            return (INVALID_VALUE,)
        span = (height - 1) * pitch + 4 * width if width and height else 0
        value = unsigned(ui, 32, "unsigned int")

        def write(view):
            rows = np.ndarray((height, width), np.uint32, buffer=view, strides=(pitch, 4))
            rows[...] = value

        return self._memset(hStream, int(dstDevice), span, 4, write, "memset2D32")
