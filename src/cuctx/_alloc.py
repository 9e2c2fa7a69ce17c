"""Stream-ordered device allocations (cuMemAllocAsync / cuMemFreeAsync) and their frees at
garbage collection (waiting for streams named by `record_stream`; held by `defer_cleanup`)."""

from __future__ import annotations

import weakref

from . import _trace
from . import _lifetimes
from ._lifetimes import free_or_defer
from .context import ACTIVE, fail, in_context
from .errors import OUT_OF_MEMORY
from .stream import Stream


class Allocation:
    """One stream-ordered allocation; freed on its stream when the last array using it goes."""

    __slots__ = ("ptr", "stream", "recorded", "__weakref__")

    def __init__(self, ptr: int, nbytes: int, stream: Stream):
        self.ptr = ptr
        self.stream = stream
        self.recorded: list[Stream] = []  # other streams that used it (record_stream)
        weakref.finalize(self, free_or_defer, _release, ptr, nbytes, stream,
                         self.recorded).atexit = False  # (free_or_defer holds it in host functions)


def _release(ptr: int, nbytes: int, stream: Stream, recorded: list[Stream]) -> None:
    if stream._ctx._state is not ACTIVE:
        return  # the driver freed it with the context (or will, when it is destroyed)
    for other in recorded:
        if other._ctx._state is ACTIVE:
            stream.wait(other)  # the free is queued after that stream's work so far
    # At garbage collection there is no caller to raise to; a failure here means the
    # context was lost meanwhile, and the driver frees the memory with it.
    err, = stream._call(stream._backend.driver.cuMemFreeAsync, ptr, stream._handle)
    if not err and _trace.sinks:
        _trace.emit("free", stream._ctx, stream, (_trace.Access(ptr, nbytes, _trace.WRITE),))


def allocate(nbytes: int, stream: Stream) -> Allocation:
    ctx = stream._ctx
    if ctx._state is not ACTIVE:
        raise ctx._unusable("cuctx.empty")
    if _lifetimes._held:  # frees a collection inside a host function held: reuse them first
        _lifetimes.run_held_finalizers()
    alloc = stream._backend.driver.cuMemAllocAsync
    err, ptr = stream._call(alloc, nbytes, stream._handle)
    if err and int(err) == OUT_OF_MEMORY:
        # Let the pool hand back memory whose frees are still queued. The raw call: faults
        # and host-function errors of other work are for their own synchronize to report.
        with in_context(ctx, "cuctx.empty"):
            stream._backend.driver.cuCtxSynchronize()
        err, ptr = stream._call(alloc, nbytes, stream._handle)
    if err:
        hint = ""
        if int(err) == OUT_OF_MEMORY:
            free, total = ctx.device.mem_info()
            hint = (f"asked for {nbytes} bytes on device {ctx.device.ordinal} "
                    f"(free {free} of {total})")
        fail(stream._backend, err, "cuMemAllocAsync", ctx, hint)
    if _trace.sinks:
        _trace.emit("alloc", ctx, stream, (_trace.Access(int(ptr), nbytes, _trace.WRITE),))
    return Allocation(int(ptr), nbytes, stream)
