"""cuctx calls made from inside a host function (Stream.launch_host_func) raise
NotPermittedError, reported at the next synchronize as HostFunctionError, on both backends.
CUDA forbids CUDA calls there; the driver refuses some and deadlocks or runs others, so cuctx
checks for itself."""

import numpy as np
import pytest

import cuctx
from cuctx import Context, Device, Stream

from conftest import requires_nvrtc

pytestmark = pytest.mark.paths()


def calls(ctx: Context, stream: Stream, other: Stream, event: cuctx.Event, arr):
    """Public entries, each as a function to call inside a host function."""
    return {
        "cuctx.zeros": lambda: cuctx.zeros(3),
        "cuctx.empty": lambda: cuctx.empty(3, stream=other),
        "cuctx.to_device": lambda: cuctx.to_device(np.ones(3), stream=other),
        "DeviceArray.to_host": lambda: arr.to_host(stream=other),
        "cuctx.copy": lambda: cuctx.copy(arr, arr, stream=other),
        "Stream.record": lambda: other.record(event),
        "Stream.wait": lambda: other.wait(event),
        "Stream.synchronize": other.synchronize,
        "Stream.done": lambda: other.done,
        "Stream.launch_host_func": lambda: other.launch_host_func(print),
        "Stream": lambda: Stream(),
        "Event": lambda: cuctx.Event(),
        "Event.synchronize": event.synchronize,
        "Context.push": ctx.push,
        "Context.pop": Context.pop,
        "Context.create": lambda: Context.create(0),
        "Context.synchronize": ctx.synchronize,
        "current_context": cuctx.current_context,
        "current_stream": cuctx.current_stream,
        "Device.synchronize": Device(0).synchronize,
        "cuctx.synchronize": cuctx.synchronize,
        "Device.mem_info": Device(0).mem_info,
    }


ENTRIES = [
    "cuctx.zeros",
    "cuctx.empty",
    "cuctx.to_device",
    "DeviceArray.to_host",
    "cuctx.copy",
    "Stream.record",
    "Stream.wait",
    "Stream.synchronize",
    "Stream.done",
    "Stream.launch_host_func",
    "Stream",
    "Event",
    "Event.synchronize",
    "Context.push",
    "Context.pop",
    "Context.create",
    "Context.synchronize",
    "current_context",
    "current_stream",
    "Device.synchronize",
    "cuctx.synchronize",
    "Device.mem_info",
]


@pytest.mark.parametrize("entry", ENTRIES)
def test_a_cuctx_call_inside_a_host_function_is_not_permitted(backend, entry):
    with Device(0) as ctx:
        stream, other = Stream(), Stream()
        event = other.record()
        arr = cuctx.zeros(3, stream=other)
        other.synchronize()
        call = calls(ctx, stream, other, event, arr)[entry]
        stream.launch_host_func(call)
        with pytest.raises(cuctx.HostFunctionError) as info:
            stream.synchronize()
        cause = info.value.__cause__
        assert isinstance(cause, cuctx.NotPermittedError) and cause.code == 800
        assert "inside a host function" in str(cause) and "must not call CUDA" in str(cause)
        assert "queue.Queue" in str(cause)  # what to do instead
        # Nothing changed: the stack is as it was, and cuctx works again after it.
        assert cuctx.current_context() is ctx and backend.tls.state.stack == [ctx]
        other.record(event)
        stream.synchronize()


def test_the_error_names_the_call(backend):
    with Device(0):
        stream = Stream()
        stream.launch_host_func(cuctx.zeros, 3)
        stream.launch_host_func(lambda: cuctx.Stream())
        with pytest.raises(cuctx.HostFunctionError) as info:
            stream.synchronize()
    operations = [exc.operation for _, exc in info.value.failures]
    assert operations == ["cuctx.zeros", "cuctx.Stream"]


def test_host_functions_that_do_not_call_cuda_still_run(backend):
    with Device(0):
        stream = Stream()
        seen = []
        stream.launch_host_func(seen.append, 1)
        stream.launch_host_func(lambda: seen.append(len(seen) + 1))
        stream.synchronize()
        assert seen == [1, 2]


FILL = r"""extern "C" __global__ void fill(float* out, float v) { out[threadIdx.x] = v; }"""


def fill(grid, block, out, v):
    out.view(np.float32, block[0])[:] = v


@pytest.fixture
def fill_launcher(backend, tmp_path, monkeypatch):
    """(a launcher of ``fill`` on a stream, its output array), the launcher used once."""
    monkeypatch.setenv("CUCTX_CACHE_DIR", str(tmp_path))
    lib = cuctx.Library.from_source(FILL, sim_kernels={"fill": fill})
    with Device(0):
        other = Stream()
        out = cuctx.zeros(4, np.float32, stream=other)
        launcher = lib["fill"][1, 4, 0, other]
        launcher(out, 1.0)  # its fast path exists from here on
        yield launcher, out


def launch_inside(launch) -> BaseException:
    stream = Stream()
    stream.launch_host_func(launch)
    with pytest.raises(cuctx.HostFunctionError) as info:
        stream.synchronize()
    return info.value.__cause__


@requires_nvrtc
def test_a_launch_on_the_current_stream_inside_a_host_function_is_not_permitted(fill_launcher):
    launcher, out = fill_launcher
    cause = launch_inside(lambda: launcher.kernel[1, 4](out, 3.0))
    assert isinstance(cause, cuctx.NotPermittedError)
    assert out.to_host(stream=launcher.stream).tolist() == [1.0] * 4


@requires_nvrtc
def test_a_launch_with_a_launcher_inside_a_host_function_is_not_permitted(fill_launcher):
    launcher, out = fill_launcher
    assert isinstance(launch_inside(lambda: launcher(out, 2.0)), cuctx.NotPermittedError)


def test_destroying_a_context_inside_a_host_function_is_not_permitted(backend):
    doomed = Context.create(0)
    Context.pop()
    with Device(0):
        stream = Stream()
        stream.launch_host_func(doomed.destroy)
        with pytest.raises(cuctx.HostFunctionError) as info:
            stream.synchronize()
    assert isinstance(info.value.__cause__, cuctx.NotPermittedError)
    assert doomed.state == "active"  # refused before the driver was asked
    doomed.destroy()


@pytest.mark.device_memory
def test_an_array_collected_inside_a_host_function_is_freed_afterwards(backend):
    """A garbage collection can run inside a host function, where CUDA must not be called:
    the array's free waits and runs at the next cuctx call outside one. Nothing leaks and
    nothing is reported as ignored."""
    import gc

    with Device(0) as ctx:
        stream = Stream()
        # What the driver sets up for a context's first host function and first fill (an
        # H200 took 2 MiB once) stays: measure after it.
        stream.launch_host_func(int)
        cuctx.zeros(1, np.float64, stream=stream)
        ctx.synchronize()
        gc.collect()
        before = Device(0).mem_info().free
        box = [cuctx.zeros(1 << 20, np.float64, stream=stream)]
        stream.launch_host_func(box.clear)  # the last reference dies in the host function
        stream.synchronize()
        gc.collect()
        ctx.synchronize()  # runs the held free
        assert Device(0).mem_info().free >= before


def test_an_empty_array_records_any_stream(backend):
    with Device(0):
        arr = cuctx.zeros(0)
        arr.record_stream(Stream())  # no memory to keep: nothing to do, nothing to refuse
