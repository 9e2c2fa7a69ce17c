"""Launches in the operation trace: the checked path announces each successful launch with
its kernel, configuration, stream, context and the arrays it may touch; the fast path steps
aside while a sink listens, so none is missed. Sim and GPU."""

from __future__ import annotations

import numpy as np
import pytest

import cuctx
from cuctx import _trace
from cuctx.kernels import _codegen, _plan

from conftest import requires_fast_paths
from scenarios import ADD_SOURCE, add, library_fixture

pytestmark = [pytest.mark.usefixtures("nvrtc_cache"), pytest.mark.paths("python", "native")]

lib = library_fixture(ADD_SOURCE, add=add)


def test_launches_are_announced_with_their_arrays_also_once_a_fast_path_exists(lib):
    out = cuctx.zeros(8, np.float32)
    x = cuctx.to_device(np.arange(8, dtype=np.float32))
    stream = cuctx.Stream()
    launcher = lib["add"][2, 4, 0, stream]
    launcher(out, x, 1.0, 8)  # generates the fast path
    launcher(out, x, 1.0, 8)
    assert (launcher._fast is not None) is _codegen.ENABLED  # (none with CUCTX_FASTPATH=0)
    seen = []
    with _trace.sink(seen.append):
        launcher(out, x, 2.0, 8)
        line = (
            test_launches_are_announced_with_their_arrays_also_once_a_fast_path_exists.__code__.co_firstlineno
            + 10
        )
        launcher(out, x.ptr, 3.0, 8)  # an int is an address of unknown extent: no access
    launcher(out, x, 4.0, 8)  # no sink: not announced
    stream.synchronize()
    assert [op.kind for op in seen] == ["launch", "launch"]
    first, second = seen
    assert first.kernel is lib["add"] and first.stream is stream
    assert first.context is stream.context
    assert (first.config.grid, first.config.block, first.config.shared_mem) == (
        (2, 1, 1),
        (4, 1, 1),
        0,
    )
    # (out is `float*`: read and written; x is `const float*`: read)
    assert first.accesses == (
        _trace.Access(out.ptr, 32, _trace.READ_WRITE, out),
        _trace.Access(x.ptr, 32, _trace.READ, x),
    )
    assert first.site[:2] == (__file__, line)
    assert second.accesses == (_trace.Access(out.ptr, 32, _trace.READ_WRITE, out),)


def test_foreign_arrays_are_announced_with_their_extent(lib):
    out = cuctx.zeros(8, np.float32)
    x = cuctx.to_device(np.arange(8, dtype=np.float32))

    class Foreign:  # another library's array, seen through __cuda_array_interface__
        __cuda_array_interface__ = {
            "version": 3,
            "shape": (4,),
            "typestr": "<f4",
            "data": (x.ptr + 16, False),
            "strides": None,
            "stream": None,
        }

    seen = []
    with _trace.sink(seen.append):
        lib["add"][1, 4](out, Foreign(), 1.0, 4)
    cuctx.current_stream().synchronize()
    [op] = seen
    foreign = op.accesses[1]
    assert (foreign.ptr, foreign.nbytes, foreign.mode) == (x.ptr + 16, 16, _trace.READ)
    assert out.to_host().tolist() == [5.0, 6.0, 7.0, 8.0, 0.0, 0.0, 0.0, 0.0]


def test_a_launch_that_fails_is_not_announced(lib):
    out = cuctx.zeros(8, np.float32)
    x = cuctx.to_device(np.arange(8, dtype=np.float32))
    seen = []
    with _trace.sink(seen.append):
        with pytest.raises(cuctx.KernelArgumentError):
            lib["add"][1, 8](out, x, 1.0, 2**40)
    assert seen == []


@requires_fast_paths
def test_the_fast_path_announces_itself(lib, monkeypatch):
    out = cuctx.zeros(8, np.float32)
    x = cuctx.to_device(np.arange(8, dtype=np.float32))
    launcher = lib["add"][1, 8]
    seen = []
    launcher(out, x, 1.0, 8)  # makes the fast path
    calls = []
    pack = _plan.Plan.pack
    monkeypatch.setattr(_plan.Plan, "pack", lambda *a: (calls.append(1), pack(*a))[1])
    launcher(out, x, 1.0, 8)
    assert calls == []  # no sink: the fast path, which the checked path's packing never sees
    with _trace.sink(seen.append):
        launcher(out, x, 1.0, 8)
    # a sink: still the fast path (compiled or generated), which announces the launch; its
    # accesses are worked out from the plan when the sink asks
    assert calls == [] and len(seen) == 1
    [op] = seen
    assert (op.kind, op.kernel, op.stream) == ("launch", launcher.kernel, launcher.stream)
    assert [(a.ptr, a.nbytes, a.mode) for a in op.accesses] == [
        (out.ptr, 32, _trace.READ_WRITE),
        (x.ptr, 32, _trace.READ),
    ]
    assert op.site[0] == __file__


def test_every_path_announces_a_launch_as_the_reference_does(lib, path):
    """The compiled path builds the launch's Operation in C (a sink meant to stay on, the race
    checker, pays for the announcement at every launch); the Python paths through
    `_trace.emit_launch`, the reference: the same fields, and the user's line."""
    import sys
    import threading

    out = cuctx.zeros(8, np.float32)
    x = cuctx.to_device(np.arange(8, dtype=np.float32))
    stream = cuctx.Stream()
    launcher = lib["add"][2, 4, 0, stream]
    launcher(out, x, 1.0, 8)
    seen, callers = [], []

    def sink(op):
        seen.append(op)
        callers.append(sys._getframe(1).f_code.co_name)

    with _trace.sink(sink, kinds=["launch"]):
        before = _trace.perf_counter_ns()
        launcher(out, x, 2.0, 8)
        line = sys._getframe().f_lineno - 1
        after = _trace.perf_counter_ns()
        args = seen[0].launch[1]
        _trace.emit_launch(launcher, args, seen[0].launch[0])  # the reference, from here
    stream.synchronize()
    made, reference = seen
    # who announced it: compiled code calls the sink straight from the user's frame (with
    # the fast paths on: CUCTX_FASTPATH=0 sends every launch to the checked path)
    compiled = path == "native" and _codegen.ENABLED
    assert callers == [sys._getframe().f_code.co_name if compiled else "emit_launch", "emit_launch"]
    for field in (
        "kind",
        "context",
        "stream",
        "kernel",
        "config",
        "event",
        "other",
        "fields",
        "launch",
        "accesses",
        "thread",
    ):
        assert getattr(made, field) == getattr(reference, field), field
    assert made.site[:2] == (__file__, line) and reference.site[0] == __file__
    assert before <= made.time_ns <= after and made.thread == threading.get_ident()
    assert made.launch[1] == (out, x, 2.0, 8)
