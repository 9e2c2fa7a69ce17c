"""Stream capture in the sim: cuStreamBeginCapture, cuStreamEndCapture, cuStreamIsCapturing,
cuStreamGetCaptureInfo, cuThreadExchangeStreamCaptureMode, and the calls a capture refuses.

A capture sequence (`Capture`) owns a graph and, for each stream taking part, its
*frontier*: the nodes the next work on that stream depends on. Work enqueued on a capturing
stream becomes a node after its stream's frontier (`_capture_ops`). An event recorded on a
capturing stream remembers that stream's frontier; a stream that waits on it joins the
capture (its frontier becomes the event's), a capturing stream that waits on it adds the
event's nodes to its frontier. At cuStreamEndCapture every stream that joined must have
been joined back: its frontier must lie in what the origin stream's frontier depends on.

The refusals follow the CUDA programming guide's rules, with the driver's codes, as an H100
(driver 580) answers them: a synchronize or query of a capturing stream, cuCtxSynchronize
while a stream of the context captures (in every mode), and any "potentially unsafe" call
(cuMemAlloc, cuMemFree, cuStreamSynchronize of a stream not capturing, cuGraphInstantiate
in `_capture_ops`) while the calling thread is prohibited from them (its mode,
`cuThreadExchangeStreamCaptureMode`, against the captures in progress: RELAXED allows them)
are CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED; the synchronous copies are not refused (they run
at once, on the legacy stream); work on the legacy stream while a blocking stream of its
context captures is CUDA_ERROR_STREAM_CAPTURE_IMPLICIT; a query or synchronize of an event
recorded in a capture is CUDA_ERROR_CAPTURED_EVENT; waiting on an event recorded outside the
capture is CUDA_ERROR_STREAM_CAPTURE_ISOLATION, on one of another capture
CUDA_ERROR_STREAM_CAPTURE_MERGE. Each refusal invalidates the capture it
concerns: its streams then answer CUDA_ERROR_STREAM_CAPTURE_INVALIDATED until
cuStreamEndCapture, which returns that code and no graph and takes the streams out of
capture, usable again. cuStreamEndCapture on a stream that joined (not the origin) is
CUDA_ERROR_STREAM_CAPTURE_UNMATCHED, from another thread than the one that began a non-relaxed
capture CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD (the capture ends without a graph: its
thread's cuStreamEndCapture then finds the stream not capturing, H100), with a stream not
joined back CUDA_ERROR_STREAM_CAPTURE_UNJOINED (the capture ends without a graph). Beginning
a capture on the legacy stream is CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, on a capturing stream
and ending one on a stream not capturing CUDA_ERROR_ILLEGAL_STATE.
"""

from __future__ import annotations

import itertools
import threading

from cuda.bindings.driver import (
    CUgraph,
    CUgraphEdgeData,
    CUgraphNode,
    CUstreamCaptureMode,
    CUstreamCaptureStatus,
    CUstreamUpdateCaptureDependencies_flags,
    cuuint64_t,
)

from ._common import (
    CAPTURE_IMPLICIT,
    CAPTURE_INVALIDATED,
    CAPTURE_UNJOINED,
    CAPTURE_UNMATCHED,
    CAPTURE_UNSUPPORTED,
    CAPTURE_WRONG_THREAD,
    CAPTURED_EVENT,
    ILLEGAL_STATE,
    INVALID_VALUE,
    OK,
)

M = CUstreamCaptureMode
_ADD = int(CUstreamUpdateCaptureDependencies_flags.CU_STREAM_ADD_CAPTURE_DEPENDENCIES)
_SET = int(CUstreamUpdateCaptureDependencies_flags.CU_STREAM_SET_CAPTURE_DEPENDENCIES)
S = CUstreamCaptureStatus
GLOBAL, THREAD_LOCAL, RELAXED = (
    M.CU_STREAM_CAPTURE_MODE_GLOBAL,
    M.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
    M.CU_STREAM_CAPTURE_MODE_RELAXED,
)


class Capture:
    __slots__ = ("id", "graph", "mode", "thread", "origin", "frontier", "invalid")

    def __init__(self, id_: int, graph, mode, origin):
        self.id = id_
        self.graph = graph
        self.mode = mode
        self.thread = threading.get_ident()
        self.origin = origin  # the stream it began on
        self.frontier = {origin: []}  # SimStream -> [SimNode]: what its next node waits for
        self.invalid = False


def _ancestors(nodes) -> set[int]:
    seen, pending = set(), list(nodes)
    while pending:
        node = pending.pop()
        if id(node) not in seen:
            seen.add(id(node))
            pending.extend(node.deps)
    return seen


class CaptureModel:
    """Capture state and the refusals of calls that would break a capture."""

    def _init_capture(self):
        self._capture_ids = itertools.count(1)
        self._captures: dict = {}  # SimStream -> Capture, for every stream taking part
        self._captured_events: dict = {}  # SimEvent -> (Capture, [SimNode])

    # -- state ------------------------------------------------------------------------------

    def _capture_of(self, hStream):
        """(CUresult, SimStream, Capture or None) for work enqueued on ``hStream``: the legacy
        stream while a blocking stream of its context captures is refused (that capture is
        invalidated), as is a stream of an invalidated capture."""
        err, stream = self._stream(hStream)
        if err:
            return err, None, None
        if not self._captures:
            return OK, stream, None
        if stream.kind == "legacy":
            implicit = self._implicit(stream)
            if implicit is not None:
                implicit.invalid = True
                return CAPTURE_IMPLICIT, None, None
            return OK, stream, None
        capture = self._captures.get(stream)
        if capture is not None and capture.invalid:
            return CAPTURE_INVALIDATED, None, None
        return OK, stream, capture

    def _implicit(self, legacy):
        """A capture of a blocking stream of ``legacy``'s context, or None."""
        return next(
            (c for s, c in self._captures.items() if s.ctx is legacy.ctx and s.blocking), None
        )

    def _mode(self):
        return getattr(self._tls, "capture_mode", GLOBAL)

    def _refuse_unsafe(self):
        """CAPTURE_UNSUPPORTED when this thread is prohibited from potentially unsafe calls
        (invalidating the captures that prohibit it), else OK."""
        if not self._captures:
            return OK
        mode, me = self._mode(), threading.get_ident()
        blocking = {
            c
            for c in self._captures.values()
            if not c.invalid
            and (
                (c.thread == me and c.mode != RELAXED and mode != RELAXED)
                or (c.thread != me and c.mode == GLOBAL and mode == GLOBAL)
            )
        }
        for capture in blocking:
            capture.invalid = True
        return CAPTURE_UNSUPPORTED if blocking else OK

    def _add_captured(self, capture, stream, work):
        node = self._append(capture.graph, work, list(capture.frontier[stream]))
        capture.frontier[stream] = [node]
        return node

    def _end(self, capture) -> None:
        for stream in [s for s, c in self._captures.items() if c is capture]:
            del self._captures[stream]
        for event in [e for e, (c, _) in self._captured_events.items() if c is capture]:
            del self._captured_events[event]

    # -- the capture functions ---------------------------------------------------------------

    def cuStreamBeginCapture(self, hStream, mode):
        if int(mode) not in (int(GLOBAL), int(THREAD_LOCAL), int(RELAXED)):
            return (INVALID_VALUE,)
        with self._lock:
            err, stream = self._stream(hStream)
            if err:
                return (err,)
            if stream.kind == "legacy":
                return (CAPTURE_UNSUPPORTED,)
            if stream in self._captures:
                return (ILLEGAL_STATE,)
            capture = Capture(next(self._capture_ids), self._new_graph(), M(int(mode)), stream)
            self._captures[stream] = capture
        return (OK,)

    def cuStreamEndCapture(self, hStream):
        with self._lock:
            err, stream = self._stream(hStream)
            if err:
                return (err, None)
            capture = self._captures.get(stream)
            if capture is None:
                return (ILLEGAL_STATE, None)
            if capture.origin is not stream:
                capture.invalid = True
                return (CAPTURE_UNMATCHED, None)
            self._end(capture)
            if capture.mode != RELAXED and capture.thread != threading.get_ident():
                self._forget(capture.graph)
                return (CAPTURE_WRONG_THREAD, None)
            joined = _ancestors(capture.frontier[stream])
            unjoined = any(
                id(n) not in joined
                for s, nodes in capture.frontier.items()
                if s is not stream
                for n in nodes
            )
            if capture.invalid or unjoined:
                self._forget(capture.graph)
                return (CAPTURE_INVALIDATED if capture.invalid else CAPTURE_UNJOINED, None)
            return (OK, CUgraph(capture.graph.handle))

    def _capture_status(self, hStream):
        """(CUresult, SimStream, Capture or None) for the two queries: the legacy stream while
        a blocking stream captures is CAPTURE_IMPLICIT (nothing is invalidated)."""
        err, stream = self._stream(hStream)
        if err:
            return err, None, None
        if stream.kind == "legacy" and self._captures and self._implicit(stream) is not None:
            return CAPTURE_IMPLICIT, None, None
        return OK, stream, self._captures.get(stream)

    def cuStreamIsCapturing(self, hStream):
        with self._lock:
            err, _, capture = self._capture_status(hStream)
            if err:
                return (err, None)
            return (OK, _status(capture))

    def cuStreamGetCaptureInfo(self, hStream):
        """(CUresult, status, id, graph, dependencies, edgeData, numDependencies), as
        cuda.bindings 13 returns it; only the status means something unless ACTIVE."""
        with self._lock:
            err, stream, capture = self._capture_status(hStream)
            if err:
                return (err, None, None, None, None, None, None)
            status = _status(capture)
            if status != S.CU_STREAM_CAPTURE_STATUS_ACTIVE:
                return (OK, status, cuuint64_t(0), CUgraph(0), [], [], 0)
            deps = capture.frontier[stream]
            return (
                OK,
                status,
                cuuint64_t(capture.id),
                CUgraph(capture.graph.handle),
                [CUgraphNode(n.handle) for n in deps],
                [CUgraphEdgeData() for _ in deps],
                len(deps),
            )

    def cuStreamUpdateCaptureDependencies(
        self, hStream, dependencies, dependencyData, numDependencies, flags
    ):
        """Set (CU_STREAM_SET_CAPTURE_DEPENDENCIES) or add to (0, ADD) the nodes the next
        work captured on the stream depends on; ILLEGAL_STATE when it does not capture."""
        with self._lock:
            err, stream, capture = self._capture_status(hStream)
            if err:
                return (err,)
            if capture is None:
                return (ILLEGAL_STATE,)
            if capture.invalid:
                return (CAPTURE_INVALIDATED,)
            nodes = [self._graph_node(h) for h in list(dependencies or ())[:numDependencies]]
            if any(n is None for n in nodes) or int(flags) not in (0, _ADD, _SET):
                return (INVALID_VALUE,)
            frontier = [] if int(flags) == _SET else list(capture.frontier[stream])
            capture.frontier[stream] = frontier + [n for n in nodes if n not in frontier]
            return (OK,)

    def cuThreadExchangeStreamCaptureMode(self, mode):
        if int(mode) not in (int(GLOBAL), int(THREAD_LOCAL), int(RELAXED)):
            return (INVALID_VALUE, None)
        previous = self._mode()
        self._tls.capture_mode = M(int(mode))
        return (OK, previous)

    # -- what a capture refuses ---------------------------------------------------------------

    def _refuse_on_capturing(self, hStream):
        """CAPTURE_UNSUPPORTED for a synchronize or query of a capturing stream (invalidating
        its capture), CAPTURE_INVALIDATED after that; None when the stream does not capture."""
        with self._lock:
            err, _, capture = self._capture_of(hStream)
            if err:
                return err
            if capture is None:
                return None
            capture.invalid = True
            return CAPTURE_UNSUPPORTED

    def _refuse_wait_or_query(self, hStream):
        """A capturing stream: refused (`_refuse_on_capturing`); another stream: a
        potentially unsafe call (measured on an H100 for synchronize and query alike)."""
        err = self._refuse_on_capturing(hStream) if self._captures else None
        if err is None and self._captures:
            with self._lock:
                err = self._refuse_unsafe() or None
        return err

    def cuStreamSynchronize(self, hStream):
        err = self._refuse_wait_or_query(hStream)
        return super().cuStreamSynchronize(hStream) if err is None else (err,)

    def cuStreamQuery(self, hStream):
        err = self._refuse_wait_or_query(hStream)
        return super().cuStreamQuery(hStream) if err is None else (err,)

    def _refuse_captured_event(self, hEvent):
        with self._lock:
            err, event = self._event(hEvent)
            found = None if err else self._captured_events.get(event)
            if found is None:
                return None
            found[0].invalid = True
            return CAPTURED_EVENT

    def cuEventQuery(self, hEvent):
        err = self._refuse_captured_event(hEvent) if self._captured_events else None
        return super().cuEventQuery(hEvent) if err is None else (err,)

    def cuEventSynchronize(self, hEvent):
        err = self._refuse_captured_event(hEvent) if self._captured_events else None
        return super().cuEventSynchronize(hEvent) if err is None else (err,)

    def _unsafe(self, call, *args):
        """A potentially unsafe call: refused while a capture prohibits it."""
        with self._lock:
            err = self._refuse_unsafe()
        return (err,) if err else call(*args)

    def cuCtxSynchronize(self):
        """Refused in every mode while a stream of the context captures: it would wait for
        that stream (its captures are invalidated)."""
        if self._captures:
            with self._lock:
                err, ctx = self._work_context()
                if err:
                    return (err,)
                captures = {c for s, c in self._captures.items() if s.ctx is ctx and not c.invalid}
                for capture in captures:
                    capture.invalid = True
            if captures:
                return (CAPTURE_UNSUPPORTED,)
        return super().cuCtxSynchronize()

    def cuMemAlloc(self, bytesize):
        err = self._unsafe(lambda: (OK,))[0]
        return (err, None) if err else super().cuMemAlloc(bytesize)

    def cuMemFree(self, dptr):
        return self._unsafe(super().cuMemFree, dptr)


def _status(capture):
    if capture is None:
        return S.CU_STREAM_CAPTURE_STATUS_NONE
    return (
        S.CU_STREAM_CAPTURE_STATUS_INVALIDATED
        if capture.invalid
        else S.CU_STREAM_CAPTURE_STATUS_ACTIVE
    )
