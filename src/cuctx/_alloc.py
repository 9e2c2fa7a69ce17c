"""Stream-ordered device allocations (cuMemAllocAsync / cuMemFreeAsync), their frees at
garbage collection (waiting for streams named by `record_stream`), and `defer_cleanup`."""

from __future__ import annotations

import contextlib
import threading
import weakref
from typing import Any, Iterator

from .context import ACTIVE, fail
from .device import Device
from .stream import Stream, current_stream

_OUT_OF_MEMORY = 2


class Allocation:
    """One stream-ordered allocation; freed on its stream when the last array using it goes."""

    __slots__ = ("ptr", "stream", "recorded", "__weakref__")

    def __init__(self, ptr: int, stream: Stream):
        self.ptr = ptr
        self.stream = stream
        self.recorded: list[Stream] = []  # other streams that used it (record_stream)
        weakref.finalize(self, _free, ptr, stream, self.recorded).atexit = False


_defer_lock = threading.Lock()
_defer_depth = 0
_deferred: list[tuple] = []


def _free(ptr: int, stream: Stream, recorded: list[Stream]) -> None:
    with _defer_lock:
        if _defer_depth:
            _deferred.append((ptr, stream, recorded))
            return
    _release(ptr, stream, recorded)


def _release(ptr: int, stream: Stream, recorded: list[Stream]) -> None:
    if stream._ctx._state is not ACTIVE:
        return  # the driver freed it with the context (or will, when it is destroyed)
    for other in recorded:
        if other._ctx._state is ACTIVE:
            stream.wait(other)  # the free is queued after that stream's work so far
    # At garbage collection there is no caller to raise to; a failure here means the
    # context was lost meanwhile, and the driver frees the memory with it.
    stream._call(stream._backend.driver.cuMemFreeAsync, ptr, stream._handle)


@contextlib.contextmanager
def defer_cleanup() -> Iterator[None]:
    """Hold every free of device memory until the (outermost) block ends, as Numba's
    ``defer_cleanup`` does: memory of arrays that die inside the block stays allocated, so
    work still queued on other streams may use it. Blocks nest; the hold is process-wide,
    because arrays may be collected on any thread."""
    global _defer_depth
    with _defer_lock:
        _defer_depth += 1
    try:
        yield
    finally:
        with _defer_lock:
            _defer_depth -= 1
            held = _deferred[:] if _defer_depth == 0 else []
            if held:
                _deferred.clear()
        for item in held:
            _release(*item)


def allocation_stream(stream: Stream | Any | None, device: Device | int | None) -> Stream:
    if stream is None:
        return current_stream(device)
    stream = Stream.wrap(stream)
    if device is not None and stream.device is not Device(device):
        raise ValueError(f"device={Device(device)!r} but stream {stream!r} is on "
                         f"{stream.device!r}; pass one of them, or a stream of that device")
    return stream


def allocate(nbytes: int, stream: Stream) -> Allocation:
    ctx = stream._ctx
    if ctx._state is not ACTIVE:
        raise ctx._unusable("cuctx.empty")
    alloc = stream._backend.driver.cuMemAllocAsync
    err, ptr = stream._call(alloc, nbytes, stream._handle)
    if err and int(err) == _OUT_OF_MEMORY:
        # Let the pool hand back memory whose frees are still queued. The raw call: faults
        # and host-function errors of other work are for their own synchronize to report.
        with ctx._activated("cuctx.empty"):
            stream._backend.driver.cuCtxSynchronize()
        err, ptr = stream._call(alloc, nbytes, stream._handle)
    if err:
        hint = ""
        if int(err) == _OUT_OF_MEMORY:
            free, total = ctx.device.mem_info()
            hint = f"asked for {nbytes} bytes on device {ctx.device.ordinal} (free {free} of {total})"
        fail(stream._backend, err, "cuMemAllocAsync", ctx, hint)
    return Allocation(int(ptr), stream)
