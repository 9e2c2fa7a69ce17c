"""Stream-ordered device allocations (cuMemAllocAsync, or cuMemAllocFromPoolAsync from a
`MemoryPool`; cuMemFreeAsync) and their frees at garbage collection (waiting for streams
named by `record_stream`; held by `defer_cleanup`)."""

from __future__ import annotations

import functools
import weakref
from typing import Any, Callable

from .. import _record, _trace
from .. import _lifetimes
from .._lifetimes import free_or_defer
from .._resource import POISONED, upper
from ..context import ACTIVE, fail, in_context
from ..errors import NOT_SUPPORTED, OUT_OF_MEMORY, CudaError
from ..stream import Stream


class Allocation:
    """One stream-ordered allocation; freed on its stream when the last array using it goes,
    or when its context is destroyed or reset, whichever comes first. ``release(ptr, nbytes,
    stream, recorded, pool, *extra)`` frees it (an imported allocation's differs: `_ipc`).

    The pending free holds the pool: a pool and its arrays that become garbage together (a
    traceback's frames hold both) have their finalizers run in any order, and a pool
    destroyed before the free of its memory was queued crashed the process at the next
    pool's allocation (two H200s, driver 580: a floating point exception, 3 runs of 3)."""

    __slots__ = ("ptr", "nbytes", "stream", "recorded", "pool", "shared", "_finalizer",
                 "__weakref__")

    def __init__(self, ptr: int, nbytes: int, stream: Stream, pool=None,
                 release: Callable[..., bool] | None = None, *extra):
        self.ptr = ptr
        self.nbytes = nbytes
        self.stream = stream
        self.recorded: list[Stream] = []  # other streams that used it (record_stream)
        self.pool = pool  # the MemoryPool it came from; None: the device's default pool
        self.shared = None  # (token, export data) once exported to another process (`_pool`)
        self._finalizer = weakref.finalize(self, free_or_defer, release or _release, ptr,
                                           nbytes, stream, self.recorded, pool, *extra)
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


def _release(ptr: int, nbytes: int, stream: Stream, recorded: list[Stream], pool=None) -> bool:
    """Free on ``stream`` (after the recorded streams); False when the driver refused it.
    ``pool`` (the MemoryPool it came from, None for the default pool's) is only held."""
    if stream._ctx._state is not ACTIVE:
        if stream._ctx._state is POISONED:  # the pool outlives it: a usable context frees it
            _lifetimes.orphans.setdefault(stream._ctx._device, []).append(ptr)
        return True
    if _lifetimes.capturing and _lifetimes.held_by_capture(
            stream, ptr, functools.partial(_release, ptr, nbytes, stream, recorded, pool)):
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


# Whether a MemoryPool of host memory (location="host") was made in this process: until one
# is, no array can be memory of one, and copies need not look (`in_host_pool`).
host_pools = False


def in_host_pool(arr: Any) -> bool:
    """Whether the DeviceArray ``arr`` is memory of a host-located pool: host memory, which
    the driver refuses as the device side of cuMemcpyHtoDAsync and the other copies that name
    one (`_copy.memory_type`). Only asked once `host_pools` is set."""
    alloc = arr._alloc
    return alloc is not None and alloc.pool is not None and alloc.pool._location == "host"


def pool_device(pool: Any, device: Any) -> Any:
    """The device of ``pool`` (a MemoryPool that can allocate), checked against ``device``."""
    if not isinstance(pool, upper.memory_pool):
        raise TypeError(f"pool must be a cuctx.MemoryPool, not {type(pool).__name__}")
    if pool._imported:
        raise ValueError(f"{pool!r} was imported from another process, and such a pool "
                         "cannot allocate (the driver refuses); allocate in the process that "
                         "made it")
    if device is not None and upper.device(device) is not pool.device:
        raise ValueError(f"device={upper.device(device)!r} but {pool!r} is on "
                         f"{pool.device!r}; pass one of them")
    return pool.device


def allocate(nbytes: int, stream: Stream, pool: Any = None) -> Allocation:
    """``nbytes`` on ``stream``, from ``pool`` (a MemoryPool; None: the device's default)."""
    ctx = stream._ctx
    if pool is not None and stream._ctx._device is not pool.device:
        raise ValueError(f"{pool!r} is on {pool.device!r}, but {stream!r} is on "
                         f"{stream.device!r}: allocate on a stream of the pool's device")
    if ctx._state is not ACTIVE:
        raise ctx._unusable("cuctx.empty")
    # An autograph call lends its temporaries the memory of earlier calls (the device's own
    # pool's: an explicit pool's memory is allocated from that pool every time).
    if _record.threads and pool is None:
        recorder = _record.current()
        if recorder is not None:
            lent = recorder.allocate(nbytes, stream)
            if lent is not None:
                return lent
    return from_pool(nbytes, stream, pool)


def from_pool(nbytes: int, stream: Stream, pool: Any = None) -> Allocation:
    """A new stream-ordered allocation of ``nbytes`` on ``stream`` (whose context is usable),
    from ``pool`` (None: the device's default pool)."""
    ctx = stream._ctx
    # Frees a collection inside a host function held: reuse them first (not while this thread
    # records an autograph call: they would be queued before the work it recorded).
    if _lifetimes._held and _record.current() is None:
        _lifetimes.run_held_finalizers()
    if _lifetimes.orphans:
        _lifetimes.free_orphans(ctx)
    drv = stream._backend.driver
    if pool is None:
        name, alloc, args = "cuMemAllocAsync", drv.cuMemAllocAsync, (nbytes, stream._handle)
    else:
        name, alloc = "cuMemAllocFromPoolAsync", drv.cuMemAllocFromPoolAsync
        args = (nbytes, pool._handle, stream._handle)
    err, ptr = stream._call(alloc, *args)
    if err and int(err) == OUT_OF_MEMORY:
        # Let the pool hand back memory whose frees are still queued. The raw call: faults
        # and host-function errors of other work are for their own synchronize to report.
        with in_context(ctx, "cuctx.empty"):
            drv.cuCtxSynchronize()
        err, ptr = stream._call(alloc, *args)
    if err:
        hint = ""
        if int(err) == OUT_OF_MEMORY:
            # A refused request can leave the pool holding what it reserved trying (measured
            # on an H100: 1 MiB free after asking for more than the device has, and the next
            # cuCtxCreate failed): give back what no allocation uses.
            handle = pool._handle if pool is not None else \
                drv.cuDeviceGetDefaultMemPool(ctx.device._handle)[1]
            if handle is not None:
                drv.cuMemPoolTrimTo(handle, 0)
            free, total = ctx.device.mem_info()
            hint = (f"asked for {nbytes} bytes on device {ctx.device.ordinal} "
                    f"(free {free} of {total})")
            if pool is not None and pool.max_size is not None:
                hint += (f" from {pool!r}, whose max_size {pool.max_size} the driver rounds "
                         "up to its reservation granularity")
        elif int(err) == NOT_SUPPORTED and pool is not None and pool.ipc:
            hint = (f"{pool!r} cannot allocate inside a stream capture (the driver refuses "
                    "graph memory from a pool shared between processes): allocate before "
                    "the capture")
        fail(stream._backend, err, name, ctx, hint)
    if _trace.sinks:
        _trace.emit("alloc", ctx, stream, (_trace.Access(int(ptr), nbytes, _trace.WRITE),))
    return Allocation(int(ptr), nbytes, stream, pool)
