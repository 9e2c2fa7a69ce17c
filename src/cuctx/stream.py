"""Streams: created ones, the two default streams, adopted ones, and the current stream.

A `Stream` belongs to one context and keeps it alive. ``with stream:`` makes the stream's
context current (as ``with ctx:`` does) and makes the stream this thread's *current stream*
for its device: every copy or launch that names no stream uses `current_stream`. Outside
any such block the current stream is the device's legacy default stream, as in PyTorch and
CuPy; ``with cuctx.per_thread_stream():`` selects the per-thread default stream instead.

Host functions (`Stream.launch_host_func`) run on a driver thread. They never raise into
it: an exception is kept and raised as `HostFunctionError` by the next `Stream.synchronize`
of that stream (or `raise_host_func_errors` for a whole context). A cuctx call made inside
one raises `NotPermittedError` (CUDA forbids it; the driver notices only sometimes): while
a host function runs, its thread's state is swapped for `_driver.HostFunctionState`.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from cuda.bindings.driver import CUstream, CUstream_flags

from . import _driver, _lifetimes, _record, _trace
from ._calls import fail, refuse_in_host_function, refuse_legacy_in_global_capture
from ._driver import LEGACY, PER_THREAD, _handle_of, _stack, in_host_function
from ._lifetimes import _destroy_stream
from ._lifetimes import raise_host_func_errors  # noqa: F401 - documented as cuctx.stream's
from ._resource import ACTIVE, Resource, upper
from .context import Context, _object_for, context_for, current_device, exit_block, in_context
from .device import Device
from .errors import NOT_READY, HostFunctionError
from .event import Event, _check_recordable

_NON_BLOCKING = int(CUstream_flags.CU_STREAM_NON_BLOCKING)


# -- the stream object --------------------------------------------------------------------


class Stream(Resource):
    """A CUDA stream. ``Stream(device=None, priority=None, non_blocking=True)`` creates one
    in the current context (with ``device``: the current context when it is on that device,
    else the device's primary context). ``priority`` follows CUDA: lower is more urgent, 0 is
    the default, and the valid range is the context's (0 to -5 on an H100); values outside
    it raise instead of being clamped. ``non_blocking=True`` (the default, as PyTorch and
    CuPy streams are) means no implicit synchronization with the legacy default stream.
    """

    __slots__ = (
        "kind",
        "_priority",
        "_sync_event",
        "_finalizer",
        "_record",
        "_wait",
        "_sync",
        "_checked",
        "__weakref__",
    )

    def __init__(
        self,
        device: Device | int | None = None,
        priority: int | None = None,
        non_blocking: bool = True,
    ) -> None:
        ctx = context_for(device)
        if priority is not None and (isinstance(priority, bool) or not isinstance(priority, int)):
            raise TypeError(f"priority must be an int or None, not {type(priority).__name__}")
        backend = ctx._backend
        drv = backend.driver
        with in_context(ctx, "Stream"):
            if priority is None:
                priority = 0
            else:
                err, least, greatest = drv.cuCtxGetStreamPriorityRange()
                if err:
                    fail(backend, err, "cuCtxGetStreamPriorityRange", ctx)
                if not greatest <= priority <= least:
                    raise ValueError(
                        f"stream priority {priority} is outside the range of {ctx.device!r}: "
                        f"{least} (lowest, the default) to {greatest} (highest); lower numbers "
                        "are more urgent"
                    )
            flags = _NON_BLOCKING if non_blocking else 0
            err, handle = drv.cuStreamCreateWithPriority(flags, priority)
        if err:
            fail(backend, err, "cuStreamCreateWithPriority", ctx)
        self._setup(ctx, handle, "created", priority)
        self._finalizer = _lifetimes.finalize(self, _destroy_stream, drv, handle, ctx)

    def _setup(self, ctx: Context, handle, kind: str, priority: int | None) -> None:
        drv = ctx._backend.driver
        self._backend = ctx._backend
        self._ctx = ctx
        self._handle = handle
        self._key = int(handle)
        self.kind = kind
        self._priority = priority
        self._sync_event = None
        self._checked = None  # the race checker's actor for it (one look per operation)
        self._finalizer = None
        self._record = self._bind(drv.cuEventRecord)
        self._wait = self._bind(drv.cuStreamWaitEvent)
        self._sync = self._bind(drv.cuStreamSynchronize)

    @classmethod
    def _adopt(cls, ctx: Context, handle, kind: str) -> Stream:
        stream = object.__new__(cls)
        stream._setup(ctx, handle, kind, None)
        return stream

    @classmethod
    def wrap(cls, obj: Any) -> Stream:
        """A `Stream` for another library's stream, without owning it: anything with
        ``__cuda_stream__`` (PyTorch, CuPy, cuda.core, Numba streams), a ``CUstream`` or a
        raw handle. The other library must keep its stream alive while this one is used.
        Handles 0/1 (legacy) and 2 (per-thread) mean the current context's default stream."""
        return obj if isinstance(obj, Stream) else _adopt_any(obj, None)

    # -- properties -----------------------------------------------------------------------

    @property
    def context(self) -> Context:
        return self._ctx

    @property
    def device(self) -> Device:
        return self._ctx.device

    @property
    def handle(self) -> int:
        """The CUstream as an integer (1 for the legacy default stream, 2 for the per-thread
        one)."""
        return self._key

    @property
    def priority(self) -> int:
        if self._priority is None:
            self._check("Stream.priority")
            err, value = self._call(self._backend.driver.cuStreamGetPriority, self._handle)
            if err:
                fail(self._backend, err, "cuStreamGetPriority", self._ctx)
            self._priority = int(value)
        return self._priority

    def __cuda_stream__(self) -> tuple[int, int]:
        """The CUDA stream protocol (cuda.core): (version 0, handle)."""
        return (0, self._key)

    # -- work -----------------------------------------------------------------------------

    def _bind(self, fn):
        """``fn`` (a driver function taking this stream), for the hot paths. The default
        streams' handles mean "the current context's", so for them the call runs with
        this stream's context current."""
        if self._key not in (0, LEGACY, PER_THREAD):
            return fn
        return functools.partial(self._in_context, fn)

    def _in_context(self, fn, *args):
        if int(self._backend.driver.cuCtxGetCurrent()[1]) == self._ctx._key:
            return fn(*args)
        with in_context(self._ctx, "Stream"):
            return fn(*args)

    def _call(self, fn, *args):
        """Call a driver function that takes this stream with the stream's context current
        (copies, memsets, allocations, ...): the driver checks a copy's memory against the
        current context (docs/streams.md). One cuCtxGetCurrent, in C where it is built."""
        if in_host_function:
            refuse_in_host_function(getattr(fn, "__name__", "a driver call"))
        native = self._backend.native
        if native is not None and self._ctx._state is ACTIVE:
            return native.call_in(self._ctx, fn, *args)
        return self._in_context(fn, *args)

    def record(self, event: Event | None = None) -> Event:
        """Record ``event`` (a new event without timing when None) on this stream; return
        it. The event must belong to this stream's context."""
        ctx = self._ctx
        if ctx._state is not ACTIVE:
            raise ctx._unusable("Stream.record")
        if in_host_function:  # an empty set but while a host function runs somewhere
            refuse_in_host_function("Stream.record")
        if event is None:
            event = Event._create(ctx, timing=False)
        elif event.__class__ is not Event or event._ctx is not ctx:
            _check_recordable(self, event)  # subclasses of Event pass; anything else raises
        if _record.threads and _record.enqueue(self, _record.RECORD, event):
            event._recorded = True  # (an autograph call recorded it)
            return event
        if _lifetimes.capturing:
            refuse_legacy_in_global_capture(self, "Stream.record")
        (err,) = self._record(event._handle, self._handle)
        if err:
            fail(self._backend, err, "cuEventRecord", ctx)
        event._recorded = True
        if _trace.sinks:
            _trace.emit("record", ctx, self, event=event)
        return event

    def wait(self, other: Event | Stream) -> None:
        """Make work queued on this stream after this call wait for ``other``: an event (its
        latest record) or a stream (everything queued on it so far). Either may belong to
        another context or device: cross-device waits are legal in CUDA."""
        ctx = self._ctx
        if ctx._state is not ACTIVE:
            raise ctx._unusable("Stream.wait")
        if in_host_function:
            refuse_in_host_function("Stream.wait")
        if other.__class__ is not Event:  # a stream, a subclass, or the error
            if isinstance(other, Stream):
                return self._wait_stream(other)
            if not isinstance(other, Event):
                raise TypeError(
                    f"Stream.wait takes an Event or a Stream, not "
                    f"{type(other).__name__}; adopt another library's stream with "
                    "cuctx.Stream.wrap(obj)"
                )
            other._check_waitable("Stream.wait", self._backend)
        elif (
            not other._recorded
            or other._ctx._state is not ACTIVE
            or other._backend is not self._backend
        ):
            other._check_waitable("Stream.wait", self._backend)  # raises the reason
        if _record.threads and _record.enqueue(self, _record.WAIT, other):
            return  # an autograph call recorded it
        if _lifetimes.capturing:
            refuse_legacy_in_global_capture(self, "Stream.wait")
        (err,) = self._wait(self._handle, other._handle, 0)
        if err:
            fail(self._backend, err, "cuStreamWaitEvent", ctx)
        if _trace.sinks:
            _trace.emit("wait_event", ctx, self, event=other)

    def _wait_stream(self, other: Stream) -> None:
        if other._backend is not self._backend:
            raise ValueError(f"{other!r} is of another backend than {self!r}")
        if other is self:
            return
        other_ctx = other._ctx
        if other_ctx._state is not ACTIVE:
            raise other_ctx._unusable("Stream.wait")
        if _record.threads and _record.enqueue(self, _record.WAIT, other):
            return
        if _lifetimes.capturing:
            refuse_legacy_in_global_capture(self, "Stream.wait")
        event = other._sync_event
        if event is None:
            event = other._sync_event = Event._create(other_ctx, timing=False)
        # Threads may share this event without a lock: a record by another thread between
        # ours and the wait only widens what the wait covers, which is still correct.
        (err,) = other._record(event._handle, other._handle)
        if err:
            fail(self._backend, err, "cuEventRecord", other_ctx)
        (err,) = self._wait(self._handle, event._handle, 0)
        if err:
            fail(self._backend, err, "cuStreamWaitEvent", self._ctx)
        if _trace.sinks:
            _trace.emit("wait_stream", self._ctx, self, other=other)

    def synchronize(self) -> None:
        """Wait until all work queued on this stream is done. Raises the fault of a failed
        kernel, and `HostFunctionError` when a host function launched on it raised."""
        ctx = self._ctx
        if ctx._state is not ACTIVE:
            raise ctx._unusable("Stream.synchronize")
        refuse_in_host_function("Stream.synchronize")
        if _record.threads:  # an autograph call enqueues what it recorded, and stops
            _record.interrupt("Stream.synchronize")
        if _lifetimes.capturing:
            _lifetimes.refuse_in_capture("Stream.synchronize", stream=self)
        held = _lifetimes.marks(ctx._key, self._key) if _lifetimes._queues else None
        if _trace.sinks:  # before the wait: what other threads queue meanwhile is not seen
            _trace.emit("sync_stream", ctx, self)
        (err,) = self._sync(self._handle)
        if err:
            fail(self._backend, err, "cuStreamSynchronize", ctx)
        if held is not None:
            _lifetimes.idle(held)
        if _lifetimes._failures:
            failures = _lifetimes.take_failures(lambda k: k == (ctx._key, self._key))
            if failures:
                raise HostFunctionError(repr(self), failures) from failures[0][1]

    @property
    def done(self) -> bool:
        """True when all work queued on this stream has finished (cuStreamQuery)."""
        self._check("Stream.done")
        if _record.threads:
            _record.interrupt("Stream.done")
        if _lifetimes.capturing:
            _lifetimes.refuse_in_capture("Stream.done", stream=self)
        held = _lifetimes.marks(self._ctx._key, self._key) if _lifetimes._queues else None
        (err,) = self._call(self._backend.driver.cuStreamQuery, self._handle)
        if err and int(err) != NOT_READY:
            fail(self._backend, err, "cuStreamQuery", self._ctx)
        if not err:  # the host saw the work finish, as a synchronize does
            if _trace.sinks:
                _trace.emit("sync_stream", self._ctx, self, query=True)
            if held is not None:
                _lifetimes.idle(held)
        return not err

    @property
    def is_capturing(self) -> bool:
        """True while this stream is captured into a graph, by `capture` or another library."""
        self._check("Stream.is_capturing")
        err, status = (
            (0, 0)
            if self._key in (0, LEGACY)
            else self._call(  # legacy: never
                self._backend.driver.cuStreamIsCapturing, self._handle
            )
        )  # (driver: "implicit")
        if err:
            fail(self._backend, err, "cuStreamIsCapturing", self._ctx)
        return bool(status)  # NONE is 0; ACTIVE, and INVALIDATED until the capture ends

    def launch_host_func(self, fn: Callable[..., Any], *args: Any) -> None:
        """Call ``fn(*args)`` on the host once the work queued before it is done; work
        queued after it waits for it. ``fn`` must not call CUDA. If it raises, the
        exception is raised (as `HostFunctionError`) by the next `synchronize` of this
        stream; ``fn`` and ``args`` are kept alive until it ran."""
        if not callable(fn):
            raise TypeError(f"launch_host_func needs a callable, not {type(fn).__name__}")
        self._check("Stream.launch_host_func")
        if _record.threads and _record.enqueue(self, _record.HOST, fn, args):
            return
        if _lifetimes.capturing:
            refuse_legacy_in_global_capture(self, "Stream.launch_host_func")
        owner = _lifetimes.queue(self._ctx, self._key)
        if owner.capturing:  # a host node: it runs on every launch of the graph
            err = owner.capturing.host_function(self, fn, args)
        else:
            key = owner.add_host_function(fn, args, self._backend.sim is None)
            (err,) = self._call(
                self._backend.driver.cuLaunchHostFunc, self._handle, _lifetimes.TRAMPOLINE_FN, key
            )
            if err:
                _lifetimes.drop_host_function(key)
        if err:
            fail(self._backend, err, "cuLaunchHostFunc", self._ctx)
        if _trace.sinks:
            _trace.emit("host_func", self._ctx, self, fn=fn)

    def capture(self, mode: str = "thread_local") -> Any:
        """``with stream.capture(mode) as graph:`` records the block's work on this stream (its
        current stream) and the streams that join it into a `Graph`; see docs/graphs.md."""
        return upper.capture(self, mode)  # graphs/_capture.py, above this module

    def _hold(self, obj: Any) -> None:
        """Keep ``obj`` (a host array an asynchronous copy uses) until the work queued on
        this stream so far is done."""
        _lifetimes.queue(self._ctx, self._key).keep(obj, self._idle)

    def _idle(self) -> bool:
        return self._call(self._backend.driver.cuStreamQuery, self._handle)[0] == 0

    # -- the current stream -----------------------------------------------------------

    def __enter__(self) -> Stream:
        ctx = self._ctx
        ctx.__enter__()
        _stack(self._backend, ctx.device).append(self)
        return self

    def __exit__(self, *exc_info) -> None:
        _stack(self._backend, self._ctx.device).pop()
        exit_block(self._backend)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Stream):
            return NotImplemented
        return self._ctx is other._ctx and self._key == other._key

    def __hash__(self) -> int:
        return hash((self._ctx._key, self._key))

    def __repr__(self) -> str:
        ctx = self._ctx
        where = f"device {ctx._device.ordinal} " if ctx._device is not None else ""
        state = "" if ctx._state is ACTIVE else f" context {ctx._state}"
        return f"<Stream {self.kind} {self._key:#x} {where}ctx {ctx._key:#x}{state}>"


def _adopt_any(obj: Any, ctx: Context | None) -> Stream:
    """`Stream.wrap`: a Stream for another library's stream; handles 0/1 (legacy) and 2
    (per-thread) name the default streams of ``ctx`` (default: the current context)."""
    handle = _handle_of(obj)
    if handle in (0, LEGACY, PER_THREAD):
        return _default_stream(
            context_for() if ctx is None else ctx,
            "per-thread" if handle == PER_THREAD else "legacy",
        )
    backend = _driver.active() if ctx is None else ctx._backend
    err, ctx_handle = backend.driver.cuStreamGetCtx(CUstream(handle))
    if err:
        fail(
            backend,
            err,
            "cuStreamGetCtx",
            hint=f"{obj!r} does not name a live stream of the {backend.name} backend",
        )
    return Stream._adopt(_object_for(backend, ctx_handle), CUstream(handle), "adopted")


# -- default and current streams; the one stream rule --------------------------------------


def _default_stream(ctx: Context, kind: str) -> Stream:
    """The one `Stream` object for a default stream of ``ctx`` ("legacy" or "per-thread")."""
    stream = ctx._default_streams.get(kind)
    if stream is None:
        stream = Stream._adopt(ctx, CUstream(LEGACY if kind == "legacy" else PER_THREAD), kind)
        ctx._default_streams[kind] = stream
    return stream


def legacy_stream(device: Device | int | None = None) -> Stream:
    """The legacy default stream (CU_STREAM_LEGACY) of ``device``'s context (see `Stream`
    for which context). Work on it waits for all earlier work of the context's blocking
    streams, and they wait for it; non-blocking streams (the default) do not."""
    return _default_stream(context_for(device), "legacy")


def per_thread_stream(device: Device | int | None = None) -> Stream:
    """The calling thread's per-thread default stream (CU_STREAM_PER_THREAD) of
    ``device``'s context: each thread that uses this object gets its own stream, which
    synchronizes with the legacy default stream but not with other threads' streams."""
    return _default_stream(context_for(device), "per-thread")


def current_stream(device: Device | int | None = None) -> Stream:
    """This thread's current stream for ``device`` (default: the current context's device):
    the stream of the innermost ``with stream:`` block on that device, else the device's
    legacy default stream (as torch.cuda.current_stream and CuPy do)."""
    return resolve_stream(None, device=device)


def resolve_stream(
    stream: Stream | Any | None = None,
    ctx: Context | None = None,
    operation: str | None = None,
    *,
    device: Device | int | None = None,
) -> Stream:
    """THE rule for which stream an operation runs on, from a stream argument in any form.

    ``stream`` None: with ``ctx``, this thread's current stream when it is of ``ctx``, else
    ``ctx``'s legacy default stream; without, the current stream of ``device`` (default: the
    current device; see `current_stream`). Otherwise a Stream is taken as it is and anything
    else adopted (`Stream.wrap`: ``__cuda_stream__``, CUstream, handles; 0/1/2 name the
    default streams of ``ctx``, else of the current context). With ``operation``, a stream
    given must belong to ``ctx`` / be on ``device``, else ValueError naming the operation."""
    if stream is None:
        if ctx is not None:
            stack = _stack(ctx._backend, ctx._device)
            return stack[-1] if stack and stack[-1]._ctx is ctx else _default_stream(ctx, "legacy")
        device = current_device() if device is None else Device(device)
        stack = _stack(device._backend, device)
        return stack[-1] if stack else _default_stream(context_for(device), "legacy")
    if not isinstance(stream, Stream):
        stream = _adopt_any(stream, ctx)
    if operation is not None:
        if ctx is not None and stream._ctx is not ctx:
            raise ValueError(
                f"{operation} works in {ctx!r} but was given {stream!r} of {stream._ctx!r}; use "
                "a stream of the same context (with ctx: cuctx.Stream()), or enter the context "
                "you mean"
            )
        if device is not None and stream.device is not Device(device):
            raise ValueError(
                f"device={Device(device)!r} but stream {stream!r} is on "
                f"{stream.device!r}; pass one of them, or a stream of that device"
            )
    return stream


upper.stream = Stream
upper.resolve_stream = resolve_stream
