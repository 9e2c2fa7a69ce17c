"""The core operations on the trace: with a sink registered, each public operation is
announced once, with its kind, context, stream, byte extents and modes, and the user's
file:line; with no sink, nothing is built."""

from __future__ import annotations

import gc
import inspect

import numpy as np
import pytest

import cuctx
from cuctx import Stream, _trace


@pytest.fixture
def ops():
    seen: list[_trace.Operation] = []
    with _trace.sink(seen.append):
        yield seen


def here() -> int:
    """The line of the caller (the line with the operation on it)."""
    return inspect.currentframe().f_back.f_lineno


def only(seen, kind):
    found = [op for op in seen if op.kind == kind]
    assert len(found) == 1, [op.kind for op in seen]
    return found[0]


def check_site(op, line):
    assert op.site[0] == __file__ and op.site[1] == line


def test_record_wait_and_synchronize(backend, ops):
    with cuctx.Device(0) as ctx:
        a, b = Stream(), Stream()
        line = here() + 1
        event = a.record()
        op = only(ops, "record")
        assert (op.context, op.stream, op.event) == (ctx, a, event)
        check_site(op, line)
        line = here() + 1
        b.wait(event)
        op = only(ops, "wait_event")
        assert (op.stream, op.event) == (b, event)
        check_site(op, line)
        line = here() + 1
        b.wait(a)
        op = only(ops, "wait_stream")
        assert (op.context, op.stream, op.other) == (ctx, b, a)
        assert [o.kind for o in ops].count("record") == 1  # the internal event is not announced
        check_site(op, line)
        b.synchronize()
        assert only(ops, "sync_stream").stream is b
        event.synchronize()
        op = only(ops, "sync_event")
        assert (op.context, op.event) == (ctx, event)
        line = here() + 1
        ctx.synchronize()
        op = only(ops, "sync_context")
        assert op.context is ctx
        check_site(op, line)
        event.record(b)
        assert [o.stream for o in ops if o.kind == "record"] == [a, b]


def test_a_query_that_answered_done_is_announced_as_a_synchronize(backend, ops):
    with cuctx.Device(0):
        stream = Stream()
        event = stream.record()
        stream.synchronize()
        ops.clear()
        assert event.done and stream.done
        assert [(op.kind, op.fields["query"]) for op in ops] == [
            ("sync_event", True),
            ("sync_stream", True),
        ]
        assert (ops[0].event, ops[1].stream) == (event, stream)


def test_host_functions(backend, ops):
    with cuctx.Device(0) as ctx:
        stream = Stream()
        stream.launch_host_func(print, "hi")
        op = only(ops, "host_func")
        assert (op.context, op.stream, op.fields["fn"]) == (ctx, stream, print)
        stream.synchronize()


def test_allocation_fill_copies_and_free(backend, ops):
    with cuctx.Device(0) as ctx:
        stream = Stream()
        line = here() + 1
        arr = cuctx.empty((4, 8), np.float32, stream=stream)
        op = only(ops, "alloc")
        assert (op.context, op.stream) == (ctx, stream)
        [acc] = op.accesses
        assert (acc.ptr, acc.nbytes, acc.mode) == (arr.ptr, 128, "w")
        check_site(op, line)

        arr.fill(1.5, stream=stream)
        op = only(ops, "memset")
        [acc] = op.accesses
        assert (acc.ptr, acc.nbytes, acc.mode, acc.array) == (arr.ptr, 128, "w", arr)

        host = np.arange(32, dtype=np.float32).reshape(4, 8)
        line = here() + 1
        cuctx.copy(arr, host, stream)
        op = only(ops, "copy")
        src, dst = op.accesses
        assert (src.mode, src.host, src.array, src.nbytes) == ("r", True, host, 128)
        assert src.ptr == host.__array_interface__["data"][0]
        assert (dst.mode, dst.host, dst.ptr, dst.nbytes) == ("w", False, arr.ptr, 128)
        check_site(op, line)
        ops.clear()

        view = arr[1:3, ::2]
        back = np.empty((2, 4), np.float32)
        cuctx.copy(back, view, stream)
        src, dst = only(ops, "copy").accesses
        assert (src.ptr, src.nbytes, src.mode) == (arr.ptr + 32, 2 * 32 - 4, "r")  # strided
        assert (dst.ptr, dst.host, dst.mode) == (back.__array_interface__["data"][0], True, "w")
        ops.clear()

        other = cuctx.empty((4, 8), np.float32, stream=stream)
        cuctx.copy(other, arr, stream)
        src, dst = only(ops, "copy").accesses
        assert (src.ptr, src.mode, dst.ptr, dst.mode) == (arr.ptr, "r", other.ptr, "w")
        ops.clear()

        ptr = arr.ptr
        del arr, view, op, acc, src, dst  # the accesses name the arrays, and keep them
        gc.collect()
        op = only(ops, "free")
        assert (op.stream, op.accesses[0].ptr, op.accesses[0].nbytes) == (stream, ptr, 128)
        stream.synchronize()


def test_copies_between_devices(backend, ops):
    if len(cuctx.devices()) < 2:
        pytest.skip("needs two devices")
    a = cuctx.zeros(16, np.int32, device=0)
    b = cuctx.empty(16, np.int32, device=1)
    a.context.synchronize()  # the zeros are on device 0's stream, the copy on device 1's
    ops.clear()
    cuctx.copy(b, a)
    src, dst = only(ops, "copy").accesses
    assert (src.ptr, src.array, dst.ptr, dst.array) == (a.ptr, a, b.ptr, b)
    cuctx.synchronize()


def test_nothing_is_built_without_a_sink(backend, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("announced with no sink registered")

    monkeypatch.setattr(_trace, "emit", refuse)
    monkeypatch.setattr(_trace, "Access", refuse)
    monkeypatch.setattr(_trace, "device_access", refuse)
    with cuctx.racecheck("off"):  # the sim's checker (a sink) steps aside
        assert not _trace.sinks
        with cuctx.Device(0) as ctx:
            stream = Stream()
            arr = cuctx.to_device(np.arange(8.0), stream=stream)
            arr.fill(2.0, stream=stream)
            out = arr.to_host(stream=stream)
            event = stream.record()
            other = Stream()
            other.wait(event)
            other.wait(stream)
            stream.launch_host_func(len, "")
            stream.synchronize()
            event.synchronize()
            ctx.synchronize()
            del arr
            gc.collect()
        assert (out == 2.0).all()
