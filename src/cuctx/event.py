"""Events: markers recorded on a stream, for waits across streams and devices and for
timing.

An event belongs to the context it was created in and can only be recorded on streams of
that context (the driver's rule); any stream of any device may wait on it. An event that
was never recorded stands for no work: `done` is True, but `synchronize`, `Stream.wait` and
`elapsed_ms` raise, because using one is almost always a missing `record`.

An ``ipc=True`` event is shared with other processes of this machine by pickling it
(cuIpcGetEventHandle): the other process opens it (cuIpcOpenEventHandle, once per process)
and records it or waits on it, so work is ordered across processes without a synchronize.
Another process may record it, so cuctx never refuses it as never recorded.
"""

from __future__ import annotations

import ctypes
import weakref
from typing import TYPE_CHECKING, NamedTuple

from cuda.bindings.driver import CUevent_flags, CUipcEventHandle

from ._lifetimes import finalize
from . import _driver, _lifetimes, _record, _trace
from ._resource import Resource, upper
from ._calls import call, fail, refuse_in_host_function
from .context import ACTIVE, DESTROYED, Context, context_for, in_context
from .device import Device
from .errors import NOT_READY

if TYPE_CHECKING:
    from .stream import Stream

_DISABLE_TIMING = int(CUevent_flags.CU_EVENT_DISABLE_TIMING)
_BLOCKING_SYNC = int(CUevent_flags.CU_EVENT_BLOCKING_SYNC)
_INTERPROCESS = int(CUevent_flags.CU_EVENT_INTERPROCESS)


class EventRef(NamedTuple):
    """An ipc event, pickled: the GPU it is of and the driver's handle of it."""

    backend: str
    device: str  # the GPU's UUID (its ordinal may differ in another process)
    ordinal: int  # in the process that pickled it, for messages
    handle: bytes  # CUipcEventHandle's 64 bytes


class Event(Resource):
    """A CUDA event in the current context.

    ``timing=True`` lets it measure time (`elapsed_ms`, ``end - start``); without it,
    recording and waiting are cheaper. ``blocking=True`` makes `synchronize` sleep instead
    of spinning. ``ipc=True`` makes an event other processes of this machine can record and
    wait on: pickle it to them (it cannot measure time: a CUDA rule).
    """

    __slots__ = ("timing", "ipc", "_recorded", "_ipc_handle", "_finalizer", "__weakref__")

    def __init__(self, timing: bool = False, blocking: bool = False, ipc: bool = False) -> None:
        if timing and ipc:
            raise ValueError(
                "an ipc event cannot measure time: CUDA requires events shared "
                "between processes to be created with timing=False"
            )
        flags = (
            (0 if timing else _DISABLE_TIMING)
            | (_BLOCKING_SYNC if blocking else 0)
            | (_INTERPROCESS if ipc else 0)
        )
        self._setup(context_for(), flags)

    @classmethod
    def _create(cls, ctx: Context, timing: bool) -> Event:
        event = object.__new__(cls)
        event._setup(ctx, 0 if timing else _DISABLE_TIMING)
        return event

    def _setup(self, ctx: Context, flags: int, handle=None) -> None:
        """Make the event (cuEventCreate), or adopt ``handle`` (an opened ipc event)."""
        backend = ctx._backend
        drv = backend.driver
        if handle is None:
            with in_context(ctx, "Event"):
                err, handle = drv.cuEventCreate(flags)
            if err:
                fail(backend, err, "cuEventCreate", ctx)
        self._backend = backend
        self._ctx = ctx
        self._handle = handle
        self._key = int(handle)
        self.timing = not flags & _DISABLE_TIMING
        self.ipc = bool(flags & _INTERPROCESS)
        self._recorded = self.ipc  # another process may have recorded it
        self._ipc_handle = None
        self._finalizer = finalize(self, _destroy_event, drv, handle, ctx)

    @property
    def context(self) -> Context:
        return self._ctx

    @property
    def device(self):
        return self._ctx.device

    @property
    def handle(self) -> int:
        """The CUevent as an integer, for other libraries."""
        return self._key

    @property
    def recorded(self) -> bool:
        """Whether `record` was called at least once."""
        return self._recorded

    def record(self, stream=None) -> Event:
        """Record this event on ``stream``, which must belong to this event's context
        (default: the current stream when it is of that context, else the context's legacy
        default stream). Returns the event."""
        if self._ctx._state is not ACTIVE:
            raise self._ctx._unusable("Event.record")
        if stream is None:  # stream.py, above this module, installed the rule and the class
            stream = upper.resolve_stream(None, self._ctx)
        elif not isinstance(stream, upper.stream):
            raise TypeError(
                f"Event.record takes a cuctx.Stream or None, not "
                f"{type(stream).__name__}; adopt another library's stream with "
                "cuctx.Stream.wrap(obj)"
            )
        return stream.record(self)

    def _check_waitable(self, operation: str, backend: _driver.Backend) -> None:
        if self._backend is not backend:
            raise ValueError(f"{operation}: {self!r} is of another backend")
        if self._ctx._state is not ACTIVE:
            raise self._ctx._unusable(operation)
        if not self._recorded:
            raise ValueError(
                f"{operation}: {self!r} was never recorded, so there is nothing "
                "to wait for; call event.record(stream) (or stream.record()) "
                "first"
            )

    def synchronize(self) -> None:
        """Wait on the host until the work captured by the latest record is done."""
        self._check_waitable("Event.synchronize", self._backend)
        refuse_in_host_function("Event.synchronize")
        if _record.threads:  # an autograph call enqueues what it recorded, and stops
            _record.interrupt("Event.synchronize")
        if _lifetimes.capturing:
            _lifetimes.refuse_in_capture("Event.synchronize", event=self)
        if _trace.sinks:  # before the wait: a record another thread makes meanwhile is not seen
            _trace.emit("sync_event", self._ctx, None, event=self)
        (err,) = self._backend.driver.cuEventSynchronize(self._handle)
        if err:
            fail(self._backend, err, "cuEventSynchronize", self._ctx)

    @property
    def done(self) -> bool:
        """True when the work captured by the latest record is done (cuEventQuery); an event
        never recorded is done."""
        if self._ctx._state is not ACTIVE:
            raise self._ctx._unusable("Event.done")
        refuse_in_host_function("Event.done")
        if _record.threads:
            _record.interrupt("Event.done")
        if _lifetimes.capturing:
            _lifetimes.refuse_in_capture("Event.done", event=self)
        (err,) = self._backend.driver.cuEventQuery(self._handle)
        if err and int(err) != NOT_READY:
            fail(self._backend, err, "cuEventQuery", self._ctx)
        if not err and _trace.sinks:  # the host saw the work finish, as a synchronize does
            _trace.emit("sync_event", self._ctx, None, event=self, query=True)
        return not err

    def elapsed_ms(self, end: Event) -> float:
        """Milliseconds from this event to ``end``; both must be timing events, recorded,
        and of one device (two devices have no common clock). Waits for both first."""
        if not isinstance(end, Event):
            raise TypeError(f"elapsed_ms needs an end Event, not {type(end).__name__}")
        for event, role in ((self, "start"), (end, "end")):
            if not event.timing:
                raise ValueError(
                    f"the {role} event {event!r} does not measure time; create "
                    "timing events with cuctx.Event(timing=True)"
                )
            event._check_waitable("Event.elapsed_ms", self._backend)
        if end._ctx._device is not self._ctx._device:
            raise ValueError(
                f"elapsed_ms between events of two devices ({self._ctx._device!r} and "
                f"{end._ctx._device!r}): their clocks are not comparable, so CUDA gives no "
                "meaningful answer; time each device's work with two events of that device"
            )
        self.synchronize()
        end.synchronize()
        err, ms = self._backend.driver.cuEventElapsedTime(self._handle, end._handle)
        if err:
            fail(self._backend, err, "cuEventElapsedTime", self._ctx)
        return float(ms)

    def __sub__(self, start: Event) -> float:
        """``end - start``: the milliseconds between them, as `elapsed_ms`."""
        if not isinstance(start, Event):
            return NotImplemented
        return start.elapsed_ms(self)

    # -- between processes ----------------------------------------------------------------

    def __reduce__(self):
        """An ipc event pickles for another process of this machine (opened there once per
        process; in this process it is this event); any other refuses with a TypeError."""
        if not self.ipc:
            raise TypeError(
                f"cannot pickle {self!r}: only an event created with "
                "cuctx.Event(ipc=True) can be used by another process"
            )
        self._check("Event (pickled)")
        if self._ipc_handle is None:
            handle = call(self._backend, "cuIpcGetEventHandle", self._handle)
            self._ipc_handle = ctypes.string_at(handle.getPtr(), _IPC_HANDLE_SIZE)
            _made[self._ipc_handle] = self
        device = self._ctx.device
        return _event_from_pickle, (
            EventRef(self._backend.name, device.uuid, device.ordinal, self._ipc_handle),
        )

    def __repr__(self) -> str:
        kind = "ipc" if self.ipc else "timing" if self.timing else "sync"
        state = "recorded" if self._recorded else "never recorded"
        if self._ctx._state is not ACTIVE:
            state += f", context {self._ctx._state}"
        return f"<Event {kind} {self._key:#x} {state} ctx {self._ctx._key:#x}>"


def _check_recordable(stream: Stream, event: object) -> None:
    """Raise unless ``event`` (not exactly an Event of the stream's context) is an instance
    of a subclass of Event of that context."""
    if not isinstance(event, Event):
        raise TypeError(f"Stream.record takes an Event or None, not {type(event).__name__}")
    if event._backend is not stream._backend:
        raise ValueError(f"Stream.record: {event!r} is of another backend than {stream!r}")
    if event._ctx._state is not ACTIVE:
        raise event._ctx._unusable("Stream.record")
    if event._ctx is stream._ctx:
        return
    raise ValueError(
        f"cannot record {event!r} on {stream!r}: the event belongs to {event._ctx!r} and the "
        "stream to another context; create the event in the stream's context "
        "(`with stream.context: Event()`) or let stream.record() make one"
    )


def _destroy_event(drv, handle, ctx: Context) -> None:
    if ctx._state != DESTROYED:  # the driver freed it with the context, and must not see it
        drv.cuEventDestroy(handle)


_IPC_HANDLE_SIZE = 64  # CUipcEventHandle: opaque bytes; cuda.bindings exposes only its address
_made: weakref.WeakValueDictionary = weakref.WeakValueDictionary()  # handle -> ipc event here
_opened: weakref.WeakValueDictionary = weakref.WeakValueDictionary()  # (backend, handle)


def _event_from_pickle(ref: EventRef) -> Event:
    """The ipc event ``ref`` names, in this process: the original where it was made, else the
    one opened here (cuIpcOpenEventHandle, in the primary context of its GPU), opened once."""
    backend = _driver.active()
    if backend.name != ref.backend:
        raise ValueError(
            f"an ipc event of the {ref.backend} backend cannot be unpickled in a "
            f"process running the {backend.name} backend: select {ref.backend} "
            f"first (CUCTX_BACKEND={ref.backend}, or cuctx.set_backend)"
        )
    event = _made.get(ref.handle)
    if event is not None and event._backend is backend:
        return event
    event = _opened.get((backend, ref.handle))
    if event is not None:
        return event
    device = Device._with_uuid(ref.device, f"the ipc event of device {ref.ordinal}")
    ctx = context_for(device, primary=True)
    handle = CUipcEventHandle()
    ctypes.memmove(handle.getPtr(), ref.handle, _IPC_HANDLE_SIZE)
    with in_context(ctx, "Event (unpickled)"):
        err, opened = backend.driver.cuIpcOpenEventHandle(handle)
    if err:
        fail(
            backend,
            err,
            "cuIpcOpenEventHandle",
            ctx,
            "the process that made the event may have destroyed it",
        )
    event = object.__new__(Event)
    event._setup(ctx, _DISABLE_TIMING | _INTERPROCESS, opened)
    event._ipc_handle = ref.handle
    _opened[(backend, ref.handle)] = event
    return event
