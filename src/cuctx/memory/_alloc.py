"""Stream-ordered device allocations (cuMemAllocAsync, or cuMemAllocFromPoolAsync from a
`MemoryPool`; cuMemFreeAsync) and their frees at garbage collection (waiting for streams
named by `record_stream`; held by `defer_cleanup`)."""

from __future__ import annotations

import functools
import weakref
from typing import Any, Callable

from cuda.bindings.driver import CUresult

from .. import _record, _trace
from .. import _lifetimes
from .._lifetimes import free_or_defer
from .._resource import POISONED, upper
from .._driver import in_host_function
from ..context import ACTIVE, in_context
from .._calls import fail
from ..errors import NOT_SUPPORTED, OUT_OF_MEMORY, CudaError
from ..stream import Stream


class Allocation:
    """One stream-ordered allocation; freed on its stream when the last array using it goes,
    or when its context is destroyed or reset, whichever comes first. ``release(ptr, nbytes,
    stream, recorded, pool, *extra)`` frees it (an imported allocation's differs: `_ipc`).

    The pending free is a list, ``[release, ptr, nbytes, stream, recorded, pool, *extra]``,
    filed under its context (``Context._allocations``, by the list's id) until ``__del__``
    or a teardown takes it out, whichever comes first: taking it is popping it, which one
    of them does. (A weakref.finalize and a WeakSet cost three times as much: 2 us of each
    ``cuctx.empty`` and its free.) Never run at interpreter exit: the driver tears
    everything down then.

    The pending free holds the pool: a pool and its arrays that become garbage together (a
    traceback's frames hold both) are collected in any order, and a pool destroyed before the
    free of its memory was queued crashed the process at the next pool's allocation (two
    H200s, driver 580: a floating point exception, 3 runs of 3)."""

    __slots__ = ("ptr", "nbytes", "stream", "recorded", "pool", "shared", "_free", "__weakref__")

    def __init__(
        self,
        ptr: int,
        nbytes: int,
        stream: Stream,
        pool=None,
        release: Callable[..., bool] | None = None,
        *extra,
    ):
        self.ptr = ptr
        self.nbytes = nbytes
        self.stream = stream
        self.recorded: list[Stream] = []  # other streams that used it (record_stream)
        self.pool = pool  # the MemoryPool it came from; None: the device's default pool
        self.shared = None  # (token, export data) once exported to another process (`_pool`)
        free = self._free = [release or _release, ptr, nbytes, stream, self.recorded, pool, *extra]
        ctx = stream._ctx
        live = ctx._allocations
        if live is None:
            live = ctx._allocations = _holding[id(ctx)] = {}
            weakref.finalize(ctx, _holding.pop, id(ctx), None)
            ctx._on_teardown(_free_live, before=True)
            ctx._on_teardown(_orphan_live)
        live[id(free)] = free

    def __del__(self, exiting=_lifetimes.exiting, free_or_defer=free_or_defer) -> None:
        # (what it reads as defaults: at interpreter exit the modules' globals are cleared)
        # With the extension, csrc/arrays.c's allocation_del stands in for this method and
        # frees in C when free_or_defer and _release would only call the driver (the
        # default pool's memory, `_release` its release; see _native_hooks.FREE_STEP_ASIDE):
        # what they do besides must step it aside.
        free = self._free
        if free is not None and not exiting[0]:
            self._free = None
            live = self.stream._ctx._allocations
            if live is not None and live.pop(id(free), None) is not None:
                free_or_defer(*free)

    @property
    def alive(self) -> bool:
        """Whether the free is still to come (neither run nor taken by a teardown)."""
        live = self.stream._ctx._allocations
        return self._free is not None and live is not None and id(self._free) in live


# A context's pending frees (``Context._allocations``: by id, each an allocation's list)
# are freed just before the context is torn down, while it works: stream-ordered memory comes
# from the device's pool, which outlives contexts, and destroying or resetting a context does
# not free it (measured on an H100, driver 580).
#
# This module holds them too (by the id of the context, until its teardown or its
# collection): what they hold (a stream, its context, a pool) is then never garbage before
# the free ran, as with weakref.finalize, whose registry holds its arguments. A context and
# its arrays that became garbage together would be collected in any order, the context's
# destroy first, and pushing a destroyed context corrupts the heap.
_holding: dict[int, dict[int, list]] = {}


def _take_live(ctx) -> list[list]:
    """The pending frees of ``ctx``'s allocations, taken out (their ``__del__`` then finds
    nothing to do)."""
    live, ctx._allocations = ctx._allocations or {}, None
    _holding.pop(id(ctx), None)
    taken = (live.pop(key, None) for key in list(live))  # (its __del__ may pop one meanwhile)
    return [free for free in taken if free is not None]


def forget(ctx, ptrs: set[int]) -> None:
    """Drop the pending frees of ``ctx``'s allocations at ``ptrs``: memory that never existed
    (allocated in a capture that made no graph)."""
    live = ctx._allocations or {}
    for key, free in list(live.items()):
        if free[1] in ptrs:
            live.pop(key, None)


def _free_live(ctx) -> None:
    if ctx._state is not ACTIVE:
        return  # a poisoned context runs nothing: `_orphan_live` hands them on afterwards
    for release, *args in _take_live(ctx):
        try:  # now, not deferred: after the teardown nothing could free it
            freed = release(*args)
        except CudaError:  # a fault the context had not reported yet (a wait refused)
            freed = False
        if not freed:  # the pool outlives the context: a usable one frees it later
            _lifetimes.orphans.setdefault(ctx._device, []).append(args[0])


def _orphan_live(ctx) -> None:
    """After the teardown: what a poisoned context could not free goes to the device's
    orphans (`_lifetimes.free_orphans`)."""
    for _, ptr, *_ in _take_live(ctx):
        _lifetimes.orphans.setdefault(ctx._device, []).append(ptr)


def _release(ptr: int, nbytes: int, stream: Stream, recorded: list[Stream], pool=None) -> bool:
    """Free on ``stream`` (after the recorded streams); False when the driver refused it.
    ``pool`` (the MemoryPool it came from, None for the default pool's) is only held."""
    ctx = stream._ctx
    if ctx._state is not ACTIVE:
        if ctx._state is POISONED:  # the pool outlives it: a usable context frees it
            _lifetimes.orphans.setdefault(ctx._device, []).append(ptr)
        return True
    if _lifetimes.capturing and _lifetimes.held_by_capture(
        stream, ptr, functools.partial(_release, ptr, nbytes, stream, recorded, pool)
    ):
        return True  # memory from before the capture: freed when it ends, not in the graph
    for other in recorded:
        if other._ctx._state is ACTIVE:
            stream.wait(other)  # the free is queued after that stream's work so far
    # Announced before the driver frees it: from then on another thread may be given the
    # same memory and announce its allocation, which the trace must see after this free (a
    # free announced after it would retire the new array's memory in the race checker). A
    # refused free is a fault of the context, which ends its use anyway. A sink that raises
    # does not keep the memory from being freed.
    try:
        if _trace.sinks:
            _trace.emit("free", ctx, stream, (_trace.Access(ptr, nbytes, _trace.WRITE),))
    finally:
        # At garbage collection there is no caller to raise to: a refusal (the context
        # faulted unnoticed) is for the teardown to handle (`_free_live`).
        err = _driver_free(ctx, stream, ptr)
        if pool is not None:  # its destroy waits for this free (`_pool_lifetime._destroy`)
            pool._queued_free(ctx)
    return not err


def _driver_free(ctx, stream: Stream, ptr: int) -> int:
    """cuMemFreeAsync of ``ptr`` on ``stream``, in C where the backend has it; the error."""
    native = stream._backend.native
    if native is not None and not in_host_function:
        return native.mem_free(ctx, stream, ptr)
    (err,) = stream._call(stream._backend.driver.cuMemFreeAsync, ptr, stream._handle)
    return err


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
        raise ValueError(
            f"{pool!r} was imported from another process, and such a pool "
            "cannot allocate (the driver refuses); allocate in the process that "
            "made it"
        )
    if device is not None and upper.device(device) is not pool.device:
        raise ValueError(
            f"device={upper.device(device)!r} but {pool!r} is on {pool.device!r}; pass one of them"
        )
    return pool.device


def allocate(nbytes: int, stream: Stream, pool: Any = None) -> Allocation:
    """``nbytes`` on ``stream``, from ``pool`` (a MemoryPool; None: the device's default)."""
    ctx = stream._ctx
    if pool is not None and stream._ctx._device is not pool.device:
        raise ValueError(
            f"{pool!r} is on {pool.device!r}, but {stream!r} is on "
            f"{stream.device!r}: allocate on a stream of the pool's device"
        )
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
    from ``pool`` (None: the device's default pool). With the extension, cuctx.empty does
    what this does for the default pool in C (csrc/arrays.c, pool_allocation) when nothing is
    to be done but the driver call (see _native_hooks.ALLOC_STEP_ASIDE)."""
    ctx = stream._ctx
    # Frees a collection inside a host function held: reuse them first (not while this thread
    # records an autograph call: they would be queued before the work it recorded).
    if _lifetimes._held and _record.current() is None:
        _lifetimes.run_held_finalizers()
    if _lifetimes.orphans:
        _lifetimes.free_orphans(ctx)
    drv, native = stream._backend.driver, stream._backend.native
    call = stream._call
    if pool is None:
        name, args = "cuMemAllocAsync", (drv.cuMemAllocAsync, nbytes, stream._handle)
        if native is not None and not in_host_function:  # (else _call refuses it)
            call, args = native.mem_alloc, (ctx, stream, nbytes)
    else:
        name = "cuMemAllocFromPoolAsync"
        args = (drv.cuMemAllocFromPoolAsync, nbytes, pool._handle, stream._handle)
    err, ptr = call(*args)
    if err and int(err) == OUT_OF_MEMORY:
        # Let the pool hand back memory whose frees are still queued. The raw call: faults
        # and host-function errors of other work are for their own synchronize to report.
        with in_context(ctx, "cuctx.empty"):
            drv.cuCtxSynchronize()
        err, ptr = call(*args)
    if err:
        hint = ""
        if int(err) == OUT_OF_MEMORY:
            # A refused request can leave the pool holding what it reserved trying (measured
            # on an H100: 1 MiB free after asking for more than the device has, and the next
            # cuCtxCreate failed): give back what no allocation uses.
            handle = (
                pool._handle
                if pool is not None
                else drv.cuDeviceGetDefaultMemPool(ctx.device._handle)[1]
            )
            if handle is not None:
                drv.cuMemPoolTrimTo(handle, 0)
            free, total = ctx.device.mem_info()
            hint = (
                f"asked for {nbytes} bytes on device {ctx.device.ordinal} (free {free} of {total})"
            )
            if pool is not None and pool.max_size is not None:
                hint += (
                    f" from {pool!r}, whose max_size {pool.max_size} the driver rounds "
                    "up to its reservation granularity"
                )
        elif int(err) == NOT_SUPPORTED and pool is not None and pool.ipc:
            hint = (
                f"{pool!r} cannot allocate inside a stream capture (the driver refuses "
                "graph memory from a pool shared between processes): allocate before "
                "the capture"
            )
        fail(stream._backend, CUresult(int(err)), name, ctx, hint)
    if _trace.sinks:
        _trace.emit("alloc", ctx, stream, (_trace.Access(int(ptr), nbytes, _trace.WRITE),))
    return Allocation(int(ptr), nbytes, stream, pool)
