"""Streams and events of the sim: a lazy, really asynchronous engine with a virtual clock.

Work queued on a stream does not run when it is enqueued. It runs when something forces it:
synchronizing the stream, an event or the context, querying a stream or an event (each query
runs one more operation of the queried work, then answers), or a stream waiting on an event
whose work has not run yet. Synchronizing one stream runs only that stream and what it waits
on, so a missing ``wait`` shows up as stale data every time. Synchronizing a context interleaves its
streams: the operation that would *finish* first on the virtual clock runs first, and ties
are broken by a random generator seeded from ``CUCTX_SIM_SEED`` (default 0), so a race has
one outcome per seed.

The default streams follow CUDA's rules: the legacy default stream (handle 0 or
CU_STREAM_LEGACY) of a context waits for all earlier work of the context's blocking streams
and they wait for it; streams created with CU_STREAM_NON_BLOCKING do neither; the per-thread
default stream (CU_STREAM_PER_THREAD) is a blocking stream of its own per thread.

The virtual clock: each stream has a clock (when its last operation finished, in ns). An
operation is ready at the latest of its stream's clock, the host's clock when it was enqueued
and the end of everything it waits on, starts when its engine has room (`_timing`) and lasts
what the timing model gives it. The host's clock moves to a
stream's (or event's) time when the host synchronizes with it. Events record the time at
which their marker ran, so `cuEventElapsedTime` is exact and deterministic.

Host functions (cuLaunchHostFunc) run on the thread whose synchronize or query makes them
run. While one runs, the sim answers as the real driver did on an H100 (driver 580):
cuMemAlloc is CUDA_ERROR_NOT_PERMITTED, cuStreamQuery of its stream CUDA_ERROR_NOT_READY,
queuing asynchronous work succeeds (it runs after the host function). Where the driver
would wait for the host function itself (synchronizing, cuMemFree, a pageable copy), it
deadlocks or refuses; the sim refuses with CUDA_ERROR_NOT_PERMITTED. `_in_host_function()`
tells the other models; no work blocked by the running op ever runs before it returns.

Engine contract (used by the memory, launch and graph models):

- ``SimDriver._enqueue(hStream, op, *, nbytes=0, cost_ns=None, label="", kind=None,
  pageable=False, width=1.0) -> CUresult``:
  validate the stream (unknown/destroyed handle -> CUDA_ERROR_INVALID_HANDLE; stream of a
  destroyed or reset context -> CUDA_ERROR_CONTEXT_IS_DESTROYED; poisoned context -> its
  sticky code), and append ``op`` (a zero-argument callable returning None or a CUresult)
  to that stream's queue. Nothing runs at enqueue time. When an op returns a sticky
  CUresult, the stream's context becomes poisoned (`SimContext.sticky`) and the rest of its
  queued work is dropped; another non-success CUresult is reported by the next synchronize
  of that stream or context. ``kind`` is the activity kind (`_timing`: "kernel", "memcpy
  HtoD", ...; None for markers, which the activity feed leaves out); ``cost_ns`` defaults
  to what the timing model gives ``kind`` and ``nbytes`` (`_timing.duration`). When it
  runs, an op is placed on its device's engines (`_timing.Engines`: copy engines per
  direction, the SMs shared within a context and taken in turns between contexts), so
  its start may be later than its stream's clock.
- ``SimDriver._drain(hStream) -> CUresult`` runs everything queued on that stream (and
  whatever it waits on); the memory model calls it for pageable copies, which are
  synchronous in CUDA. It returns what a synchronize of the stream would.
- ``SimDriver._stream_context(hStream) -> (CUresult, SimContext | None)``; handles 0 (legacy
  default), CU_STREAM_LEGACY (1) and CU_STREAM_PER_THREAD (2) resolve to the current
  context's default streams.
- ``_synchronize_context(ctx)`` drains every stream of the context and
  ``_release_context_resources(ctx)`` drains them, then invalidates them (calling super()).
  StreamModel must come before the other resource models in SimDriver's bases, so queued
  work runs before the memory it uses is freed.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import random
import threading
from collections import deque

from cuda.bindings.driver import (CU_STREAM_LEGACY, CU_STREAM_PER_THREAD, CUcontext, CUdevice,
                                  CUresult, CUstream, CUstream_flags)

from ...errors import STICKY_CODES
from ._common import (CONTEXT_IS_DESTROYED, INVALID_HANDLE, INVALID_VALUE, NOT_PERMITTED,
                      NOT_READY, OK)
from ._events import EventModel
from ._timing import (CROSS_DEVICE_WAIT_NS, HOST, KERNEL, Activity, Engines, duration,
                      kernel_time)

LEGACY, PER_THREAD = int(CU_STREAM_LEGACY), int(CU_STREAM_PER_THREAD)  # handles, not flags
NON_BLOCKING = int(CUstream_flags.CU_STREAM_NON_BLOCKING)
PRIORITY_LEAST, PRIORITY_GREATEST = 0, -5  # cuCtxGetStreamPriorityRange on an H100

_HOST_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class Op:
    """One queued operation."""

    __slots__ = ("stream", "fn", "cost", "label", "deps", "submit", "done", "end", "kind",
                 "nbytes", "width", "correlation")

    def __init__(self, stream, fn, cost, label, deps, submit, kind, nbytes, width, correlation):
        self.stream = stream
        self.fn = fn
        self.cost = cost  # fixed ns, on top of what the timing model gives its kind
        self.label = label
        self.deps = deps
        self.submit = submit
        self.done = False
        self.end = 0
        self.kind = kind  # an activity kind (`_timing`), or None for markers and waits
        self.nbytes = nbytes
        self.width = width  # the share of its context's SMs a kernel's grid can fill
        self.correlation = correlation


class SimStream:
    def __init__(self, handle: int, ctx, flags: int, priority: int, kind: str):
        self.handle = handle
        self.ctx = ctx
        self.flags = flags
        self.priority = priority
        self.kind = kind  # "legacy", "per-thread" or "created"
        self.blocking = kind != "legacy" and not flags & NON_BLOCKING
        self.queue: deque[Op] = deque()
        self.last: Op | None = None  # the last op enqueued, done or not
        self.clock = 0
        self.error = None  # a non-sticky failure of an op, reported by the next synchronize
        self.running: Op | None = None  # the op executing now (a host function, a twin)
        self.destroyed = False  # cuStreamDestroy'd: the handle is gone, queued work still runs
        self.gone = False  # its context was destroyed or reset

    def __repr__(self) -> str:
        return f"<SimStream {self.kind} {self.handle:#x} queued={len(self.queue)}>"


class StreamModel(EventModel):
    """cuStream*, cuLaunchHostFunc, cuCtxGetStreamPriorityRange, and the engine (events in
    `EventModel`)."""

    def _init_streams(self):
        self._stream_handles = itertools.count(0x5717_0000_0100, 0x100)
        self._streams: dict[int, SimStream] = {}
        self._init_events()
        self._now = 0  # the host's virtual clock, ns
        self._engines = [Engines() for _ in self._devices]
        self._activity: tuple = ()  # subscribers to executed operations (`SimControls`)
        self._touched, self._declared = 0, None  # the running kernel's bytes, declared cost
        text = os.environ.get("CUCTX_SIM_SEED", "0")
        try:
            self._rng = random.Random(int(text))
        except ValueError:
            raise ValueError(f"CUCTX_SIM_SEED must be a whole number, got {text!r}") from None

    # -- finding streams ------------------------------------------------------------------

    @staticmethod
    def _ctx_streams(ctx) -> dict:
        return ctx.resources.setdefault("streams", {})

    def _default_stream(self, ctx, which: int) -> SimStream:
        streams = self._ctx_streams(ctx)
        key = "legacy" if which == LEGACY else ("per-thread", threading.get_ident())
        stream = streams.get(key)
        if stream is None:
            kind = "legacy" if which == LEGACY else "per-thread"
            stream = streams[key] = SimStream(which, ctx, 0, 0, kind)
            stream.clock = self._now
        return stream

    def _stream(self, hStream):
        """(error, SimStream) for a stream handle, checked for use."""
        handle = int(hStream or 0)
        if handle in (0, LEGACY, PER_THREAD):
            err, ctx = self._work_context()
            if err:
                return err, None
            return OK, self._default_stream(ctx, PER_THREAD if handle == PER_THREAD else LEGACY)
        stream = self._streams.get(handle)
        if stream is None or stream.destroyed:
            return INVALID_HANDLE, None
        if stream.gone or stream.ctx.destroyed:
            return CONTEXT_IS_DESTROYED, None
        if stream.ctx.sticky is not None:
            return stream.ctx.sticky, None
        return OK, stream

    def _stream_context(self, hStream):
        err, stream = self._stream(hStream)
        return (err, None) if err else (OK, stream.ctx)

    # -- the engine -----------------------------------------------------------------------

    def _enqueue(self, hStream, op, *, nbytes=0, cost_ns=None, label="", kind=None,
                 pageable=False, width=1.0):
        with self._lock:
            err, stream = self._stream(hStream)
            if err:
                return err
            cost = duration(kind, nbytes, width, pageable) if cost_ns is None else cost_ns
            self._push(stream, op, cost, label, kind=kind, nbytes=nbytes, width=width)
            return OK

    def _push(self, stream: SimStream, fn, cost: int, label: str, deps=(), *, kind=None,
              nbytes=0, width=1.0) -> Op:
        deps = [d for d in deps if not d.done]
        if stream.kind == "legacy":  # waits for the blocking streams' earlier work
            deps += [s.last for s in self._ctx_streams(stream.ctx).values()
                     if s.blocking and s.last is not None and not s.last.done]
        elif stream.blocking:  # waits for the legacy stream's earlier work
            legacy = self._ctx_streams(stream.ctx).get("legacy")
            if legacy is not None and legacy.last is not None and not legacy.last.done:
                deps.append(legacy.last)
        stack = self._tls.correlation
        op = Op(stream, fn, int(cost), label, deps, self._now, kind, nbytes, width,
                stack[-1] if stack else None)
        stream.queue.append(op)
        stream.last = op
        return op

    def _execute(self, op: Op) -> None:
        stream = op.stream
        stream.queue.popleft()
        start = max(stream.clock, op.submit, *(d.end for d in op.deps)) if op.deps \
            else max(stream.clock, op.submit)
        fn, op.fn, op.deps = op.fn, None, ()  # drop references as soon as the op ran
        stream.running = op
        kernel = op.kind == KERNEL
        if kernel:
            self._touched, self._declared = 0, None  # what the twin views, or declares
        try:
            result = fn() if fn is not None and stream.ctx.sticky is None else None
        finally:
            stream.running = None
            if kernel:
                op.nbytes = self._touched
                op.cost += kernel_time(self._touched, op.width) if self._declared is None \
                    else self._declared
            ctx = stream.ctx
            start = self._engines[ctx.device].place(op.kind, start, op.cost, ctx.handle,
                                                    ctx.sms, op.width)
            op.end = stream.clock = start + op.cost
            op.done = True
        if op.kind is not None and self._activity:
            record = Activity(op.kind, op.label, ctx.device, ctx.handle, stream.handle,
                              op.submit, start, op.end, op.correlation, op.nbytes)
            for callback in self._activity:
                callback(record)
        if result is not None and result != OK:
            if int(result) in STICKY_CODES:
                stream.ctx.sticky = CUresult(result)
                self._drop_queued(stream.ctx)
            elif stream.error is None:
                stream.error = CUresult(result)

    def _drop_queued(self, ctx) -> None:
        """After a sticky fault the GPU runs nothing more of the context."""
        for stream in self._ctx_streams(ctx).values():
            for op in stream.queue:
                op.fn, op.deps, op.done, op.end = None, (), True, stream.clock
            stream.queue.clear()

    def _complete(self, target: Op) -> bool:
        """Run ops until ``target`` has run: its stream's earlier ops and what they wait on.
        False when that needs an op that is executing now (this is work it started): the
        real device would wait for it for ever; the sim runs nothing out of order."""
        pending = [target]
        while pending:
            op = pending[-1]
            if op.done:
                pending.pop()
                continue
            if op.stream.running is not None:
                return False
            head = op.stream.queue[0]
            blocker = next((d for d in head.deps if not d.done), None)
            if blocker is not None:
                pending.append(blocker)
            else:
                self._execute(head)
        return True

    def _step(self, target: Op) -> None:
        """Run one op on the way to ``target`` (what a query does); none when the way is
        blocked by an op executing now."""
        op = target
        while True:
            if op.stream.running is not None:
                return
            head = op.stream.queue[0]
            blocker = next((d for d in head.deps if not d.done), None)
            if blocker is None:
                self._execute(head)
                return
            op = blocker

    def _drain_stream(self, stream: SimStream):
        if stream.queue:
            self._complete(stream.queue[-1])
        self._now = max(self._now, stream.clock)
        return self._report(stream)

    def _report(self, stream: SimStream):
        if stream.ctx.sticky is not None:
            return stream.ctx.sticky
        err, stream.error = stream.error, None
        return err or OK

    def _drain(self, hStream):
        with self._lock:
            err, stream = self._stream(hStream)
            if err:
                return err
            if self._in_host_function():
                return NOT_PERMITTED  # the driver deadlocks or says so; the sim says so
            return self._drain_stream(stream)

    def _drain_context(self, ctx):
        """Run all queued work of ``ctx``, interleaving its streams (see the docstring)."""
        streams = self._ctx_streams(ctx)
        while True:
            busy = [s for s in streams.values() if s.queue]
            if not busy:
                break
            self._rng.shuffle(busy)
            first = min(busy, key=lambda s: max(s.clock, s.queue[0].submit) + s.queue[0].cost)
            if not self._complete(first.queue[0]):
                break  # called from work of this context that is executing: leave the rest
        error = OK
        for key, stream in list(streams.items()):
            self._now = max(self._now, stream.clock)
            err = self._report(stream)
            error = error or err
            if stream.destroyed:
                del streams[key]
        return error

    def _in_host_function(self) -> bool:
        """Whether this thread is inside a host function the sim is running: the driver
        refuses CUDA calls there (CUDA_ERROR_NOT_PERMITTED) or deadlocks on waits."""
        return self._tls.host_functions > 0

    def _synchronize_context(self, ctx):
        if self._in_host_function():
            return NOT_PERMITTED
        with self._lock:
            err = self._drain_context(ctx)
        return err or super()._synchronize_context(ctx)

    def _release_context_resources(self, ctx):
        with self._lock:
            if ctx.sticky is None:
                self._drain_context(ctx)
            for stream in self._ctx_streams(ctx).values():
                stream.gone = True  # its handle now answers CONTEXT_IS_DESTROYED
            for event in self._events.values():
                if event.ctx is ctx:
                    event.gone = True
        super()._release_context_resources(ctx)

    # -- streams --------------------------------------------------------------------------

    def cuCtxGetStreamPriorityRange(self):
        err, _ = self._work_context()
        if err:
            return (err, None, None)
        return (OK, PRIORITY_LEAST, PRIORITY_GREATEST)

    def cuStreamCreate(self, Flags):
        return self.cuStreamCreateWithPriority(Flags, 0)

    def cuStreamCreateWithPriority(self, flags, priority):
        if int(flags) & ~NON_BLOCKING:
            return (INVALID_VALUE, None)
        err, ctx = self._work_context()
        if err:
            return (err, None)
        priority = min(PRIORITY_LEAST, max(PRIORITY_GREATEST, int(priority)))  # as the driver
        with self._lock:
            stream = SimStream(next(self._stream_handles), ctx, int(flags), priority, "created")
            stream.clock = self._now
            self._streams[stream.handle] = stream
            self._ctx_streams(ctx)[stream.handle] = stream
        return (OK, CUstream(stream.handle))

    def cuStreamDestroy(self, hStream):
        handle = int(hStream or 0)
        if handle in (0, LEGACY, PER_THREAD):
            return (INVALID_HANDLE,)
        with self._lock:
            stream = self._streams.pop(handle, None)
            if stream is None:
                return (INVALID_HANDLE,)
            if stream.gone or stream.ctx.destroyed:
                return (CONTEXT_IS_DESTROYED,)
            stream.destroyed = True  # its queued work still runs (the driver's contract)
            if not stream.queue:
                self._ctx_streams(stream.ctx).pop(handle, None)
        return (OK,)

    def _stream_query(self, hStream, read):
        err, stream = self._stream(hStream)
        return (err, None) if err else (OK, read(stream))

    def cuStreamGetPriority(self, hStream):
        return self._stream_query(hStream, lambda s: s.priority)

    def cuStreamGetCtx(self, hStream):
        return self._stream_query(hStream, lambda s: CUcontext(s.ctx.handle))

    def cuStreamGetDevice(self, hStream):
        return self._stream_query(hStream, lambda s: CUdevice(s.ctx.device))

    def cuStreamSynchronize(self, hStream):
        err = self._drain(hStream)
        if not err:
            self._device_synchronized(self._stream(hStream)[1].ctx.device)
        return (err,)

    def cuStreamQuery(self, hStream):
        with self._lock:
            err, stream = self._stream(hStream)
            if err:
                return (err,)
            if stream.queue:
                self._step(stream.queue[-1])
            if stream.queue or stream.running is not None:
                return (NOT_READY,)
            self._now = max(self._now, stream.clock)
            return (self._report(stream),)

    def cuStreamWaitEvent(self, hStream, hEvent, Flags):
        if int(Flags) not in (0, 1):
            return (INVALID_VALUE,)
        with self._lock:
            err, event, stream = self._event_and_stream(hEvent, hStream)
            if err:
                return (err,)
            if event.marker is not None and not event.marker.done:  # an empty event: no wait
                latency = CROSS_DEVICE_WAIT_NS if event.ctx.device != stream.ctx.device else 0
                self._push(stream, None, latency, "wait", [event.marker])
        return (OK,)

    def cuLaunchHostFunc(self, hStream, fn, userData):
        if not int(fn or 0):
            return (INVALID_VALUE,)  # calling it would crash the interpreter
        return (self._enqueue(hStream, self._host_call(fn, userData), label="host function",
                              kind=HOST),)

    def _host_call(self, fn, userData):
        """The operation that calls the C function pointer ``fn`` (non-null) with
        ``userData``, as the driver does (host functions and host graph nodes)."""
        call = _HOST_FN(int(fn))
        data = int(userData or 0)
        tls = self._tls

        def run():
            # Host functions run on this thread (the one that made the work run), so the
            # marker is per thread: another thread's calls are not inside this function.
            tls.host_functions += 1
            try:
                call(data)
            finally:
                tls.host_functions -= 1
        return run
