"""Events on every backend: recording, host waits, timing, and misuse; exact virtual times
on the sim."""

import gc

import pytest

import cuctx
from cuctx import Context, ContextDestroyedError, Device, Event, Stream

from conftest import busy
from scenarios import Handoff

pytestmark = pytest.mark.paths()


def test_an_event_belongs_to_the_current_context(backend):
    with Device(0) as ctx:
        event = Event()
        assert event.context is ctx and event.device is Device(0)
        assert not event.timing and not event.recorded
        assert event.done  # an event never recorded stands for no work, as in CUDA
        assert Event(timing=True).timing


def test_record_then_synchronize_waits_for_the_work_before_it(backend):
    with Device(0):
        stream = Stream()
        box = []
        busy(stream, 10)
        stream.launch_host_func(box.append, "done")
        event = Event().record(stream)
        assert event.recorded
        event.synchronize()
        assert box == ["done"] and event.done
        stream.synchronize()


def test_record_on_the_current_stream_by_default(backend):
    with Device(0):
        stream = Stream()
        box = []
        with stream:
            busy(stream, 5)
            stream.launch_host_func(box.append, 1)
            event = Event().record()
        event.synchronize()
        assert box == [1]


def test_stream_record_makes_an_event(backend):
    with Device(0):
        stream = Stream()
        event = stream.record()
        assert isinstance(event, Event) and event.recorded and event.context is stream.context
        again = stream.record(event)
        assert again is event
        event.synchronize()


def test_rerecording_moves_the_event_but_not_earlier_waits(backend):
    with Device(0):
        a, b = Stream(), Stream()
        box, seen = ["first"], []
        event = a.record()
        b.wait(event)  # waits for the state captured now: nothing queued on a yet
        busy(a, 10)
        a.launch_host_func(box.__setitem__, 0, "second")
        event.record(a)
        b.wait(event)
        b.launch_host_func(lambda: seen.append(box[0]))
        b.synchronize()
        assert seen == ["second"]


def test_elapsed_time_between_timing_events(backend):
    with Device(0):
        stream = Stream()
        start, end = Event(timing=True), Event(timing=True)
        start.record(stream)
        busy(stream, 20)
        end.record(stream)
        ms = start.elapsed_ms(end)  # waits for both
        assert ms == end - start
        if stream._backend.name == "cuda":
            assert ms >= 15  # the host function slept 20 ms between the two markers


def test_elapsed_time_is_exact_on_the_sims_virtual_clock(sim):
    with Device(0):
        stream = Stream()
        start, end = Event(timing=True), Event(timing=True)
        start.record(stream)
        busy(stream, 1.5)
        err = sim.driver._enqueue(stream._handle, lambda: None, cost_ns=1_000_000)  # 1 ms
        assert not err
        end.record(stream)
        assert end - start == 2.5
        mid = Event(timing=True)
        mid.record(stream)  # nothing queued between: no time passes
        assert end - mid == 0.0 == end.elapsed_ms(mid)


def test_virtual_time_across_streams_follows_the_waits(sim):
    with Device(0):
        a, b = Stream(), Stream()
        start = Event(timing=True).record(a)
        busy(a, 3)
        b.wait(a)
        busy(b, 1)
        end = Event(timing=True).record(b)
        assert end - start == 4.0  # b's work started when a's finished


def test_the_host_clock_moves_on_when_it_synchronizes(sim):
    with Device(0):
        stream = Stream()
        first = Event(timing=True).record(stream)
        busy(stream, 2)
        stream.synchronize()
        other = Stream()  # new work cannot start before the host submitted it
        second = Event(timing=True).record(other)
        assert second - first == 2.0


def test_event_queries_advance_the_sim(sim):
    with Device(0):
        stream = Stream()
        ran = []
        stream.launch_host_func(ran.append, 1)
        event = stream.record()
        assert not event.done and ran == [1]  # each query runs one more op, then answers
        assert event.done


def test_events_of_two_devices_can_be_waited_on(backend):
    if len(cuctx.devices()) < 2:
        pytest.skip("needs two devices")
    with Device(1):
        producer = Stream()
        handoff = Handoff(producer, 10)
        ready = producer.record()
    with Device(0):
        consumer = Stream()
        consumer.wait(ready)
        seen = handoff.seen_by(consumer)
    assert seen == ["new"]


# -- misuse -------------------------------------------------------------------------------


def test_elapsed_time_needs_timing_events(backend):
    with Device(0):
        stream = Stream()
        plain, timed = Event().record(stream), Event(timing=True).record(stream)
        with pytest.raises(ValueError, match="start event .* does not measure time"):
            plain.elapsed_ms(timed)
        with pytest.raises(ValueError, match="end event .* does not measure time"):
            plain - timed
        with pytest.raises(TypeError, match="needs an end Event"):
            timed.elapsed_ms(3.0)


def test_unrecorded_events_cannot_be_waited_on_or_timed(backend):
    with Device(0):
        stream = Stream()
        never = Event(timing=True)
        recorded = Event(timing=True).record(stream)
        with pytest.raises(ValueError, match="never recorded"):
            never.synchronize()
        with pytest.raises(ValueError, match="never recorded"):
            stream.wait(never)
        with pytest.raises(ValueError, match="never recorded"):
            never.elapsed_ms(recorded)
        with pytest.raises(ValueError, match="never recorded"):
            recorded - never


def test_recording_on_a_stream_of_another_context_is_refused(backend):
    with Device(0):
        event = Event()
    created = Context.create(Device(0))
    try:
        stream = Stream()
        with pytest.raises(
            ValueError, match="the event belongs to .* create the event in the stream's context"
        ):
            stream.record(event)
        with pytest.raises(ValueError, match="belongs to"):
            event.record(stream)
        with pytest.raises(TypeError, match="takes a cuctx.Stream"):
            event.record(stream.handle)
        with pytest.raises(TypeError, match="takes an Event or None"):
            stream.record("event")
    finally:
        created.destroy()


def test_ipc_events_cannot_time(backend):
    with Device(0):
        with pytest.raises(ValueError, match="ipc event cannot measure time"):
            Event(timing=True, ipc=True)
        Event(ipc=True, blocking=True).record(Stream()).synchronize()
        event = Event(ipc=True)
        with pytest.raises(ValueError, match="does not measure time"):
            event.elapsed_ms(event)


def test_an_ipc_event_may_be_recorded_by_another_process_so_waits_are_not_refused(backend):
    """Another process may have recorded it (tests/memory/test_pickle.py): cuctx cannot tell
    it was never recorded, and the driver treats a never-recorded event as complete."""
    with Device(0):
        event = Event(ipc=True)
        assert event.ipc and not event.timing and repr(event).startswith("<Event ipc ")
        stream = Stream()
        stream.wait(event)
        event.synchronize()
        assert event.done
        assert not Event().ipc


def test_events_of_a_destroyed_context_raise(backend):
    ctx = Context.create(Device(0))
    event = Stream().record()
    ctx.destroy()
    with pytest.raises(ContextDestroyedError):
        event.synchronize()
    with pytest.raises(ContextDestroyedError):
        _ = event.done
    with Device(0):
        with pytest.raises(ContextDestroyedError):
            Stream().wait(event)
    del event
    gc.collect()  # the finalizer must not hand the driver a destroyed context's event


def test_recording_an_event_of_a_destroyed_context_says_so(backend):
    created = Context.create(0)
    event = cuctx.Event()
    created.destroy()
    with Device(0):
        stream = cuctx.Stream()
        for record in (lambda: event.record(stream), lambda: stream.record(event), event.record):
            with pytest.raises(ContextDestroyedError, match="destroyed by Context.destroy"):
                record()


def test_elapsed_time_between_events_of_two_devices_is_refused(backend):
    devices = cuctx.devices()
    if len(devices) < 2:
        pytest.skip(f"needs two devices; the {backend.name} backend has {len(devices)}")
    events = []
    for device in devices[:2]:
        with device:
            events.append(cuctx.Stream().record(cuctx.Event(timing=True)))
    with pytest.raises(ValueError, match="events of two devices"):
        events[0].elapsed_ms(events[1])


def test_the_default_stream_of_record_is_the_events_contexts(backend):
    created = Context.create(0)
    try:
        event = cuctx.Event()
        with Device(0):  # another context of the device is current
            event.record()  # on the created context's stream, not the current one
        event.synchronize()
    finally:
        created.destroy()


class MyEvent(cuctx.Event):
    pass


class MyStream(cuctx.Stream):
    pass


def test_subclasses_of_event_and_stream_work_where_the_classes_do(backend):
    with Device(0):
        stream, other = MyStream(), MyStream()
        event = MyEvent(timing=True)
        assert stream.record(event) is event
        assert event.record(other) is event
        other.wait(event)
        stream.wait(other)
        cuctx.Stream().wait(stream)
        end = stream.record(MyEvent(timing=True))
        assert isinstance(event.elapsed_ms(end), float) and isinstance(end - event, float)
        with stream:
            assert cuctx.current_stream() is stream
        stream.synchronize()
