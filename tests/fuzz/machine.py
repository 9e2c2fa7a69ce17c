"""The single-thread state machine: contexts, the context stack, streams, events, host
functions, device reset and (on the sim) injected faults. Arrays, copies and launches are in
`arrays`; `Machine` puts them together.

The model follows cuctx's documented behaviour, not its code: where the docs or issue 7 say
what must happen (a destroyed context leaves every thread's stack, lazy initialisation makes
the primary context current, a host function calling CUDA is reported at the next
synchronize), the model says so, and a library that does otherwise fails here.
"""

from __future__ import annotations

import faulthandler
import os
import gc
import sys
from typing import Callable
from dataclasses import dataclass

from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
)

import cuctx
from cuctx import ContextDestroyedError, InvalidContextError

from .expect import combine, fail, maybe, usable
from .model import (
    FAULTS,
    STATS,
    Base,
    CtxRec,
    EventRec,
    Failed,
    StreamRec,
    attempt,
    same_values,
)


def ok(result) -> bool:
    """Whether an `attempt` succeeded."""
    return not isinstance(result, Failed)


EXAMPLE_TIMEOUT_S = 120  # one example hung (a deadlock): dump every thread's stack and exit
MAX_CREATED = 3  # live created contexts (each costs a GPU hundreds of MB)
MAX_STACK = 6


@dataclass
class Env:
    """What one test's examples share: the backend, the loaded library, device limits."""

    backend: object
    library: cuctx.Library
    limits: dict
    priorities: tuple[int, int]  # (least, greatest), e.g. (0, -5)
    anchor: cuctx.Context | None = None  # keeps the primary context (and its code) loaded
    warm: Callable[[], None] | None = None  # what a driver allocates once per primary context
    warmed: cuctx.Context | None = None  # the primary context `warm` last ran in


CONTEXT_FLAGS = st.sampled_from(
    [
        0,
        0,
        cuctx.ContextFlags.SCHED_SPIN,
        cuctx.ContextFlags.SCHED_YIELD,
        cuctx.ContextFlags.SCHED_BLOCKING_SYNC,
        cuctx.ContextFlags.MAP_HOST,
    ]
)
BAD_CONTEXT_FLAGS = st.sampled_from([1 << 20, "0", True, 1.0, None])


class ContextMachine(RuleBasedStateMachine):
    contexts = Bundle("contexts")
    streams = Bundle("streams")
    events = Bundle("events")

    def __init__(self, env: Env):
        super().__init__()
        self.env = env
        with STATS.lock:
            STATS.examples += 1
        faulthandler.dump_traceback_later(EXAMPLE_TIMEOUT_S, exit=True)
        self.device = cuctx.Device(0)
        self._primary: CtxRec | None = None
        self.stack: list[CtxRec] = []  # this thread's context stack, as the model sees it
        self.created: list[CtxRec] = []
        self.all_streams: list[StreamRec] = []
        self.bases: list[Base] = []
        self.host_calls: dict[int, int] = {}  # id(StreamRec) -> host functions that ran
        self.all_events: list[EventRec] = []
        self.all_arrs: list = []  # every Arr record made (the bundles keep them too)
        self.names = 0
        self.started = self.finished = 0
        gc.collect()
        primary = self.device.primary_context
        if self.env.warm is not None and self.env.warmed is not primary:
            # A reset in an earlier example left a new primary context: warm it as the first
            # one was, or its first-use allocations would count as this example's leak.
            self.env.warm()
            self.env.warmed = self.env.anchor = primary
        self.baseline = self.free_memory()

    # -- helpers --------------------------------------------------------------------------

    def free_memory(self) -> int:
        """Device.mem_info().free, leaving the stack as it was (with none current, mem_info
        initialises lazily: the primary context stays current)."""
        empty = cuctx.current_context() is None
        backend = self.env.backend
        # the driver's pool may keep freed blocks: hand them back
        with self.device:
            err, pool = backend.driver.cuDeviceGetDefaultMemPool(self.device._handle)
            assert not err, err
            (err,) = backend.driver.cuMemPoolTrimTo(pool, 0)
            assert not err, err
        free = self.device.mem_info().free
        if empty:
            assert cuctx.Context.pop() is self.device.primary_context
        return free

    def call(self, what: str, expect, fn, *args, **kwargs):
        return attempt(what, expect, fn, *args, **kwargs)

    def count(self, rule_name: str) -> None:
        """Every rule starts here; the invariant after it counts the rules that finished, so
        teardown knows whether the example failed inside a rule."""
        STATS.rule(rule_name)
        self.started += 1

    def name(self, prefix: str) -> str:
        self.names += 1
        return f"{prefix}{self.names}"

    def primary(self) -> CtxRec:
        """The record of device 0's primary context (a new one after a reset)."""
        if self._primary is None or self._primary.state == "destroyed":
            self._primary = CtxRec(self.device.primary_context, "primary", self.name("primary"))
        return self._primary

    def resolve(self, rec: CtxRec) -> CtxRec:
        """A stack entry: a primary context entry is the device's primary, reset or not
        (the driver keeps the handle, and cuctx a new Context object for it)."""
        return self.primary() if rec.kind == "primary" else rec

    def top(self) -> CtxRec | None:
        return self.resolve(self.stack[-1]) if self.stack else None

    def implicit(self) -> CtxRec:
        """The context of a call that takes the current one (device 0's primary when none is)."""
        return self.top() or self.primary()

    def lazy_init(self) -> None:
        """A call that initialises lazily succeeded: the primary context is current now."""
        if not self.stack:
            self.stack.append(self.primary())
        current = cuctx.current_context()
        assert current is self.top().ctx, (
            f"after lazy initialisation the current context is {current!r}, not {self.top().ctx!r}"
        )

    def legacy(self, rec: CtxRec) -> StreamRec | None:
        """The legacy default stream of a context, as a record (made once per context);
        None when the context cannot be entered any more."""
        if rec.legacy is None:

            def get():
                with rec.ctx:
                    return cuctx.legacy_stream()

            stream = self.call(f"legacy_stream() in {rec}", combine(usable(rec)), get)
            if isinstance(stream, Failed):
                return None
            rec.legacy = self.add_stream(stream, rec, "legacy")
        return rec.legacy

    def add_stream(self, stream, rec: CtxRec, kind: str) -> StreamRec:
        srec = StreamRec(stream, rec, kind)
        self.all_streams.append(srec)
        self.host_calls[id(srec)] = 0
        return srec

    def synchronize_stream(self, s: StreamRec) -> None:
        """Synchronize a stream through the API, expecting what the model knows of it."""
        expect = combine(usable(s.ctx), self.host_errors([s]))
        result = self.call(f"{s}.synchronize()", expect, s.stream.synchronize)
        if isinstance(result, Failed) and not isinstance(result.exc, cuctx.HostFunctionError):
            return
        s.host_failures = 0
        for base in self.bases:
            base.pending.discard(s)
        if s.host_expected is not None:
            assert self.host_calls[id(s)] == s.host_expected, (
                f"{s}: {self.host_calls[id(s)]} host functions ran by its synchronize, "
                f"{s.host_expected} were queued"
            )

    @staticmethod
    def host_errors(streams):
        """The condition from host functions that raised on these streams: a
        HostFunctionError, or maybe one where the model lost track (None failures)."""
        if any(s.host_failures for s in streams):
            return fail(cuctx.HostFunctionError)
        if any(s.host_failures is None for s in streams):
            return maybe(cuctx.HostFunctionError)
        return None

    def synchronize_context(self, rec: CtxRec) -> None:
        streams = [s for s in self.all_streams if s.ctx is rec]
        expect = combine(
            usable(rec),
            self.host_errors(streams),
            fail(*FAULTS) if rec.state == "faulted" else None,
        )
        result = self.call(f"{rec}.synchronize()", expect, rec.ctx.synchronize)
        if isinstance(result, Failed) and not isinstance(result.exc, cuctx.HostFunctionError):
            return
        self.settled(streams)

    def settle(self, rec: CtxRec) -> None:
        """Before ``rec`` goes (destroy, reset): finish the work of every stream that may
        touch memory of it, or that is of it and touches other memory. The model is
        conservative here: a real driver frees memory under running work."""
        for base in self.bases:
            involved = base.ctx is rec or any(p.ctx is rec for p in base.pending)
            if involved:
                for p in list(base.pending):
                    if p.ctx.alive:
                        self.synchronize_stream(p)

    def forget(self, rec: CtxRec, state: str) -> None:
        rec.state = state
        for s in self.all_streams:
            if s.ctx is rec:
                s.host_failures = 0  # the bookkeeping goes with the context
                s.host_expected = None

    def check_base(self, base: Base) -> None:
        """Compare a whole allocation with its mirror, after its pending work is done."""
        if not base.trusted or not base.ctx.alive:
            return
        for p in list(base.pending):
            if p.ctx.alive:
                self.synchronize_stream(p)
            else:
                base.pending.discard(p)
        if base.pending:
            return  # a host function error was reported instead: check another time
        host = self.call("base.to_host()", None, base.dev.to_host)
        mask = base.known.reshape(base.dev.shape + (base.dev.dtype.itemsize,))
        want = base.bytes.view(base.dev.dtype).reshape(base.dev.shape)
        assert same_values(host, want, mask), (
            f"device memory differs from the model:\n device {host!r}\n model  {want!r}\n "
            f"known  {mask.all(axis=-1)!r}"
        )

    # -- contexts -------------------------------------------------------------------------

    @rule(target=contexts)
    def primary_context(self):
        self.count("primary_context")
        return self.primary()

    @precondition(
        lambda self: (
            sum(r.alive for r in self.created) < MAX_CREATED and len(self.stack) < MAX_STACK
        )
    )
    @rule(target=contexts, flags=CONTEXT_FLAGS)
    def create_context(self, flags):
        self.count("create_context")
        ctx = self.call(f"Context.create(0, {flags!r})", None, cuctx.Context.create, 0, flags)
        rec = CtxRec(ctx, "created", self.name("ctx"))
        self.created.append(rec)
        self.stack.append(rec)
        return rec

    @precondition(lambda self: len(self.stack) < MAX_STACK)
    @rule(flags=BAD_CONTEXT_FLAGS)
    def create_context_bad_flags(self, flags):
        self.count("create_context_bad_flags")
        self.call(
            f"Context.create(0, {flags!r})",
            (TypeError, ValueError, cuctx.CudaError),
            cuctx.Context.create,
            0,
            flags,
        )

    @rule(rec=contexts)
    def destroy(self, rec):
        self.count("destroy")
        if rec.kind == "primary":
            expect = (InvalidContextError,)
        elif rec.state == "destroyed":
            expect = (ContextDestroyedError,)
        else:
            expect = None
            self.settle(rec)
        self.call(f"{rec}.destroy()", expect, rec.ctx.destroy)
        if expect:
            return
        self.forget(rec, "destroyed")
        # The destroyed context leaves this thread's stack wherever it sits (issue 7, item 4).
        self.stack = [r for r in self.stack if r is not rec]
        assert rec.ctx.state == "destroyed"

    @precondition(lambda self: len(self.stack) < MAX_STACK)
    @rule(rec=contexts)
    def push(self, rec):
        self.count("push")
        if ok(self.call(f"{rec}.push()", combine(usable(rec)), rec.ctx.push)):
            self.stack.append(rec)

    @rule()
    def pop(self):
        self.count("pop" if self.stack else "pop_empty")
        want = self.top()
        got = self.call(
            "Context.pop()", None if want else (InvalidContextError,), cuctx.Context.pop
        )
        if want is None:
            return
        self.stack.pop()
        if want.kind == "created":
            assert got is want.ctx, f"Context.pop() returned {got!r}, not {want.ctx!r}"
        else:
            assert got.kind == "primary" and got.device is self.device, got

    @rule(rec=contexts)
    def set_current(self, rec):
        self.count("set_current")
        if ok(self.call(f"{rec}.set_current()", combine(usable(rec)), rec.ctx.set_current)):
            if self.stack:
                self.stack[-1] = rec
            else:
                self.stack.append(rec)

    @rule(rec=contexts)
    def with_context(self, rec):
        """``with ctx:`` around a push of another context: the block restores the stack."""
        self.count("with_context")
        before = list(self.stack)

        inner = self.primary() if self.primary().alive else None

        def block():
            with rec.ctx:
                assert cuctx.current_context() is self.resolve(rec).ctx
                if inner is not None:
                    inner.ctx.push()  # left pushed: the block's exit pops it too

        self.call(f"with {rec}:", combine(usable(rec)), block)
        assert self.stack == before

    @rule()
    def reset(self):
        self.count("reset")
        rec = self.primary()
        self.settle(rec)
        self.call("Device(0).reset()", None, self.device.reset)
        self.forget(rec, "destroyed")
        assert rec.ctx.state == "destroyed"

    @precondition(lambda self: self.env.backend.name == "sim")
    @rule(rec=contexts)
    def inject_fault(self, rec):
        """Sim only: a sticky fault in ``rec``. Its work may be dropped, so memory it may
        touch is no longer compared; it stays faulted until destroyed or reset."""
        self.count("inject_fault")
        from cuctx.sim import inject_fault

        if not ok(self.call(f"inject_fault({rec})", combine(usable(rec)), inject_fault, rec.ctx)):
            return
        rec.state = "faulted"
        for base in self.bases:
            if base.ctx is rec or any(p.ctx is rec for p in base.pending):
                base.trusted = False
        for s in self.all_streams:
            if s.ctx is rec:
                s.host_expected = None  # queued host functions may be dropped

    @rule(rec=contexts)
    def synchronize(self, rec):
        self.count("synchronize")
        self.synchronize_context(rec)

    @rule(how=st.sampled_from(["device", "cuctx"]))
    def synchronize_device(self, how):
        """Device.synchronize / cuctx.synchronize: every usable context of the device."""
        self.count(f"synchronize_{how}")
        recs = [r for r in [self.primary(), *self.created] if r.state != "destroyed"]
        streams = [s for s in self.all_streams if s.ctx in recs]
        faulted = [r for r in recs if r.state == "faulted"]
        failures = self.host_errors(streams)
        # A faulted context may be skipped (known poisoned) or raise its fault first.
        expect = combine(
            maybe(*failures[1]) if faulted and failures else failures,
            maybe(*FAULTS) if faulted else None,
        )
        fn = self.device.synchronize if how == "device" else cuctx.synchronize
        result = self.call(f"{how} synchronize", expect, fn)
        if how == "cuctx":
            self.lazy_init() if ok(result) or not faulted else None
        if faulted:  # which contexts were waited for, and whose errors taken, is not modelled
            for s in streams:
                if s.host_failures != 0:
                    s.host_failures = None
            return
        self.settled(streams)

    # -- invariants and the end -----------------------------------------------------------

    @invariant()
    def current_context_is_the_model_top(self):
        current = attempt("current_context()", None, cuctx.current_context)
        want = self.top()
        if want is None and current is not None and current is self.primary().ctx:
            self.stack.append(self.primary())  # lazily initialised by a call that may
            want = self.top()
        assert current is (want.ctx if want else None), (
            f"current_context() is {current!r}; the model's stack is {self.stack}"
        )
        assert current is None or current.state != "destroyed", current
        self.finished = self.started

    def teardown(self):
        try:
            if self.started != self.finished:  # a rule failed: clean up for the next example
                self.clean_up()
                return
            try:
                self.finish()
            except BaseException:
                self.clean_up()
                raise
        finally:
            faulthandler.cancel_dump_traceback_later()

    def clean_up(self):
        backend = self.env.backend
        while backend.driver.cuCtxPopCurrent()[0] == 0:
            pass
        backend.tls.state.stack.clear()
        for rec in self.created:
            if rec.ctx is not None and rec.ctx.state != "destroyed":
                try:
                    rec.ctx.destroy()
                except Exception:  # noqa: BLE001, S110 - the rule's failure is what is reported
                    pass
        if self.device.primary_context.state != "active":
            self.device.reset()
        self.release()
        gc.collect()

    def finish(self):
        for base in self.bases:
            self.check_base(base)
        while self.stack:  # leave this thread's stack as the test found it
            want = self.stack.pop()
            got = self.call("Context.pop()", None, cuctx.Context.pop)
            assert want.kind == "primary" or got is want.ctx
        for rec in self.created:
            if rec.state != "destroyed":
                self.call(f"{rec}.destroy()", None, rec.ctx.destroy)
                self.forget(rec, "destroyed")
        primary = self.primary()
        if primary.state == "faulted":
            self.call("Device(0).reset()", None, self.device.reset)
            self.forget(primary, "destroyed")
            primary = self.primary()
        self.synchronize_context(primary)  # host function errors the model expects
        self.release()
        gc.collect()
        primary = self.device.primary_context
        primary.synchronize()  # the frees queued by garbage collection
        self.env.anchor = primary
        free = self.free_memory()
        # The device's own count moves with the driver's reservations inside the primary
        # context: on an H100 they came and went in 2 MiB steps (up to 6 MiB, as often down
        # as up over 110 multi-thread examples, never accumulating), so a GPU gets 8 MiB.
        slack = 0 if self.env.backend.sim is not None else 8 << 20
        if os.environ.get("CUCTX_FUZZ_MEMORY") == "report":  # a diagnosis: growth per example
            print(
                f"cuctx fuzz memory: example grew by {self.baseline - free} bytes; {_still_held()}",
                file=sys.__stdout__,
                flush=True,
            )
            return
        assert free >= self.baseline - slack, (
            f"device memory in use grew by {self.baseline - free} bytes over the example "
            f"(free {free}, was {self.baseline}): something leaked; {_still_held()}"
        )

    def settled(self, streams) -> None:
        """The streams' work is done: nothing pending, host functions counted as expected."""
        for s in streams:
            s.host_failures = 0
            for base in self.bases:
                base.pending.discard(s)
            if s.host_expected is not None:
                assert self.host_calls[id(s)] == s.host_expected, s

    def release(self):
        """Drop every object the example made (the bundles keep the records)."""
        for base in self.bases:
            base.dev = None
        self.bases.clear()
        for s in self.all_streams:
            s.stream = None
        for e in self.all_events:
            e.event = None
        for rec in self.created:
            rec.ctx = rec.legacy = None
        if self._primary is not None:
            self._primary.ctx = self._primary.legacy = None
        self._primary = None


def _still_held() -> str:
    """What cuctx itself still holds, for a leak report: allocations not freed (and the
    contexts they belong to), pointers waiting for a usable context, live contexts."""
    from cuctx import _lifetimes

    every = [c for c in gc.get_objects() if isinstance(c, cuctx.Context)]
    held = [(ctx, free[:]) for ctx in every for free in list((ctx._allocations or {}).values())]
    sizes = [free[2] for _, free in held if free]
    contexts = sorted({repr(ctx) for ctx, free in held if free})
    orphans = sum(len(p) for p in _lifetimes.orphans.values())
    live = [c for c in every if c.state != "destroyed"]
    return (
        f"cuctx still holds {len(held)} allocation(s), {sum(sizes)} bytes, in {contexts}; "
        f"{orphans} orphaned pointer(s); {len(live)} live Context object(s): "
        f"{sorted(repr(c) for c in live)[:6]}"
    )


__all__ = ["ContextMachine", "Env", "ok"]
