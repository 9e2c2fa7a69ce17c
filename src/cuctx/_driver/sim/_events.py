"""Events of the sim: markers in a stream's queue (see `_streams` for the engine). An event
records the virtual time at which its marker ran, so `cuEventElapsedTime` is exact."""

from __future__ import annotations

import itertools

from cuda.bindings.driver import CUevent, CUevent_flags

from ._common import (CONTEXT_IS_DESTROYED, INVALID_HANDLE, INVALID_VALUE, NOT_PERMITTED,
                      NOT_READY, OK)

EVENT_DISABLE_TIMING = int(CUevent_flags.CU_EVENT_DISABLE_TIMING)
EVENT_INTERPROCESS = int(CUevent_flags.CU_EVENT_INTERPROCESS)
_EVENT_FLAGS = (int(CUevent_flags.CU_EVENT_BLOCKING_SYNC) | EVENT_DISABLE_TIMING
                | EVENT_INTERPROCESS)


class SimEvent:
    def __init__(self, handle: int, ctx, flags: int):
        self.handle = handle
        self.ctx = ctx
        self.flags = flags
        self.marker = None  # the Op (in _streams) of the latest record
        self.gone = False  # its context was destroyed or reset


class EventModel:
    """cuEvent*; the stream model (which this is a base of) provides the engine."""

    def _init_events(self):
        self._event_handles = itertools.count(0xE7E7_0000_0100, 0x100)
        self._events: dict[int, SimEvent] = {}

    def _event(self, hEvent):
        event = self._events.get(int(hEvent or 0))
        if event is None:
            return INVALID_HANDLE, None
        if event.gone or event.ctx.destroyed:
            return CONTEXT_IS_DESTROYED, None
        return OK, event

    def cuEventCreate(self, Flags):
        flags = int(Flags)
        if flags & ~_EVENT_FLAGS or flags & EVENT_INTERPROCESS and not flags & EVENT_DISABLE_TIMING:
            return (INVALID_VALUE, None)
        err, ctx = self._work_context()
        if err:
            return (err, None)
        with self._lock:
            event = SimEvent(next(self._event_handles), ctx, flags)
            self._events[event.handle] = event
        return (OK, CUevent(event.handle))

    def cuEventDestroy(self, hEvent):
        with self._lock:
            event = self._events.pop(int(hEvent or 0), None)
        if event is None:
            return (INVALID_HANDLE,)
        return (CONTEXT_IS_DESTROYED,) if event.gone or event.ctx.destroyed else (OK,)

    def _event_and_stream(self, hEvent, hStream):
        """(OK, event, stream), or the error of the first handle that is not valid."""
        err, event = self._event(hEvent)
        if err:
            return err, None, None
        err, stream = self._stream(hStream)
        return (err, None, None) if err else (OK, event, stream)

    def cuEventRecord(self, hEvent, hStream):
        with self._lock:
            err, event, stream = self._event_and_stream(hEvent, hStream)
            if err:
                return (err,)
            if stream.ctx is not event.ctx:
                return (INVALID_HANDLE,)  # "must be from the same context"
            event.marker = self._push(stream, None, 0, "event", [])
        return (OK,)

    def cuEventQuery(self, hEvent):
        with self._lock:
            err, event = self._event(hEvent)
            if err:
                return (err,)
            marker = event.marker
            if marker is None:
                return (OK,)
            if not marker.done:
                self._step(marker)
            if not marker.done:
                return (NOT_READY,)
            self._now = max(self._now, marker.end)
            return (OK,)

    def cuEventSynchronize(self, hEvent):
        with self._lock:
            err, event = self._event(hEvent)
            if err:
                return (err,)
            if self._in_host_function():
                return (NOT_PERMITTED,)
            marker = event.marker
            if marker is not None:
                self._complete(marker)
                self._now = max(self._now, marker.end)
            if event.ctx.sticky is not None:
                return (event.ctx.sticky,)
            self._device_synchronized(event.ctx.device)
        return (OK,)

    def cuEventElapsedTime(self, hStart, hEnd):
        with self._lock:
            events = []
            for handle in (hStart, hEnd):
                err, event = self._event(handle)
                if err:
                    return (err, None)
                events.append(event)
            if any(e.flags & EVENT_DISABLE_TIMING or e.marker is None for e in events):
                return (INVALID_HANDLE, None)
            if not all(e.marker.done for e in events):
                return (NOT_READY, None)
            start, end = events
            return (OK, (end.marker.end - start.marker.end) / 1e6)
