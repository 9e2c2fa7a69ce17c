"""The sim's asynchronous engine: queued operations (`Op`), the order they run in, and the
virtual clock. Separate from `_streams` (the streams themselves: handles, the default
streams' rules, cuStream*, host functions) because every model that queues work (memory,
launches, events, graphs) talks to the engine, not to the stream calls.

Work queued on a stream does not run when it is enqueued. It runs when something forces it:
synchronizing the stream, an event or the context, querying a stream or an event (each query
runs one more operation of the queried work, then answers), or a stream waiting on an event
whose work has not run yet. Synchronizing one stream runs only that stream and what it waits
on, so a missing ``wait`` shows up as stale data every time. Synchronizing a context
interleaves its streams: the operation that would *finish* first on the virtual clock runs
first, and ties are broken by a random generator seeded from ``CUCTX_SIM_SEED`` (default 0),
so a race has one outcome per seed.

The virtual clock: each stream has a clock (when its last operation finished, in ns). An
operation is ready at the latest of its stream's clock, the host's clock when it was enqueued
and the end of everything it waits on, starts when its engine has room (`_timing`) and lasts
what the timing model gives it. The host's clock moves to a stream's (or event's) time
when the host synchronizes with it. Events record the time at
which their marker ran, so `cuEventElapsedTime` is exact and deterministic.

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
- ``SimDriver._stream_context(hStream) -> (CUresult, SimContext | None)`` (`_streams`);
  handles 0 (legacy default), CU_STREAM_LEGACY (1) and CU_STREAM_PER_THREAD (2) resolve to
  the current context's default streams.
- ``_synchronize_context(ctx)`` (`_streams`) drains every stream of the context and
  ``_release_context_resources(ctx)`` drains them, then invalidates them (calling super()).
  StreamModel must come before the other resource models in SimDriver's bases, so queued
  work runs before the memory it uses is freed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cuda.bindings.driver import CUresult

from ...errors import STICKY_CODES
from ._common import NOT_PERMITTED, OK
from ._timing import KERNEL, Activity, duration, kernel_time

if TYPE_CHECKING:
    from ._streams import SimStream


class Op:
    """One queued operation."""

    __slots__ = (
        "stream",
        "fn",
        "cost",
        "label",
        "deps",
        "submit",
        "done",
        "end",
        "kind",
        "nbytes",
        "width",
        "correlation",
    )

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


class EngineModel:
    """The engine (see the module's docstring), a base of `StreamModel`, which finds the
    streams (`_stream`, `_ctx_streams`) and makes the engine's state (`_init_streams`: the
    host's clock, the devices' `Engines`, the activity subscribers, the seeded generator)."""

    def _enqueue(
        self, hStream, op, *, nbytes=0, cost_ns=None, label="", kind=None, pageable=False, width=1.0
    ):
        with self._lock:
            err, stream = self._stream(hStream)
            if err:
                return err
            cost = duration(kind, nbytes, width, pageable) if cost_ns is None else cost_ns
            self._push(stream, op, cost, label, kind=kind, nbytes=nbytes, width=width)
            return OK

    def _push(
        self,
        stream: SimStream,
        fn,
        cost: int,
        label: str,
        deps=(),
        *,
        kind=None,
        nbytes=0,
        width=1.0,
    ) -> Op:
        deps = [d for d in deps if not d.done]
        if stream.kind == "legacy":  # waits for the blocking streams' earlier work
            deps += [
                s.last
                for s in self._ctx_streams(stream.ctx).values()
                if s.blocking and s.last is not None and not s.last.done
            ]
        elif stream.blocking:  # waits for the legacy stream's earlier work
            legacy = self._ctx_streams(stream.ctx).get("legacy")
            if legacy is not None and legacy.last is not None and not legacy.last.done:
                deps.append(legacy.last)
        stack = self._tls.correlation
        op = Op(
            stream,
            fn,
            int(cost),
            label,
            deps,
            self._now,
            kind,
            nbytes,
            width,
            stack[-1] if stack else None,
        )
        stream.queue.append(op)
        stream.last = op
        return op

    def _execute(self, op: Op) -> None:
        stream = op.stream
        stream.queue.popleft()
        start = (
            max(stream.clock, op.submit, *(d.end for d in op.deps))
            if op.deps
            else max(stream.clock, op.submit)
        )
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
                op.cost += (
                    kernel_time(self._touched, op.width)
                    if self._declared is None
                    else self._declared
                )
            ctx = stream.ctx
            start = self._engines[ctx.device].place(
                op.kind, start, op.cost, ctx.handle, ctx.sms, op.width
            )
            op.end = stream.clock = start + op.cost
            op.done = True
        if op.kind is not None and self._activity:
            record = Activity(
                op.kind,
                op.label,
                ctx.device,
                ctx.handle,
                stream.handle,
                op.submit,
                start,
                op.end,
                op.correlation,
                op.nbytes,
            )
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
