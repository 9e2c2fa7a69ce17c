"""Streams on every backend: ordering, waits across streams, host functions, the current
stream, default streams, adoption of other libraries' streams, and misuse. The sim's
asynchrony (stale reads without a wait, seeded interleaving) is tested on the sim alone."""

import gc
import threading

import pytest

import cuctx
import cuctx.sim
from cuctx import Context, ContextDestroyedError, ContextPoisonedError, Device, Stream

from conftest import busy, fresh
from scenarios import Handoff, run_python

pytestmark = pytest.mark.paths()


# -- creating streams ---------------------------------------------------------------------


def test_stream_belongs_to_the_current_context(backend):
    with Device(0) as ctx:
        stream = Stream()
        assert stream.context is ctx and stream.device is Device(0)
        assert stream.kind == "created" and stream.priority == 0
        assert stream.handle not in (0, 1, 2)
        assert stream.__cuda_stream__() == (0, stream.handle)


def test_stream_of_a_device_uses_its_primary_context_when_another_is_current(backend):
    device = cuctx.devices()[-1]
    with Device(0):
        stream = device.create_stream()
        assert stream.device is device and stream.context is device.primary_context
    created = Context.create(Device(0))
    try:
        assert Stream(Device(0)).context is created  # the current context is on that device
    finally:
        created.destroy()


def test_priorities_in_range_are_kept_and_others_rejected(backend):
    with Device(0):
        assert Stream(priority=-5).priority == -5
        assert Stream(priority=0).priority == 0
        with pytest.raises(ValueError, match=r"priority 1 is outside the range .* 0 .* to -5"):
            Stream(priority=1)
        with pytest.raises(ValueError, match=r"priority -6 is outside"):
            Stream(priority=-6)
        with pytest.raises(TypeError, match="priority must be an int"):
            Stream(priority=1.5)


def test_a_stream_without_a_current_context_uses_device_0(backend):
    stream = Stream()  # lazily initialises like the runtime: device 0's primary context
    try:
        assert stream.device is Device(0)
        stream.synchronize()
    finally:
        cuctx.Context.pop()


# -- ordering and waits -------------------------------------------------------------------


def test_work_on_one_stream_runs_in_order(backend):
    with Device(0):
        stream = Stream()
        order = []
        for i in range(5):
            busy(stream, 1)
            stream.launch_host_func(order.append, i)
        stream.synchronize()
        assert order == [0, 1, 2, 3, 4]
        assert stream.done


def test_wait_on_an_event_orders_two_streams(backend):
    with Device(0):
        producer, consumer = Stream(), Stream()
        handoff = Handoff(producer)
        ready = producer.record()
        consumer.wait(ready)
        assert handoff.seen_by(consumer) == ["new"]


def test_wait_on_a_stream_orders_two_streams(backend):
    with Device(0):
        producer, consumer = Stream(), Stream()
        handoff = Handoff(producer)
        consumer.wait(producer)
        assert handoff.seen_by(consumer) == ["new"]


def test_a_wait_covers_only_work_queued_before_it(backend):
    with Device(0):
        a, b = Stream(), Stream()
        order = []
        a.launch_host_func(order.append, "a1")
        b.wait(a)
        b.launch_host_func(order.append, "b1")
        b.synchronize()
        assert order == ["a1", "b1"]
        a.synchronize()


def test_host_functions_across_streams_follow_the_waits(backend):
    with Device(0):
        streams = [Stream() for _ in range(3)]
        order = []
        for i, stream in enumerate(streams):
            if i:
                stream.wait(streams[i - 1])
            busy(stream, 5)
            stream.launch_host_func(order.append, i)
        streams[-1].synchronize()
        assert order == [0, 1, 2]


def test_streams_of_two_devices_can_wait_on_each_other(backend):
    if len(cuctx.devices()) < 2:
        pytest.skip("needs two devices")
    with Device(1):
        producer = Stream()
        handoff = Handoff(producer, 10)
    with Device(0):
        consumer = Stream()
        consumer.wait(producer)  # cross-device waits are legal in CUDA
        seen = handoff.seen_by(consumer)
    assert seen == ["new"]


def test_a_blocking_stream_waits_for_the_legacy_default_stream(backend):
    with Device(0):
        legacy = cuctx.legacy_stream()
        blocking = Stream(non_blocking=False)
        handoff = Handoff(legacy, 10)
        assert handoff.seen_by(blocking) == ["new"]  # implicitly ordered after it
        legacy.synchronize()


# -- host functions -----------------------------------------------------------------------


def test_a_failing_host_function_is_reported_at_the_next_synchronize(backend):
    with Device(0):
        stream = Stream()
        ran = []

        def broken():
            raise KeyError("lost key")

        stream.launch_host_func(broken)
        stream.launch_host_func(ran.append, "after")  # the stream keeps going
        with pytest.raises(
            cuctx.HostFunctionError, match=r"broken raised KeyError\('lost key'\)"
        ) as info:
            stream.synchronize()
        assert isinstance(info.value.__cause__, KeyError)
        assert ran == ["after"]
        stream.synchronize()  # reported once


def test_host_function_arguments_stay_alive_until_it_ran(backend):
    with Device(0):
        stream = Stream()
        seen = []

        class Payload:
            value = 42

        busy(stream, 5)
        stream.launch_host_func(lambda p: seen.append(p.value), Payload())
        gc.collect()
        stream.synchronize()
        assert seen == [42]


def test_launch_host_func_needs_a_callable(backend):
    with Device(0):
        with pytest.raises(TypeError, match="needs a callable"):
            Stream().launch_host_func(42)


# -- the current stream -------------------------------------------------------------------


def test_with_stream_makes_it_current_and_restores(backend):
    device = Device(0)
    with device:
        default = cuctx.current_stream()
        assert default == cuctx.legacy_stream() and default.kind == "legacy"
        outer, inner = device.create_stream(), device.create_stream()
    with outer:
        assert cuctx.current_stream() is outer
        assert cuctx.current_context() is outer.context
        with inner:
            assert cuctx.current_stream(device) is inner
        assert cuctx.current_stream() is outer
    assert cuctx.current_context() is None
    assert cuctx.current_stream(device).kind == "legacy"  # (lazy init: the device is current)
    assert Context.pop() is device.primary_context


def test_with_stream_restores_after_an_exception(backend):
    with Device(0):
        stream = Stream()
    with pytest.raises(RuntimeError):
        with stream:
            raise RuntimeError("boom")
    assert cuctx.current_context() is None
    with Device(0):
        assert cuctx.current_stream().kind == "legacy"


def test_the_current_stream_is_per_thread(backend):
    with Device(0):
        stream = Stream()
    with stream:
        other = []
        t = threading.Thread(target=lambda: other.append(cuctx.current_stream(Device(0)).kind))
        t.start()
        t.join()
        assert other == ["legacy"]
        assert cuctx.current_stream() is stream


def test_per_thread_default_stream_can_be_selected(backend):
    with Device(0):
        ptds = cuctx.per_thread_stream()
        assert ptds.handle == 2 and ptds.kind == "per-thread"
        with ptds:
            assert cuctx.current_stream() is ptds
            order = []
            ptds.launch_host_func(order.append, 1)
            ptds.synchronize()
            assert order == [1]


def test_default_streams_work_when_another_context_is_current(backend):
    with Device(0):
        legacy = cuctx.legacy_stream()
    created = Context.create(Device(0))
    try:
        order = []
        legacy.launch_host_func(order.append, "primary")
        legacy.synchronize()
        assert order == ["primary"] and legacy.context is Device(0).primary_context
        assert cuctx.current_context() is created
    finally:
        created.destroy()


def test_resolve_stream_rejects_a_stream_of_another_context(backend):
    from cuctx.stream import resolve_stream

    with Device(0) as primary:
        stream = Stream()
    created = Context.create(Device(0))
    try:
        with pytest.raises(ValueError, match="use a stream of the same context"):
            resolve_stream(stream, created, "copy")
        assert resolve_stream(None, created, "copy").kind == "legacy"
        assert resolve_stream(stream, primary, "copy") is stream
    finally:
        created.destroy()


# -- adopting streams ---------------------------------------------------------------------


def test_wrap_adopts_protocol_objects_and_raw_handles(backend):
    with Device(0):
        stream = Stream()

        class Foreign:
            def __cuda_stream__(self):
                return (0, stream.handle)

        adopted = Stream.wrap(Foreign())
        assert adopted == stream and adopted.kind == "adopted"
        assert adopted.context is stream.context and adopted.priority == 0
        assert Stream.wrap(stream.handle) == stream
        assert Stream.wrap(0).kind == "legacy"
        order = []
        adopted.launch_host_func(order.append, 1)
        stream.synchronize()
        assert order == [1]
        with pytest.raises(TypeError, match="no __cuda_stream__"):
            Stream.wrap("stream")
    del adopted
    gc.collect()
    stream.synchronize()  # an adopted stream is not owned: collecting it left this one alive


@pytest.mark.gpu
def test_wrap_adopts_a_torch_stream(gpu):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    ts = torch.cuda.Stream()
    stream = Stream.wrap(ts)
    assert stream.handle == ts.cuda_stream and stream.device is Device(0)
    done = []
    stream.launch_host_func(done.append, True)
    ts.synchronize()
    stream.synchronize()
    assert done == [True]


@pytest.mark.gpu
def test_wrap_adopts_a_cupy_stream(gpu):
    cupy = pytest.importorskip("cupy")
    cs = cupy.cuda.Stream(non_blocking=True)
    stream = Stream.wrap(cs.ptr)
    assert stream.device is Device(0)
    stream.synchronize()


# -- misuse and lifetime ------------------------------------------------------------------


def test_wait_rejects_what_is_not_an_event_or_stream(backend):
    with Device(0):
        with pytest.raises(TypeError, match="takes an Event or a Stream"):
            Stream().wait(42)


def test_streams_of_a_destroyed_context_raise(backend):
    ctx = Context.create(Device(0))
    stream = Stream()
    event = stream.record()
    ctx.destroy()
    for use in (
        stream.synchronize,
        lambda: stream.done,
        stream.record,
        lambda: stream.wait(event),
        lambda: stream.launch_host_func(print),
        lambda: stream.__enter__(),
    ):
        with pytest.raises(ContextDestroyedError):
            use()
    with Device(0):
        with pytest.raises(ContextDestroyedError):
            Stream().wait(stream)
    stream = None  # (the lambdas above read `stream`: rebind rather than del)
    gc.collect()  # the finalizer must not hand the driver a destroyed context's stream


def test_streams_after_device_reset_raise(backend):
    with Device(0):
        stream = Stream()
    Device(0).reset()
    with pytest.raises(ContextDestroyedError, match=r"device\.reset\(\)"):
        stream.synchronize()


def test_a_stream_keeps_its_context_alive(backend):
    ctx_handle = None

    def make():
        nonlocal ctx_handle
        ctx = Context.create(Device(0))
        ctx_handle = ctx.handle
        stream = Stream()
        Context.pop()
        return stream

    stream = make()
    gc.collect()
    assert stream.context.handle == ctx_handle and stream.context.state == "active"
    stream.synchronize()
    stream.context.destroy()


# -- the sim's asynchrony ----------------------------------------------------------------


def test_missing_wait_reads_stale_data_in_the_sim(sim):
    with Device(0):
        producer, consumer = Stream(), Stream()
        handoff = Handoff(producer, 1)
        assert handoff.seen_by(consumer) == ["old"]  # forgot consumer.wait(producer)
        producer.synchronize()
        assert handoff.box == ["new"]


def test_missing_wait_is_stale_even_when_the_context_synchronizes(sim):
    with Device(0) as ctx:
        producer, consumer = Stream(), Stream()
        box, seen = ["old"], []
        busy(producer, 1)
        producer.launch_host_func(box.__setitem__, 0, "new")
        consumer.launch_host_func(lambda: seen.append(box[0]))
        ctx.synchronize()  # the read finishes first on the virtual clock
        assert seen == ["old"] and box == ["new"]


def test_nothing_runs_until_something_forces_it(sim):
    with Device(0):
        stream = Stream()
        ran = []
        stream.launch_host_func(ran.append, 1)
        stream.launch_host_func(ran.append, 2)
        assert ran == []
        assert not stream.done and ran == [1]  # each query runs one more op, then answers
        assert stream.done and ran == [1, 2]


def _race(seed: int, monkeypatch) -> list:
    monkeypatch.setenv("CUCTX_SIM_SEED", str(seed))
    fresh("sim")
    with Device(0) as ctx:
        order = []
        for name in "ab":
            Stream().launch_host_func(order.append, name)
        ctx.synchronize()
    return order


def test_independent_streams_interleave_in_a_seeded_order(sim, monkeypatch):
    orders = {seed: _race(seed, monkeypatch) for seed in range(12)}
    assert {tuple(o) for o in orders.values()} == {("a", "b"), ("b", "a")}
    assert all(_race(seed, monkeypatch) == orders[seed] for seed in range(12))


def test_destroying_a_stream_keeps_its_queued_work(sim):
    with Device(0) as ctx:
        stream = Stream()
        ran = []
        stream.launch_host_func(ran.append, 1)
        del stream
        gc.collect()
        ctx.synchronize()
        assert ran == [1]


def test_a_sticky_fault_poisons_the_streams_of_its_context(sim):
    with Device(0) as ctx:
        stream = Stream()
        ran = []
        stream.launch_host_func(ran.append, 1)
        cuctx.sim.inject_fault(ctx)
        with pytest.raises(cuctx.StickyFaultError):
            stream.synchronize()
        with pytest.raises(ContextPoisonedError):
            stream.synchronize()
        with pytest.raises(ContextPoisonedError):
            stream.record()
    Device(0).reset()


def test_an_op_returning_a_sticky_code_poisons_the_context(sim):
    from cuda.bindings.driver import CUresult

    with Device(0) as ctx:
        stream = Stream()
        err = sim.driver._enqueue(stream._handle, lambda: CUresult.CUDA_ERROR_ILLEGAL_ADDRESS)
        assert err == CUresult.CUDA_SUCCESS  # nothing runs at enqueue time
        ran = []
        stream.launch_host_func(ran.append, 1)
        with pytest.raises(cuctx.StickyFaultError, match="ILLEGAL_ADDRESS"):
            stream.synchronize()
        assert ran == [] and ctx.state == "poisoned"
    Device(0).reset()


def test_a_destroyed_context_leaves_no_host_functions_behind(sim):
    """Host functions queued before a sticky fault never run; destroying the context must
    drop them (and what they keep alive), not keep them forever."""
    from cuctx import _lifetimes as stream_module

    # (Counted from here: an earlier test's sim, dropped whole, may have left host functions
    # filed under the same handles, which the sim gives out again.)
    before = set(stream_module._pending)

    def mine():
        return [
            key
            for key, (_, _, owner, _) in stream_module._pending.items()
            if owner.key[0] == ctx.handle and key not in before
        ]

    ctx = Context.create(0)
    try:
        stream = Stream()
        busy(stream, 5)
        for i in range(3):
            stream.launch_host_func(print, i)
        cuctx.sim.inject_fault(ctx)
        with pytest.raises(cuctx.StickyFaultError):
            ctx.synchronize()
        assert len(mine()) == 3  # they will never run
    finally:
        Context.pop()
    ctx.destroy()
    assert mine() == []
    assert not any(key[0] == ctx.handle for key in stream_module._failures)


def test_exit_with_work_and_host_functions_still_queued_is_silent(backend):
    """Nothing is left to run while the interpreter tears down: on a GPU, host functions
    still queued at exit run first (the driver would call into a dismantled interpreter);
    the sim runs nothing by itself. Either way the exit prints nothing."""
    code = f"""
import time, cuctx
cuctx.set_backend({backend.name!r})
ctx = cuctx.Context.create(0)
stream = cuctx.Stream()
stream.record(cuctx.Event(timing=True))
stream.launch_host_func(time.sleep, 0.2)
stream.launch_host_func(print, "ran")
a = cuctx.zeros(10, stream=stream)
"""
    proc = run_python("-c", code)
    assert proc.returncode == 0 and proc.stderr == ""
    assert proc.stdout == ("ran\n" if backend.name == "cuda" else "")
