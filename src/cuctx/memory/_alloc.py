"""Stream-ordered device allocations (cuMemAllocAsync / cuMemFreeAsync) and their frees at
garbage collection (waiting for streams named by `record_stream`; held by `defer_cleanup`)."""

from __future__ import annotations

import functools
import weakref

from .. import _record, _trace
from .. import _lifetimes
from .._lifetimes import free_or_defer
from .._resource import POISONED
from ..context import ACTIVE, fail, in_context
from ..errors import OUT_OF_MEMORY, CudaError
from ..stream import Stream


class Allocation:
    """One stream-ordered allocation; freed on its stream when the last array using it goes,
    or when its context is destroyed or reset, whichever comes first."""

    __slots__ = ("ptr", "stream", "recorded", "_finalizer", "__weakref__")

    def __init__(self, ptr: int, nbytes: int, stream: Stream):
        self.ptr = ptr
        self.stream = stream
        self.recorded: list[Stream] = []  # other streams that used it (record_stream)
        self._finalizer = weakref.finalize(self, free_or_defer, _release, ptr, nbytes, stream,
                                           self.recorded)
        self._finalizer.atexit = False  # (free_or_defer holds it in host functions)
        ctx = stream._ctx
        live = _live.get(ctx)
        if live is None:
            live = _live[ctx] = weakref.WeakSet()
            ctx._on_teardown(_free_live, before=True)
            ctx._on_teardown(_orphan_live)
        live.add(self)


# The allocations of each context not yet freed. Stream-ordered memory comes from the device's
# pool, which outlives contexts: destroying or resetting a context does not free it (measured
# on an H100, driver 580), so cuctx frees what is left just before, while the context works.
_live: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _free_live(ctx) -> None:
    if ctx._state is not ACTIVE:
        return  # a poisoned context runs nothing: `_orphan_live` hands them on afterwards
    for alloc in list(_live.pop(ctx, ())):
        pending = alloc._finalizer.detach()  # (None when it ran meanwhile)
        if pending is None:
            continue
        _, _, (release, *args), _ = pending
        try:  # now, not deferred: after the teardown nothing could free it
            freed = release(*args)
        except CudaError:  # a fault the context had not reported yet (a wait refused)
            freed = False
        if not freed:  # the pool outlives the context: a usable one frees it later
            _lifetimes.orphans.setdefault(ctx._device, []).append(alloc.ptr)


def _orphan_live(ctx) -> None:
    """After the teardown: what a poisoned context could not free goes to the device's
    orphans (`_lifetimes.free_orphans`)."""
    for alloc in list(_live.pop(ctx, ())):
        if alloc._finalizer.detach() is not None:
            _lifetimes.orphans.setdefault(ctx._device, []).append(alloc.ptr)


def _release(ptr: int, nbytes: int, stream: Stream, recorded: list[Stream]) -> bool:
    """Free on ``stream`` (after the recorded streams); False when the driver refused it."""
    if stream._ctx._state is not ACTIVE:
        if stream._ctx._state is POISONED:  # the pool outlives it: a usable context frees it
            _lifetimes.orphans.setdefault(stream._ctx._device, []).append(ptr)
        return True
    if _lifetimes.capturing and _lifetimes.held_by_capture(
            stream, ptr, functools.partial(_release, ptr, nbytes, stream, recorded)):
        return True  # memory from before the capture: freed when it ends, not in the graph
    for other in recorded:
        if other._ctx._state is ACTIVE:
            stream.wait(other)  # the free is queued after that stream's work so far
    # At garbage collection there is no caller to raise to: a refusal (the context faulted
    # unnoticed) is for the teardown to handle (`_free_live`).
    err, = stream._call(stream._backend.driver.cuMemFreeAsync, ptr, stream._handle)
    if not err and _trace.sinks:
        _trace.emit("free", stream._ctx, stream, (_trace.Access(ptr, nbytes, _trace.WRITE),))
    return not err


def allocate(nbytes: int, stream: Stream) -> Allocation:
    ctx = stream._ctx
    if ctx._state is not ACTIVE:
        raise ctx._unusable("cuctx.empty")
    if _record.threads:  # an autograph call lends its temporaries the memory of earlier calls
        recorder = _record.current()
        if recorder is not None:
            lent = recorder.allocate(nbytes, stream)
            if lent is not None:
                return lent
    return from_pool(nbytes, stream)


def from_pool(nbytes: int, stream: Stream) -> Allocation:
    """A new stream-ordered allocation of ``nbytes`` on ``stream`` (whose context is usable)."""
    ctx = stream._ctx
    # Frees a collection inside a host function held: reuse them first (not while this thread
    # records an autograph call: they would be queued before the work it recorded).
    if _lifetimes._held and _record.current() is None:
        _lifetimes.run_held_finalizers()
    if _lifetimes.orphans:
        _lifetimes.free_orphans(ctx)
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
            # A refused request can leave the pool holding what it reserved trying (measured
            # on an H100: 1 MiB free after asking for more than the device has, and the next
            # cuCtxCreate failed): give back what no allocation uses.
            drv = stream._backend.driver
            pool_err, pool = drv.cuDeviceGetDefaultMemPool(ctx.device._handle)
            if not pool_err:
                drv.cuMemPoolTrimTo(pool, 0)
            free, total = ctx.device.mem_info()
            hint = (f"asked for {nbytes} bytes on device {ctx.device.ordinal} "
                    f"(free {free} of {total})")
        fail(stream._backend, err, "cuMemAllocAsync", ctx, hint)
    if _trace.sinks:
        _trace.emit("alloc", ctx, stream, (_trace.Access(int(ptr), nbytes, _trace.WRITE),))
    return Allocation(int(ptr), nbytes, stream)
