"""The race checker retires what the host has seen finish, and stays bounded: work before a
synchronize races nothing after it, while the order it still must know (an event not waited
for yet, the legacy stream's barrier) survives (freed memory: test_racecheck.py); a query
that answered done orders like a synchronize; and a long loop on the sim's default checker
holds its history under a mebibyte. ``retire_history()`` sweeps as the checker does at a
synchronize once enough operations ran."""

from __future__ import annotations

import gc
import inspect
import itertools
import sys
import weakref

import numpy as np
import pytest

import cuctx
from cuctx import _trace
from cuctx.tools import _racecheck
from cuctx.tools._racecheck_clocks import Actor, Clocks
from cuctx.tools._racecheck_run import _WATCH
from cuctx.tools._racecheck_shadow import Region, Segment
from scenarios import ADD_SOURCE, add, add_arrays, library_fixture, retire_history

pytestmark = pytest.mark.usefixtures("nvrtc_cache")
N = 1024
lib = library_fixture(ADD_SOURCE, add=add)


def here() -> int:
    return inspect.currentframe().f_back.f_lineno


def test_work_before_a_synchronize_races_nothing_and_work_after_it_still_does(lib):
    s1, s2 = cuctx.Stream(), cuctx.Stream()
    x = cuctx.empty(N, np.float32, stream=s1)
    cuctx.synchronize()
    with cuctx.racecheck("collect") as rc:
        x.fill(1.0, stream=s1)
        cuctx.synchronize()
        retire_history()
        first = here() + 1
        x.fill(2.0, stream=s2)  # after the synchronize: no race with the first fill
        second = here() + 1
        x.fill(3.0, stream=s1)  # s1 did not wait for s2
        cuctx.synchronize()
    [finding] = rc.findings
    assert finding.kind == "write-after-write"
    assert (finding.first.stream, finding.first.site[1]) == (s2, first)
    assert (finding.second.stream, finding.second.site[1]) == (s1, second)


def test_an_event_not_waited_for_yet_orders_after_a_retirement(lib):
    s1, s2, s3 = cuctx.Stream(), cuctx.Stream(), cuctx.Stream()
    x = cuctx.empty(N, np.float32, stream=s1)
    cuctx.synchronize()
    with cuctx.racecheck("collect") as rc:
        x.fill(1.0, stream=s1)
        written = s1.record()
        s3.synchronize()  # the host saw s3 finish, nothing of s1
        retire_history()
        s2.wait(written)
        x.fill(2.0, stream=s2)
        x.fill(3.0, stream=s1)  # but this one is not ordered after s2's
        cuctx.synchronize()
    assert [(f.kind, f.first.stream, f.second.stream) for f in rc.findings] == [
        ("write-after-write", s2, s1)
    ]


def test_the_legacy_streams_barrier_holds_after_its_clock_retired(lib):
    blocking = cuctx.Stream(non_blocking=False)
    x = cuctx.zeros(N, np.float32)
    cuctx.synchronize()
    with cuctx.racecheck("collect") as rc:
        x.fill(1.0)  # the legacy stream
        cuctx.synchronize()
        retire_history()
        x.fill(2.0)  # the legacy stream again
        x.fill(3.0, stream=blocking)  # a blocking stream waits for the legacy stream
        cuctx.synchronize()
    assert rc.findings == []


def test_a_query_that_answered_done_orders_like_a_synchronize(lib):
    s1, s2 = cuctx.Stream(), cuctx.Stream()
    x = cuctx.empty(N, np.float32, stream=s1)
    cuctx.synchronize()
    with cuctx.racecheck("collect") as rc:
        x.fill(1.0, stream=s1)
        written = s1.record()
        while not written.done:
            pass
        x.fill(2.0, stream=s2)  # the host saw the first fill finish
        while not s2.done:
            pass
        x.fill(3.0, stream=s1)  # and the second
        cuctx.synchronize()
        x.fill(4.0, stream=s1)
        line = here() + 1
        x.fill(5.0, stream=s2)  # no query, no synchronize: a race
        cuctx.synchronize()
    assert [(f.kind, f.second.site[1]) for f in rc.findings] == [("write-after-write", line)]


# -- bounded ---------------------------------------------------------------------------------


def held_by_the_checker() -> int:
    """Bytes of what the checker's history holds (its tables and what they hold but the
    program's own objects: streams, events, code), object by object (sys.getsizeof)."""
    own = (dict, list, tuple, set, int, str, weakref.ref, Region, Segment, Actor, Clocks)
    roots = [
        _WATCH.clocks,
        _WATCH._regions,
        _WATCH._starts,
        _WATCH._freed,
        _WATCH._freed_starts,
        _WATCH._events,
        _WATCH._whats,
        _WATCH._graph_checked.data,
    ]
    seen: set[int] = set()
    total = 0
    while roots:
        obj = roots.pop()
        if id(obj) in seen or not isinstance(obj, own):
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        if not isinstance(obj, weakref.ref):  # (its referent is the program's)
            roots += gc.get_referents(obj)
    return total


def test_100k_operations_leave_the_default_checker_under_a_mebibyte(sim):
    """The sim's default checker ("warn") hears 100k operations of a loop (a temporary made,
    filled and freed, two launches on long-lived arrays, an event between two streams, a
    synchronize every fourth round, a new stream now and then), announced on the trace as
    cuctx's calls announce them (the sim's own work, which costs far more, is left out):
    what it holds grows by less than 1 MiB."""
    kernel = cuctx.Library.from_source(ADD_SOURCE, sim_kernels={"add": add})["add"]
    with cuctx.Device(0) as ctx:
        assert _WATCH.on and _WATCH.backend is sim  # the whole run's checker, on by default
        out, x = add_arrays(256)
        legacy, side = cuctx.legacy_stream(), cuctx.Stream()
        launcher = kernel[1, 256]
        args = (out, x, 1.0, 256)
        plan = launcher._packer.plan(args)
        addresses = itertools.count(1 << 52, 4096)  # never reused, as the sim's after a release
        before = held_by_the_checker()
        operations = 0
        for round_ in itertools.count():
            temporary = next(addresses)
            _trace.emit("alloc", ctx, legacy, (_trace.Access(temporary, 1024, "w"),))
            _trace.emit("memset", ctx, legacy, (_trace.Access(temporary, 1024, "w"),))
            _trace.emit("memset", ctx, legacy, (_trace.Access(temporary, 1024, "w"),))
            _trace.emit_launch(launcher, args, plan)
            event = cuctx.Event()
            _trace.emit("record", ctx, legacy, event=event)
            _trace.emit("wait_event", ctx, side, event=event)
            _trace.emit_launch(launcher, args, plan)
            _trace.emit("free", ctx, legacy, (_trace.Access(temporary, 1024, "w"),))
            operations += 8
            if round_ % 4 == 0:
                _trace.emit("sync_context", ctx, None)
                operations += 1
            if round_ % 64 == 0:
                side = cuctx.Stream()
            if operations >= 100_000:
                break
        grown = held_by_the_checker() - before
        cuctx.synchronize()
    assert grown < 1 << 20, f"{grown} bytes"
    assert len(_WATCH._freed) <= _racecheck.FREES_KEPT
    assert len(_WATCH.clocks) < 16 and len(_WATCH._events) < 1024


def test_a_loop_of_real_calls_keeps_a_flat_history(sim, monkeypatch):
    """The same loop made of cuctx's calls on the sim, fewer rounds (the sim's work costs
    more), with fewer frees kept: after the first 200 rounds, the next 400 add next to
    nothing to what the checker holds (it grew by about 1 KiB a round when nothing was
    retired)."""
    monkeypatch.setattr(_racecheck, "FREES_KEPT", 16)
    kernel = cuctx.Library.from_source(ADD_SOURCE, sim_kernels={"add": add})["add"]

    def rounds(count: int) -> None:
        for round_ in range(count):
            temporary = cuctx.zeros(256, np.float32)
            temporary.fill(1.0)
            kernel[1, 256](out, temporary, 1.0, 256)
            side.wait(cuctx.legacy_stream().record())
            kernel[1, 256, 0, side](x, out, 1.0, 256)
            cuctx.legacy_stream().wait(side)
            del temporary
            if round_ % 4 == 0:
                cuctx.synchronize()

    with cuctx.Device(0):
        out, x = add_arrays(256)
        side = cuctx.Stream()
        rounds(200)
        before = held_by_the_checker()
        rounds(400)
        grown = held_by_the_checker() - before
        cuctx.synchronize()
    assert grown < 32 << 10, f"{grown} bytes"
    assert len(_WATCH._freed) <= 16


def test_a_dropped_stream_is_not_kept_by_the_frees_the_checker_remembers(lib):
    """The checker remembers the latest frees (to tell a use after free), not their streams:
    a stream the program drops goes (and with it what it holds, its context), and a later
    use after free names it as dropped."""
    s = cuctx.Stream()
    x = cuctx.empty(N, np.float32, stream=s)
    out = cuctx.zeros(N, np.float32)

    class Foreign:  # another library's view of x's memory: it does not keep x's memory alive
        __cuda_array_interface__ = {
            "version": 3,
            "shape": (N,),
            "typestr": "<f4",
            "data": (x.ptr, False),
            "strides": None,
            "stream": None,
        }

    view = cuctx.asarray(Foreign())
    described = f"<Stream {s.kind} {s._key:#x} ctx {s._ctx._key:#x}>"
    cuctx.synchronize()
    with cuctx.racecheck("collect") as rc:
        x.fill(1.0, stream=s)
        del x  # freed on s
        s.synchronize()
        gone = weakref.ref(s)
        del s
        gc.collect()
        assert gone() is None, "the checker kept a stream the program dropped"
        lib["add"][1, 1](out, view, 1.0, 0)  # (n = 0: it reads nothing)
        cuctx.synchronize()
    [finding] = rc.findings
    assert finding.kind == "use after free"
    assert f"freed on {described} (dropped since)" in finding.missing
