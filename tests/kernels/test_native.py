"""The compiled fast path (cuctx._native): it is what launches, records, waits and switches
contexts where it is built; it hands every case it was not made for to the checked Python
path, so both paths raise the same errors with the same messages; CUCTX_NATIVE=0 turns it
off. Sim and GPU (on the sim the compiled code runs too and ends in the sim's driver)."""

from __future__ import annotations

import gc
import inspect
import threading

import numpy as np
import pytest

import cuctx
from cuctx.kernels import _kernel, _launcher

from conftest import requires_fast_paths
from scenarios import ADD_SOURCE, add, add_arrays, library_fixture, python_paths, run_python

pytestmark = pytest.mark.usefixtures("nvrtc_cache")

lib = library_fixture(ADD_SOURCE, add=add)


@pytest.fixture
def native(backend):
    """The compiled path's driver of the test's backend (skips where it is off), with the
    sim's race checker off: while a trace sink listens every call takes the checked path."""
    if backend.native is None:
        pytest.skip(f"the compiled fast path is off: {backend.native_reason}")
    with cuctx.racecheck("off"):
        yield backend.native


def outcome(call) -> tuple[type, str] | None:
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - the error is what is compared
        return type(exc), str(exc)
    return None


def on_each_path(backend, make_calls) -> tuple[list, list]:
    """The outcomes of the calls ``make_calls()`` returns, made (and called) once with the
    backend's compiled path off and once with it on."""
    native = backend.native
    backend.native = None
    try:
        python = [outcome(call) for call in make_calls()]
    finally:
        backend.native = native
    return python, [outcome(call) for call in make_calls()]


@requires_fast_paths
def test_the_compiled_path_launches(lib, native):
    out, x = add_arrays()
    launcher = lib["add"][1, 8, 0, cuctx.Stream()]
    launcher(out, x, 1.0, 8)  # the checked path, which makes the fast path
    assert type(launcher._fast).__name__ == "Launch" and launcher.fast_source is None
    launcher(out, x, 2.0, 8)
    launcher.stream.synchronize()
    assert out.to_host().tolist() == [k + 2.0 for k in range(8)]


@requires_fast_paths
def test_a_recording_thread_gets_the_launch_with_the_bytes_the_python_path_packs(lib, native):
    """An autograph call records launches: the compiled path hands the recorder the packed
    parameter bytes itself, equal to what the generated path hands it (so calls recorded
    on either path find the same executable), and launches nothing."""
    from cuctx import _record
    from cuctx.graphs._autograph_record import Recording

    out, x = add_arrays()
    backend = cuctx.backend()

    def record(launcher) -> Recording:
        launcher(out, x, 0.0, 8)  # the checked path, which makes the fast path
        launcher.stream.synchronize()  # (the next launcher writes `out` on another stream)
        recording = Recording()
        _record.start(recording)
        try:
            launcher(out, x, 3.5, 8)
        finally:
            _record.stop()
        return recording

    compiled_launcher = lib["add"][1, 8, 0, cuctx.Stream()]
    compiled = record(compiled_launcher)
    assert type(compiled_launcher._fast).__name__ == "Launch"
    backend.native = None
    try:
        python_launcher = lib["add"][1, 8, 0, cuctx.Stream()]
        python = record(python_launcher)
    finally:
        backend.native = native
    assert compiled.keys == [compiled_launcher] and python.keys == [python_launcher]
    assert compiled.values == python.values and isinstance(compiled.values[0], bytes)
    ((args, plan),) = compiled.items
    assert args == (out, x, 3.5, 8) and plan is python.items[0][1]
    cuctx.synchronize()
    assert out.to_host().tolist() == [k + 0.0 for k in range(8)]  # nothing more ran


@requires_fast_paths
def test_launch_errors_are_the_same_on_both_paths(lib, native):
    out, x = add_arrays()
    ints = cuctx.to_device(np.arange(8, dtype=np.int32))

    def calls():
        launcher = lib["add"][1, 8, 0, cuctx.Stream()]
        launcher(out, x, 1.0, 8)  # its fast path: compiled, or generated with native off
        return [
            lambda: launcher(out, x, 1.0),  # one argument short
            lambda: launcher(out, x, "a", 8),  # a str for a float
            lambda: launcher(out, x, 1.0, 2**40),  # beyond an int
            lambda: launcher(out, x, 1e300, 8),  # beyond a float32
            lambda: launcher(out, x[::2], 1.0, 4),  # not contiguous
            lambda: launcher(out, ints, 1.0, 8),  # an int32 array for a const float*
            lambda: launcher(ints, x, 1.0, 8),  # and for a float*
            lambda: launcher(out, ints.view(np.float32), 1.0, 8),  # meant: launches
            lambda: launcher(out, x, 1.0, 2**32 - 1),
        ]  # fits as unsigned: launches

    python, compiled = on_each_path(cuctx.backend(), calls)
    assert compiled == python
    assert [o is None for o in python] == [False] * 7 + [True] * 2
    assert "not a DeviceArray of int32" in python[5][1]


def test_record_wait_and_context_errors_are_the_same_on_both_paths(native):
    cuctx.Context.create()
    theirs = cuctx.Event()  # of that context, which it keeps alive
    dead = cuctx.Context.create()
    dead_stream = cuctx.Stream()
    dead.destroy()
    cuctx.Context.pop()
    with cuctx.Device(0):
        stream, event, never = cuctx.Stream(), cuctx.Event(), cuctx.Event()

    def calls():
        return [
            lambda: stream.record(theirs),  # an event of another context
            lambda: stream.wait(never),  # never recorded
            lambda: stream.wait(5),  # not an event or a stream
            lambda: dead_stream.record(),  # a destroyed context
            lambda: event.record(dead_stream),
            lambda: dead.push(),
            lambda: dead.__enter__(),
            lambda: cuctx.Context.pop(),  # the stack is empty
            lambda: stream.record(event).record(stream),
        ]  # fine

    python, compiled = on_each_path(cuctx.backend(), calls)
    assert compiled == python
    assert python[-1] is None and all(python[:-1])
    assert "stack of this thread is empty" in python[-2][1]


def test_call_in_makes_a_call_with_the_context_current_and_leaves_the_stack_as_it_was(
    backend, native
):
    """Stream._call's way (every copy, memset, allocation): push the stream's context
    around the call unless it is current, pop it after, also after an exception."""
    drv = backend.driver
    first = cuctx.Device(0).primary_context
    other = cuctx.Context.create(cuctx.Device(0))  # current now
    seen = []

    def current(*args):
        seen.append((int(drv.cuCtxGetCurrent()[1]), args))
        return "done"

    try:
        assert native.call_in(first, current, 1, 2) == "done"
        assert native.call_in(other, current) == "done"
        assert seen == [(first._key, (1, 2)), (other._key, ())]
        assert int(drv.cuCtxGetCurrent()[1]) == other._key
        with pytest.raises(ZeroDivisionError):
            native.call_in(first, lambda: 1 / 0)
        assert int(drv.cuCtxGetCurrent()[1]) == other._key
        with pytest.raises(TypeError, match="takes a Context first"):
            native.call_in(42, current)
    finally:
        cuctx.Context.pop()
        other.destroy()
    with pytest.raises(ValueError, match="not active"):  # never pushes a destroyed context
        native.call_in(other, current)


def test_a_default_stream_runs_with_its_context_current(lib, native):
    out, x = add_arrays()
    legacy = cuctx.legacy_stream()  # of the primary context, current in `lib`
    other = cuctx.Context.create()  # now current
    try:
        launcher = lib["add"][1, 8, 0, legacy]
        for k in range(3):
            launcher(out, x, float(k), 8)
            event = legacy.record(cuctx.Event._create(legacy.context, timing=False))
            legacy.wait(event)
        assert cuctx.current_context() is other  # pushed for the calls, popped after
        legacy.synchronize()
        assert out.to_host().tolist() == [k + 2.0 for k in range(8)]
    finally:
        cuctx.Context.pop()
        other.destroy()


def test_a_launch_without_a_stream_finds_the_current_streams_launcher_on_both_paths(
    lib, native, monkeypatch
):
    """kernel[grid, block] and cuctx.launch without stream= take the launcher of the current
    stream (the innermost `with stream:` of the current context, else its legacy stream),
    looked up in C on the compiled path: the same launcher as the Python path finds, however
    the current stream and context change between the calls."""
    backend = cuctx.backend()
    k, grid = lib["add"], 1
    side, other = cuctx.Stream(), cuctx.Context.create()
    try:
        with other:
            other_legacy = cuctx.current_stream()
    finally:
        cuctx.Context.pop()

    def found() -> list:
        launchers = [k[grid, 8], k[grid + 0, 8, 0]]  # (an int computed anew: the same key)
        with side:
            launchers += [k[grid, 8], k[grid, 8, 0, None]]
            with other:
                launchers.append(k[grid, 8])
            launchers.append(k[grid, 8])
        return launchers + [k[grid, 8]]

    compiled = found()  # (made by the Python path the first time)
    made = []
    monkeypatch.setattr(
        _kernel, "make_launcher", lambda *args: made.append(args) or _launcher.make_launcher(*args)
    )
    assert found() == compiled and made == []  # found in C
    with python_paths(backend):
        python = found()
    assert compiled == python
    legacy = cuctx.legacy_stream()
    assert [launcher.stream for launcher in compiled] == [
        legacy,
        legacy,
        side,
        side,
        other_legacy,
        side,
        legacy,
    ]
    out, x = add_arrays()
    with side:
        cuctx.launch(k, 1, 8, out, x, 5.0, 8)  # on side
    side.synchronize()
    assert out.to_host().tolist() == [i + 5.0 for i in range(8)]
    other.destroy()


def test_cuctx_current_stream_is_found_in_c_as_the_python_path_finds_it(native, monkeypatch):
    """cuctx.current_stream() without a device: the innermost `with stream:` of the current
    device (whichever context it is of), else the current context's legacy stream, found in
    C, and the same stream as the Python path finds however the stack changes."""
    side, other = cuctx.Stream(), cuctx.Context.create()
    inner = cuctx.Stream()  # of other
    cuctx.Context.pop()

    def found() -> list:
        streams = [cuctx.current_stream()]
        with side:
            streams.append(cuctx.current_stream())
            with other:
                streams.append(cuctx.current_stream())  # side: the device's innermost block
                with inner:
                    streams.append(cuctx.current_stream())
            streams.append(cuctx.current_stream())
        with other:
            streams.append(cuctx.current_stream())
        return streams + [cuctx.current_stream(0)]

    resolve = cuctx.stream.resolve_stream
    asked = []
    monkeypatch.setattr(
        cuctx.stream, "resolve_stream", lambda *a, **k: asked.append(a) or resolve(*a, **k)
    )
    found()  # (the Python path makes the default streams at first use)
    asked.clear()
    compiled = found()
    assert len(asked) == 1  # only current_stream(0), a device given, takes the Python path
    with python_paths(cuctx.backend()):
        assert found() == compiled
    legacy, other_legacy = cuctx.legacy_stream(), compiled[-2]
    assert other_legacy.kind == "legacy" and other_legacy.context is other
    assert compiled[:-2] == [legacy, side, side, inner, side]
    assert compiled[-1] is legacy
    other.destroy()


def test_a_block_of_a_stream_subclass_makes_it_current_on_both_paths(native):
    """`with s:` of a Stream subclass makes s the current stream, on the compiled path as on
    the Python path, also once the context's legacy stream exists (the compiled lookup's
    answer when the thread has no block)."""

    class MyStream(cuctx.Stream):
        pass

    cuctx.legacy_stream()
    s = MyStream()
    with s:
        compiled = cuctx.current_stream()
        with python_paths(cuctx.backend()):
            checked = cuctx.current_stream()
    assert compiled is s and checked is s
    assert cuctx.current_stream() is cuctx.legacy_stream()


def test_the_compiled_lookup_finds_a_primary_context_made_again_after_a_reset(native, monkeypatch):
    """A device reset destroys its primary context, and the next one may get the same handle
    (it does on the sim): the compiled lookup of the current stream finds the new context,
    not the destroyed one it had found before, which sent every later lookup to the Python
    path."""
    device = cuctx.Device(0)
    with device:
        cuctx.current_stream()
    device.reset()
    resolve = cuctx.stream.resolve_stream
    asked = []
    monkeypatch.setattr(
        cuctx.stream, "resolve_stream", lambda *a, **k: asked.append(a) or resolve(*a, **k)
    )
    with device:
        cuctx.current_stream()  # (the Python path makes the new context's default stream)
        asked.clear()
        found = cuctx.current_stream()
        legacy = cuctx.legacy_stream()
    assert asked == [] and found is legacy and legacy.context.state == "active"


@pytest.mark.primary_unheld
def test_the_compiled_lookup_keeps_no_context_alive(native):
    """The compiled lookup remembers the context it found last without holding it: once the
    program lets go of the primary context it found, the primary context is released."""
    device = cuctx.Device(0)
    with device:
        cuctx.current_stream()  # (the Python path makes the default stream)
        assert cuctx.current_stream().context is device.primary_context  # (found in C)
    gc.collect()
    err, _, active = device._backend.driver.cuDevicePrimaryCtxGetState(device._handle)
    assert not err and not active


@requires_fast_paths
@pytest.mark.parametrize("kind", [{"cooperative": True}, {"cluster": 2}])
def test_cluster_and_cooperative_launches_take_the_compiled_path(lib, native, kind):
    out, x = add_arrays(16)
    stream = cuctx.Stream()
    for k in range(3):
        cuctx.launch(lib["add"], 2, 8, out, x, float(k), 16, stream=stream, **kind)
    launcher = _launcher.make_launcher(
        lib["add"], 2, 8, 0, stream, kind.get("cluster"), kind.get("cooperative", False)
    )
    assert type(launcher._fast).__name__ == "Launch"
    stream.synchronize()
    assert out.to_host().tolist() == [k + 2.0 for k in range(16)]


@requires_fast_paths
def test_one_compiled_launcher_serves_every_thread(lib, native):
    stream = cuctx.Stream()
    launcher = lib["add"][1, 8, 0, stream]
    outs = [cuctx.zeros(8, np.float32, stream=stream) for _ in range(4)]
    x = cuctx.to_device(np.arange(8, dtype=np.float32), stream=stream)
    launcher(outs[0], x, 0.0, 8)
    errors = []

    def work(k):
        try:
            for _ in range(50):
                launcher(outs[k], x, float(k), 8)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stream.synchronize()
    assert not errors
    for k, out in enumerate(outs):
        assert out.to_host().tolist() == [i + float(k) for i in range(8)]


def test_the_compiled_methods_show_the_python_ones(native):
    record = cuctx.Stream.record
    assert record.__wrapped__.__qualname__ == "Stream.record"
    assert inspect.signature(record) == inspect.signature(record.__wrapped__)
    assert record.__doc__ == record.__wrapped__.__doc__
    assert "def wait(self" in inspect.getsource(cuctx.Stream.wait)
    assert cuctx.launch.__doc__ == _launcher.launch.__doc__


def test_cuctx_native_0_turns_the_compiled_path_off():
    code = (
        "import cuctx, cuctx.kernels._launcher as l; b = cuctx.backend(); "
        "print(b.native, b.native_reason, cuctx.launch is l.launch, "
        "type(cuctx.Stream.__dict__['record']).__name__)"
    )
    proc = run_python("-c", code, CUCTX_NATIVE="0", CUCTX_BACKEND="sim")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [
        "None",
        "turned",
        "off",
        "by",
        "CUCTX_NATIVE=0",
        "True",
        "function",
    ]
