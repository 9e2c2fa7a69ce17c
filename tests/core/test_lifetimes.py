"""Owners of queued work (_lifetimes): a stream's queue drops a host function once it ran and
its kept objects once the stream is idle; a graph's owner keeps its host functions for every
replay until released; no driver query while a stream captures; contexts call their teardown
callbacks."""

from __future__ import annotations

import weakref

import numpy as np
import pytest

import cuctx
from cuctx import Context, Stream, _lifetimes


class _Standin:
    """Stands for the Context a queue serves, in tests of a queue alone."""


ANY_CONTEXT = _Standin()


def test_a_graph_owner_keeps_its_host_functions_for_every_replay():
    owner = _lifetimes.GraphOwner((-1, 7))
    calls = []
    key = owner.add_host_function(calls.append, ("node",), False)
    owner.keep(kept := object())
    for _ in range(3):  # the driver calls the host node's function on each replay
        _lifetimes._run_host_func(key)
    assert calls == ["node"] * 3 and key in _lifetimes._pending
    owner.release()  # the graph executable is destroyed
    assert key not in _lifetimes._pending and kept not in owner._kept
    _lifetimes._run_host_func(key)  # a stale key runs nothing
    assert len(calls) == 3


def test_a_graph_host_functions_failures_are_filed_under_its_owner():
    owner = _lifetimes.GraphOwner((-2, 1))
    key = owner.add_host_function(int, ("x",), False)
    _lifetimes._run_host_func(key)
    _lifetimes._run_host_func(key)
    failures = _lifetimes.take_failures(lambda k: k == (-2, 1))
    assert [type(exc) for _, exc in failures] == [ValueError, ValueError]
    owner.release()


def test_a_stream_queue_drops_a_host_function_once_it_ran():
    owner = _lifetimes.StreamQueue((-3, 1), ANY_CONTEXT)
    calls = []
    key = owner.add_host_function(calls.append, (1,), False)
    _lifetimes._run_host_func(key)
    _lifetimes._run_host_func(key)
    assert calls == [1] and key not in _lifetimes._pending


def test_no_idle_query_while_a_capture_is_active(monkeypatch):
    """A query of any stream invalidates an active capture (global and thread-local modes,
    measured on an H100), so no queue asks while one is active, its own stream's or not."""
    owner = _lifetimes.StreamQueue((-4, 1), ANY_CONTEXT)

    def idle():
        raise AssertionError("queried while capturing")

    monkeypatch.setitem(_lifetimes.capturing, (-4, 2), object())  # another stream captures
    for i in range(3 * _lifetimes.HOLD_CHECK):
        owner.keep(i, idle)
    assert len(owner._kept) == 3 * _lifetimes.HOLD_CHECK
    monkeypatch.undo()
    owner.keep("last", lambda: True)  # no capture: asked, idle, so everything goes
    assert owner._kept == []


def test_a_stream_is_not_queried_for_its_host_arrays_while_a_capture_is_active(sim, monkeypatch):
    with cuctx.Device(0) as ctx:
        stream, capturing = Stream(), Stream()
        monkeypatch.setitem(_lifetimes.capturing, (ctx._key, capturing._key), object())

        def refuse(*args):
            raise AssertionError("cuStreamQuery while a capture is active")

        monkeypatch.setattr(sim.driver, "cuStreamQuery", refuse)
        for i in range(2 * _lifetimes.HOLD_CHECK):
            stream._hold(i)
        monkeypatch.undo()
        assert _lifetimes.holds(ctx._key, stream._key)
        stream.synchronize()  # idle: the queue goes
        assert not _lifetimes.holds(ctx._key, stream._key)


def test_teardown_callbacks_run_once_when_the_context_is_destroyed(sim):
    ctx = Context.create(0)
    Context.pop()
    seen = []
    ctx._on_teardown(seen.append)
    ctx._on_teardown(seen.append)  # registered once
    ctx.destroy()
    assert seen == [ctx]


def test_a_destroyed_context_drops_its_queues(sim):
    ctx = Context.create(0)
    try:
        stream = Stream()
        stream._hold(object())
        assert _lifetimes.holds(ctx._key, stream._key)
    finally:
        Context.pop()
    ctx.destroy()
    assert not _lifetimes.holds(ctx._key, stream._key)
    with pytest.raises(cuctx.ContextDestroyedError):
        stream.synchronize()


def test_a_stream_collected_after_its_context_went_leaves_the_next_contexts_queue(sim, monkeypatch):
    """The driver may give a destroyed context's handles to the next context it makes. A
    stream of the destroyed one collected later (from a reference cycle, say) must leave the
    new context's queue alone: taking it let go of a pinned array whose copy was queued."""

    class Pinned:  # (stands for a host array a queued copy reads)
        pass

    old = Context.create(0)
    Context.pop()
    old.destroy()
    with cuctx.Device(0) as ctx:
        stream = Stream()
        array = Pinned()
        alive = weakref.ref(array)
        stream._hold(array)
        del array
        monkeypatch.setattr(old, "_key", ctx._key)  # (its handle went to the new context)
        _lifetimes._destroy_stream(sim.driver, stream._handle, old)  # its stream, late
        assert _lifetimes.holds(ctx._key, stream._key) and alive() is not None
        stream.synchronize()
        assert alive() is None


def test_an_idle_query_lets_go_only_of_what_was_kept_before_it():
    """The driver's query releases the GIL: an object another thread keeps meanwhile belongs
    to work the query did not see, and stays."""
    owner = _lifetimes.StreamQueue((-5, 1), ANY_CONTEXT)
    for i in range(_lifetimes.HOLD_CHECK):
        owner.keep(i)

    def idle():
        owner.keep("queued while the driver answered")
        return True

    owner.keep("last", idle)
    assert owner._kept == ["queued while the driver answered"]


def _copy_from_pinned(device_array, stream) -> weakref.ref:
    """Queue an asynchronous copy from a new page-locked array, dropping the caller's only
    reference to it: what stays is the stream's hold."""
    host = cuctx.pinned_empty(device_array.shape, np.float32)
    host[:] = 1.0
    device_array.copy_from(host, stream)
    return weakref.ref(host)


@pytest.mark.paths("python", "native")
def test_a_synchronize_keeps_a_host_array_another_thread_queued_while_it_waited(backend):
    with cuctx.Device(0):
        stream = Stream()
        device_array = cuctx.zeros(1 << 16, np.float32, stream=stream)
        early = _copy_from_pinned(device_array, stream)
        assert early() is not None  # the copy may still run: the stream keeps its host array
        wait = stream._sync
        late = []

        def wait_while_another_thread_copies(handle):
            result = wait(handle)  # the driver waits without the GIL
            late.append(_copy_from_pinned(device_array, stream))
            return result

        stream._sync = wait_while_another_thread_copies
        stream.synchronize()
        stream._sync = wait
        assert early() is None  # the wait covered its copy
        assert late[0]() is not None  # queued after the wait began: it may still run
        stream.synchronize()
        assert late[0]() is None
        assert (device_array.to_host() == 1.0).all()


def test_a_stream_found_done_lets_go_of_its_host_arrays(backend):
    with cuctx.Device(0):
        stream = Stream()
        device_array = cuctx.empty(1 << 12, np.float32, stream=stream)
        kept = _copy_from_pinned(device_array, stream)
        while not stream.done:
            pass
        assert kept() is None


@pytest.mark.parametrize("wait", ["Context.synchronize", "Device.synchronize", "cuctx.synchronize"])
def test_a_context_or_device_synchronize_lets_go_of_every_streams_host_arrays(backend, wait):
    with cuctx.Device(0) as ctx:
        streams = [Stream(), Stream(), cuctx.current_stream()]
        arrays = [cuctx.empty(1 << 12, np.float32) for _ in streams]
        kept = [_copy_from_pinned(a, s) for a, s in zip(arrays, streams)]
        assert all(ref() is not None for ref in kept)
        {
            "Context.synchronize": ctx.synchronize,
            "Device.synchronize": ctx.device.synchronize,
            "cuctx.synchronize": cuctx.synchronize,
        }[wait]()
        assert [ref() for ref in kept] == [None] * 3
