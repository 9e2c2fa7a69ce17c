"""Events of the sim: markers in a stream's queue (see `_engine` for the engine). An event
records the virtual time at which its marker ran, so `cuEventElapsedTime` is exact.

Events shared between processes (CU_EVENT_INTERPROCESS; cuIpcGetEventHandle and
cuIpcOpenEventHandle): the sim runs a process's queued work only when that process waits
for it, and another process cannot make it wait. So recording an interprocess event (the
original or an opened one) runs the stream's work up to the record at once, as
cuEventSynchronize would: another process that waits on the event then finds the work done,
and a wait on it is never left pending across processes (on a GPU the work runs by itself).
The handle is 64 bytes naming the exporting process and its event; opening it makes an
event of the current context that behaves like a local one created with
CU_EVENT_DISABLE_TIMING, as the CUDA documentation says. The sim's choices, not measured on
a GPU: a handle of an event without CU_EVENT_INTERPROCESS is CUDA_ERROR_INVALID_VALUE, one
that is no sim event handle CUDA_ERROR_INVALID_VALUE, and opening a handle in the process
that exported it CUDA_ERROR_INVALID_CONTEXT (HIP's documented answer).
"""

from __future__ import annotations

import ctypes
import itertools
import os
import secrets
import struct

from cuda.bindings.driver import CUevent, CUevent_flags, CUipcEventHandle

from ._common import (
    CONTEXT_IS_DESTROYED,
    INVALID_CONTEXT,
    INVALID_HANDLE,
    INVALID_VALUE,
    NOT_PERMITTED,
    NOT_READY,
    OK,
)

EVENT_DISABLE_TIMING = int(CUevent_flags.CU_EVENT_DISABLE_TIMING)
EVENT_INTERPROCESS = int(CUevent_flags.CU_EVENT_INTERPROCESS)
_EVENT_FLAGS = int(CUevent_flags.CU_EVENT_BLOCKING_SYNC) | EVENT_DISABLE_TIMING | EVENT_INTERPROCESS
_IPC_HANDLE = struct.Struct("<8sqQ16s")  # magic, exporting pid, its event, a nonce (64 padded)
_MAGIC = b"cuctxevt"


class SimEvent:
    def __init__(self, handle: int, ctx, flags: int):
        self.handle = handle
        self.ctx = ctx
        self.flags = flags
        self.marker = None  # the Op (`_engine`) of the latest record
        self.gone = False  # its context was destroyed or reset
        self.ipc_handle = None  # its 64 bytes, once exported (cuIpcGetEventHandle)


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
            if event.flags & EVENT_INTERPROCESS and not self._in_host_function():
                self._complete(event.marker)  # another process may wait for it (see above)
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

    # -- between processes ------------------------------------------------------------------

    def cuIpcGetEventHandle(self, event):
        with self._lock:
            err, found = self._event(event)
            if err:
                return (err, None)
            if not found.flags & EVENT_INTERPROCESS:
                return (INVALID_VALUE, None)
            if found.ipc_handle is None:
                found.ipc_handle = _IPC_HANDLE.pack(
                    _MAGIC, os.getpid(), found.handle, secrets.token_bytes(16)
                )
        handle = CUipcEventHandle()
        ctypes.memmove(handle.getPtr(), found.ipc_handle, _IPC_HANDLE.size)
        return (OK, handle)

    def cuIpcOpenEventHandle(self, handle):
        if not isinstance(handle, CUipcEventHandle):
            raise TypeError(
                "Argument 'handle' has incorrect type (expected "
                "cuda.bindings.driver.CUipcEventHandle, got "
                f"{type(handle).__name__})"
            )
        magic, pid, _, _ = _IPC_HANDLE.unpack(ctypes.string_at(handle.getPtr(), _IPC_HANDLE.size))
        if magic != _MAGIC:
            return (INVALID_VALUE, None)
        if pid == os.getpid():
            return (INVALID_CONTEXT, None)
        err, ctx = self._work_context()
        if err:
            return (err, None)
        with self._lock:
            event = SimEvent(
                next(self._event_handles), ctx, EVENT_DISABLE_TIMING | EVENT_INTERPROCESS
            )
            self._events[event.handle] = event
        return (OK, CUevent(event.handle))
