"""Several threads: `ThreadMachine` adds to the single-thread machine a rule that runs short
random programs on 1 to 3 worker threads at once and joins them (bounded: a worker that does
not finish is a hang).

Workers share the main thread's contexts and arrays but only read the arrays (so the model
stays exact whatever the interleaving); each writes only what it made: arrays in shared or
its own contexts, its own streams, events and host functions. A worker checks its own
results as it goes, leaves its stack empty (or, sometimes, a context pushed: the thread's
end takes it), and synchronizes its streams before it ends; the arrays it made in shared
contexts then join the main thread's model.
"""

from __future__ import annotations

import threading

import numpy as np
from hypothesis import strategies as st
from hypothesis.stateful import multiple, rule

import cuctx

from . import strategies as S
from .arrays import convert
from .expect import combine
from .launches import LaunchMachine, dims
from .machine import ok
from .model import STATS, Arr, Base, attempt, same_values

JOIN_TIMEOUT_S = 60
MAX_WORKER_CONTEXTS = 2

slot = st.integers(0, 15)
worker_ops = st.one_of(
    st.tuples(
        st.just("alloc"),
        S.shapes,
        S.array_dtypes,
        S.seeds,
        st.sampled_from(["legacy", "stream", "per_thread"]),
        slot,
    ),
    st.tuples(st.just("fill"), slot, S.fill_values),
    st.tuples(st.just("read"), slot),
    st.tuples(st.just("copy_in"), slot),
    st.tuples(st.just("count"), slot, S.grids, S.blocks),
    st.tuples(st.just("create_context")),
    st.tuples(st.just("push"), slot),
    st.tuples(st.just("pop")),
    st.tuples(st.just("destroy_own"), slot),
    st.tuples(st.just("host_function"), st.booleans()),
    st.tuples(st.just("events"), slot),
    st.tuples(st.just("bad_index"), slot, S.bad_keys),
)
programs = st.lists(
    st.tuples(st.lists(worker_ops, max_size=8), st.booleans()), min_size=1, max_size=3
)


class Own:
    """An array a worker made: its device array, a full host copy of its values (None when
    unknown) and the worker's stream it was made on."""

    def __init__(self, dev, values, ctx, stream, shared_rec=None):
        self.dev, self.values, self.ctx, self.stream = dev, values, ctx, stream
        self.shared_rec = shared_rec  # the main model's CtxRec when the context is shared


class Worker:
    def __init__(self, shared_ctxs, shared_arrs, library, program, leave_pushed: bool):
        self.shared_ctxs = shared_ctxs  # [(CtxRec, Context)], alive when the rule started
        self.shared_arrs = shared_arrs  # [(DeviceArray, mirror copy, mask copy, pending streams)]
        self.library = library
        self.program = program
        self.leave_pushed = leave_pushed
        self.own_ctxs: list[cuctx.Context] = []
        self.stack: list[cuctx.Context] = []
        self.arrays: list[Own] = []
        self.streams: dict[int, cuctx.Stream] = {}  # id(context) -> this worker's stream in it
        self.handed: list[Own] = []
        self.error: BaseException | None = None
        self.host_runs = 0

    # -- helpers --------------------------------------------------------------------------

    def contexts(self):
        return [c for _, c in self.shared_ctxs] + [c for c in self.own_ctxs if c.state == "active"]

    def pick(self, items, i):
        return items[i % len(items)] if items else None

    def stream_in(self, ctx) -> cuctx.Stream:
        stream = self.streams.get(id(ctx))
        if stream is None:
            with ctx:
                stream = self.streams[id(ctx)] = cuctx.Stream()
        return stream

    def check_current(self) -> None:
        current = cuctx.current_context()
        want = self.stack[-1] if self.stack else None
        assert current is want or (
            want is None and current is not None and current.kind == "primary"
        ), (current, self.stack)
        if want is None and current is not None:
            self.stack.append(current)  # lazily initialised

    def run(self) -> None:
        try:
            for op in self.program:
                STATS.rule(f"worker_{op[0]}")
                getattr(self, op[0])(*op[1:])
                self.check_current()
            self.finish()
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            self.error = exc

    def finish(self) -> None:
        for stream in self.streams.values():
            stream.synchronize()
        for own in self.arrays:
            if own.values is not None and own.ctx.state == "active":
                got = own.dev.to_host()
                assert np.array_equal(got, own.values, equal_nan=True), (got, own.values)
        if not self.leave_pushed:
            while self.stack:
                assert cuctx.Context.pop() is self.stack.pop()
        self.handed = [o for o in self.arrays if o.shared_rec is not None]
        self.arrays.clear()
        self.streams.clear()
        for ctx in self.own_ctxs:
            if ctx.state != "destroyed":
                ctx.destroy()
                self.stack = [c for c in self.stack if c is not ctx]
        self.check_current()

    # -- operations -----------------------------------------------------------------------

    def alloc(self, shape, dtype, seed, where, i):
        ctx = self.pick(self.contexts(), i)
        if ctx is None:
            return
        host = S.host_data(shape, dtype, seed)
        with ctx:
            stream = {
                "legacy": cuctx.legacy_stream,
                "stream": lambda: self.stream_in(ctx),
                "per_thread": cuctx.per_thread_stream,
            }[where]()
            dev = attempt("worker to_device", None, cuctx.to_device, host, stream)
        shared = next((rec for rec, c in self.shared_ctxs if c is ctx), None)
        self.arrays.append(Own(dev, host.copy(), ctx, stream, shared))

    def fill(self, i, value):
        own = self.pick(self.arrays, i)
        if own is None or own.ctx.state != "active":
            return
        element, cond = convert(value, own.dev.dtype)
        if ok(attempt("worker fill", combine(cond), own.dev.fill, value, own.stream)):
            if cond is None:
                own.values[...] = element
            else:  # the model did not know whether the fill stores
                own.values = None

    def wait_pending(self, stream, pending) -> None:
        for p in pending:
            attempt("worker wait", None, stream.wait, p)

    def read(self, i):
        item = self.pick(self.shared_arrs, i)
        if item is None:
            return
        dev, mirror, mask, pending = item
        stream = self.stream_in(dev.context)
        self.wait_pending(stream, pending)
        out = np.empty(dev.shape, dev.dtype)
        attempt("worker to_host", None, dev.to_host, out, stream)
        assert same_values(out, mirror, mask), (out, mirror)

    def copy_in(self, i):
        item = self.pick(self.shared_arrs, i)
        if item is None:
            return
        dev, mirror, mask, pending = item
        if not mask.all():
            return
        stream = self.stream_in(dev.context)
        self.wait_pending(stream, pending)
        mine = attempt("worker empty", None, cuctx.empty, dev.shape, dev.dtype, stream=stream)
        attempt("worker copy", None, cuctx.copy, mine, dev, stream)
        shared = next((rec for rec, c in self.shared_ctxs if c is dev.context), None)
        self.arrays.append(Own(mine, mirror.copy(), dev.context, stream, shared))

    def count(self, i, grid, block):
        ctx = self.pick(self.contexts(), i)
        if ctx is None or dims(block) is None or np.prod(dims(block)) > 1024:
            return
        stream = self.stream_in(ctx)
        with ctx:
            counter = attempt("worker zeros", None, cuctx.zeros, 1, np.uint32, stream=stream)
        attempt("worker count", None, self.library["count"][grid, block, 0, stream], counter)
        got = counter.to_host(stream=stream)
        want = np.prod(dims(grid)) * np.prod(dims(block))
        assert int(got[0]) == want, (int(got[0]), want, grid, block)

    def create_context(self):
        if len(self.own_ctxs) < MAX_WORKER_CONTEXTS:
            ctx = attempt("worker Context.create", None, cuctx.Context.create, 0)
            self.own_ctxs.append(ctx)
            self.stack.append(ctx)

    def push(self, i):
        ctx = self.pick(self.contexts(), i)
        if ctx is not None and len(self.stack) < 6:
            attempt("worker push", None, ctx.push)
            self.stack.append(ctx)

    def pop(self):
        want = self.stack[-1] if self.stack else None
        got = attempt(
            "worker pop", None if want else (cuctx.InvalidContextError,), cuctx.Context.pop
        )
        if want is not None:
            assert got is self.stack.pop()

    def destroy_own(self, i):
        ctx = self.pick([c for c in self.own_ctxs if c.state == "active"], i)
        if ctx is None:
            return
        self.streams.pop(id(ctx), None)
        self.arrays = [o for o in self.arrays if o.ctx is not ctx]
        attempt("worker destroy", None, ctx.destroy)
        self.stack = [c for c in self.stack if c is not ctx]

    def host_function(self, raises):
        ctx = self.pick(self.contexts(), 0)
        if ctx is None:
            return
        stream = self.stream_in(ctx)

        def fn():
            self.host_runs += 1
            if raises:
                raise ValueError("raised by a worker's host function")

        before = self.host_runs
        attempt("worker launch_host_func", None, stream.launch_host_func, fn)
        attempt(
            "worker synchronize", (cuctx.HostFunctionError,) if raises else None, stream.synchronize
        )
        assert self.host_runs == before + 1

    def events(self, i):
        ctx = self.pick(self.contexts(), i)
        if ctx is None:
            return
        stream = self.stream_in(ctx)
        with ctx:
            start, end = cuctx.Event(timing=True), cuctx.Event(timing=True)
        start.record(stream)
        end.record(stream)
        other = self.stream_in(self.pick(self.contexts(), i + 1))
        other.wait(end)
        assert attempt("worker elapsed_ms", None, start.elapsed_ms, end) >= 0
        end.synchronize()
        assert end.done

    def bad_index(self, i, key):
        own = self.pick(self.arrays, i)
        if own is not None:
            attempt(f"worker arr[{key!r}]", (IndexError,), own.dev.__getitem__, key)


class ThreadMachine(LaunchMachine):
    @rule(target=LaunchMachine.arrays, programs=programs)
    def run_workers(self, programs):
        self.count("run_workers")
        shared_ctxs = [(r, r.ctx) for r in [self.primary(), *self.created] if r.alive]
        shared_arrs = []
        for base in self.bases:
            pending = [p.stream for p in base.pending]
            if (
                base.trusted
                and base.ctx.alive
                and all(p.ctx.alive for p in base.pending)
                and base.dev.size
            ):
                mirror, mask = base.typed(base.dev.dtype, 0, base.dev.shape, base.dev.strides)
                shared_arrs.append((base.dev, mirror.copy(), mask.copy(), pending))
        workers = [
            Worker(shared_ctxs, shared_arrs, self.env.library, program, leave)
            for program, leave in programs
        ]
        threads = [threading.Thread(target=w.run, daemon=True) for w in workers]
        for t in threads:
            t.start()
        for t in threads:
            t.join(JOIN_TIMEOUT_S)
        for w, t in zip(workers, threads):
            assert not t.is_alive(), f"a worker hung running {w.program!r}"
            if w.error is not None:
                raise AssertionError(
                    f"a worker running {w.program!r} failed: {w.error!r}"
                ) from w.error
        handed = []
        for w in workers:
            for own in w.handed:
                if own.shared_rec is None or not own.shared_rec.alive:
                    continue
                srec = self.add_stream(own.stream, own.shared_rec, "worker")
                base = Base(own.dev, own.shared_rec, srec)
                base.pending = set()
                self.bases.append(base)
                arr = self.track(Arr(base, own.dev, 0))
                if own.values is not None:
                    arr.mirror[...] = own.values
                    arr.mask[...] = True
                handed.append(arr)
        return multiple(*handed)


__all__ = ["ThreadMachine", "Worker"]
