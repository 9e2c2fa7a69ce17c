"""Streams, events and host functions, on top of `ContextMachine`."""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import multiple, rule

import cuctx

from .expect import combine, fail, usable
from .machine import ContextMachine, ok
from .model import EventRec, Failed


class StreamMachine(ContextMachine):
    contexts = ContextMachine.contexts
    streams = ContextMachine.streams
    events = ContextMachine.events

    # -- streams and events ---------------------------------------------------------------

    @rule(
        target=streams,
        rec=contexts,
        priority=st.sampled_from([None, 0, -1, -5, 1, -6, 2.0, True]),
        non_blocking=st.booleans(),
    )
    def new_stream(self, rec, priority, non_blocking):
        self.count("new_stream")
        least, greatest = self.env.priorities
        bad = priority is not None and (isinstance(priority, bool) or not isinstance(priority, int))
        out_of_range = not bad and priority is not None and not greatest <= priority <= least

        def make():
            with rec.ctx:
                return cuctx.Stream(priority=priority, non_blocking=non_blocking)

        expect = combine(
            usable(rec),
            fail(TypeError) if bad else None,
            fail(ValueError) if out_of_range else None,
        )
        stream = self.call(f"Stream(priority={priority!r}) in {rec}", expect, make)
        if not ok(stream):
            return multiple()
        return self.add_stream(stream, rec, "created")

    @rule(target=streams, rec=contexts)
    def legacy_stream(self, rec):
        self.count("legacy_stream")
        s = self.legacy(rec) if rec.state != "destroyed" else None
        return multiple() if s is None else s

    @rule(target=events, rec=contexts, timing=st.booleans())
    def new_event(self, rec, timing):
        self.count("new_event")

        def make():
            with rec.ctx:
                return cuctx.Event(timing=timing)

        event = self.call(f"Event(timing={timing}) in {rec}", combine(usable(rec)), make)
        if not ok(event):
            return multiple()
        erec = EventRec(event, rec, timing)
        self.all_events.append(erec)
        return erec

    @rule(event=events, s=streams)
    def record(self, event, s):
        self.count("record")
        # A destroyed context is named as such (issue 7, item 11), even when it is the
        # event's and the stream is of another context.
        dead = usable(event.ctx, s.ctx)
        expect = combine(dead, fail(ValueError) if event.ctx is not s.ctx and not dead else None)
        if ok(self.call(f"{event}.record({s})", expect, event.event.record, s.stream)):
            event.recorded = True

    @rule(s=streams, event=events)
    def wait_event(self, s, event):
        self.count("wait_event")
        expect = combine(usable(s.ctx, event.ctx), None if event.recorded else fail(ValueError))
        self.call(f"{s}.wait({event})", expect, s.stream.wait, event.event)

    @rule(s=streams, other=streams)
    def wait_stream(self, s, other):
        self.count("wait_stream")
        expect = combine(usable(s.ctx, None if other is s else other.ctx))
        if ok(self.call(f"{s}.wait({other})", expect, s.stream.wait, other.stream)):
            for base in self.bases:
                if other in base.pending:
                    base.pending.add(s)

    @rule(event=events)
    def event_synchronize(self, event):
        self.count("event_synchronize")
        expect = combine(usable(event.ctx), None if event.recorded else fail(ValueError))
        self.call(f"{event}.synchronize()", expect, event.event.synchronize)

    @rule(start=events, end=events)
    def elapsed(self, start, end):
        self.count("elapsed")
        ok = start.timing and end.timing and start.recorded and end.recorded
        expect = combine(usable(start.ctx, end.ctx), None if ok else fail(ValueError))
        ms = self.call(f"{start}.elapsed_ms({end})", expect, start.event.elapsed_ms, end.event)
        if not isinstance(ms, Failed):
            assert isinstance(ms, float)

    @rule(s=streams)
    def stream_synchronize(self, s):
        self.count("stream_synchronize")
        self.synchronize_stream(s)

    @rule(s=streams, event=events)
    def query(self, s, event):
        self.count("query")
        self.call(f"{s}.done", combine(usable(s.ctx)), lambda: s.stream.done)
        self.call(f"{event}.done", combine(usable(event.ctx)), lambda: event.event.done)

    # -- host functions -------------------------------------------------------------------

    @rule(s=streams, kind=st.sampled_from(["ok", "raises", "calls_cuda", "not_callable"]))
    def host_function(self, s, kind):
        """A host function that runs, raises, or calls cuctx (which it must not: that is an
        error reported at the next synchronize, issue 7 item 7)."""
        self.count("host_function")
        calls, key = self.host_calls, id(s)

        def ran():
            calls[key] += 1

        def raises():
            calls[key] += 1
            raise ValueError("raised by a host function")

        def calls_cuda():
            calls[key] += 1
            cuctx.current_context()

        fn = {"ok": ran, "raises": raises, "calls_cuda": calls_cuda, "not_callable": 3}[kind]
        expect = combine(usable(s.ctx), fail(TypeError) if kind == "not_callable" else None)
        if not ok(
            self.call(f"{s}.launch_host_func({kind})", expect, s.stream.launch_host_func, fn)
        ):
            return
        if s.host_expected is not None:
            s.host_expected += 1
        if s.host_failures is not None:
            s.host_failures += kind != "ok"


__all__ = ["StreamMachine"]
