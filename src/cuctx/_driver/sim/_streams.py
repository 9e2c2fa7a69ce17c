"""Streams of the sim: their handles, the default streams' rules, cuStream*, and host
functions. The engine that runs what they queue, with its virtual clock, is `_engine`.

The default streams follow CUDA's rules: the legacy default stream (handle 0 or
CU_STREAM_LEGACY) of a context waits for all earlier work of the context's blocking streams
and they wait for it; streams created with CU_STREAM_NON_BLOCKING do neither; the per-thread
default stream (CU_STREAM_PER_THREAD) is a blocking stream of its own per thread.

Host functions (cuLaunchHostFunc) run on the thread whose synchronize or query makes them
run. While one runs, the sim answers as the real driver did on an H100 (driver 580):
cuMemAlloc is CUDA_ERROR_NOT_PERMITTED, cuStreamQuery of its stream CUDA_ERROR_NOT_READY,
queuing asynchronous work succeeds (it runs after the host function). Where the driver
would wait for the host function itself (synchronizing, cuMemFree, a pageable copy), it
deadlocks or refuses; the sim refuses with CUDA_ERROR_NOT_PERMITTED. `_in_host_function()`
tells the other models; no work blocked by the running op ever runs before it returns.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import random
import threading
from collections import deque
from typing import TYPE_CHECKING

from cuda.bindings.driver import (
    CU_STREAM_LEGACY,
    CU_STREAM_PER_THREAD,
    CUcontext,
    CUdevice,
    CUstream,
    CUstream_flags,
)

from ._common import (
    CONTEXT_IS_DESTROYED,
    INVALID_HANDLE,
    INVALID_VALUE,
    NOT_PERMITTED,
    NOT_READY,
    OK,
)
from ._engine import EngineModel
from ._events import EventModel
from ._timing import CROSS_DEVICE_WAIT_NS, HOST, Engines

if TYPE_CHECKING:
    from ._engine import Op

LEGACY, PER_THREAD = int(CU_STREAM_LEGACY), int(CU_STREAM_PER_THREAD)  # handles, not flags
NON_BLOCKING = int(CUstream_flags.CU_STREAM_NON_BLOCKING)
PRIORITY_LEAST, PRIORITY_GREATEST = 0, -5  # cuCtxGetStreamPriorityRange on an H100

_HOST_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


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


class StreamModel(EngineModel, EventModel):
    """cuStream*, cuLaunchHostFunc, cuCtxGetStreamPriorityRange (the engine in
    `EngineModel`, events in `EventModel`)."""

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
        return (
            self._enqueue(hStream, self._host_call(fn, userData), label="host function", kind=HOST),
        )

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
