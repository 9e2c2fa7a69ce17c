"""Two devices, on the sim's two and on a machine with two GPUs (elsewhere these skip with
"needs two devices" or, for GPU-only tests, "needs two GPUs"): one library loaded once and
launched in device 0's and device 1's primary contexts and in a context created on device 1,
its __managed__ variable one copy for all of them and its __device__ variable one per
context; copies between devices both ways with and without peer access; a stream of device 1
waiting for an event of device 0; kernels reaching another device's memory; a pipeline
across devices under the race checker; graphs on each device; a timeline of both. Every test
runs on both hot paths (compiled and Python)."""

from __future__ import annotations

import inspect
import json

import numpy as np
import pytest
from cuda.bindings.driver import CUresult, CUstreamCaptureMode, CUstreamCaptureStatus

import cuctx
from conftest import busy
from cuctx import Context, Device, Stream

pytestmark = [pytest.mark.usefixtures("nvrtc_cache"), pytest.mark.paths("python", "native")]

SOURCE = r"""
__device__ float gain = 2.0f;
__managed__ int launches = 0;

extern "C" __global__ void add(float* out, const float* x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = x[i] + a;
    if (i == 0) atomicAdd(&launches, 1);
}

extern "C" __global__ void apply_gain(float* data, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) data[i] *= gain;
}
"""
N = 8


def load() -> cuctx.Library:
    """SOURCE with a sim twin for `add` (counting its launches in the managed variable, as
    the CUDA code does). `apply_gain` reads a __device__ variable by name, which a twin
    cannot: it runs on GPUs only."""
    seen = {}

    def add(grid, block, out, x, a: float, n):
        out.view(np.float32, n)[:] = x.view(np.float32, n) + np.float32(a)
        seen["launches"][0] += 1

    library = cuctx.Library.from_source(SOURCE, sim_kernels={"add": add})
    seen["launches"] = library.get_managed("launches", np.int32)
    return library


def two_devices(backend) -> tuple[Device, Device]:
    devices = cuctx.devices()
    if len(devices) < 2:
        pytest.skip(f"needs two devices; the {backend.name} backend has {len(devices)}")
    return devices[0], devices[1]


@pytest.fixture
def pair(backend) -> tuple[Device, Device]:
    return two_devices(backend)


@pytest.fixture
def sim_pair(sim) -> tuple[Device, Device]:
    return two_devices(sim)


@pytest.fixture
def gpus(gpu) -> tuple[Device, Device]:
    devices = cuctx.devices()
    if len(devices) < 2:
        pytest.skip(f"needs two GPUs; this machine has {len(devices)}")
    return devices[0], devices[1]


@pytest.fixture
def peers(pair) -> tuple[Device, Device]:
    """The two devices with peer access enabled both ways for the test (skips where the
    hardware has none)."""
    d0, d1 = pair
    if not (d0.can_access_peer(d1) and d1.can_access_peer(d0)):
        pytest.skip("these devices cannot access each other (cuDeviceCanAccessPeer is 0)")
    d0.enable_peer_access(d1)
    d1.enable_peer_access(d0)
    yield d0, d1
    d0.disable_peer_access(d1)
    d1.disable_peer_access(d0)


def three_contexts(d0: Device, d1: Device) -> list[Context]:
    """Device 0's and device 1's primary contexts and a context created on device 1."""
    created = Context.create(d1)
    Context.pop()  # Context.create pushed it; the tests enter each context with `with`
    return [d0.primary_context, d1.primary_context, created]


def arange(n: int = N) -> cuctx.DeviceArray:
    return cuctx.to_device(np.arange(n, dtype=np.float32))


def here() -> int:
    return inspect.currentframe().f_back.f_lineno


# -- one library, three contexts ----------------------------------------------------------


def test_one_library_launches_in_both_primary_contexts_and_a_created_one(pair):
    lib = load()  # once, before any context of device 1 exists
    add = lib["add"]
    contexts = three_contexts(*pair)
    for k, ctx in enumerate(contexts):
        with ctx:
            x, out = arange(), cuctx.zeros(N, np.float32)
            assert (out.context, out.device) == (ctx, ctx.device)
            add[1, N](out, x, float(k), N)
            assert out.to_host().tolist() == [i + k for i in range(N)], ctx
            assert lib["add"] is add  # one handle for every context and device
    addresses = set()
    for ctx in contexts:
        ctx.synchronize()
        with ctx:  # the managed variable is one copy, wherever it is asked for
            view = lib.get_managed("launches", np.int32)
            addresses.add(view.__array_interface__["data"][0])
    assert len(addresses) == 1 and int(view[0]) == len(contexts)
    contexts[2].destroy()
    lib.unload()


def test_each_context_has_its_own_device_variable_from_the_source(pair):
    lib = load()
    contexts = three_contexts(*pair)
    for k, ctx in enumerate(contexts):
        with ctx:
            gain = lib.get_global("gain", np.float32)
            assert (gain.context, gain.device) == (ctx, ctx.device)
            assert gain.to_host().tolist() == [2.0]  # the source's value, not another's
            gain.copy_from(np.array([10.0 + k], np.float32))
    addresses = set()
    for k, ctx in enumerate(contexts):
        with ctx:
            gain = lib.get_global("gain", np.float32)
            assert gain.to_host().tolist() == [10.0 + k], ctx
            addresses.add(gain.ptr)
    assert len(addresses) == 3
    later = Context.create(pair[1])  # a context made after the writes: the source's value
    try:
        assert lib.get_global("gain", np.float32).to_host().tolist() == [2.0]
    finally:
        Context.pop()
        later.destroy()
    contexts[2].destroy()


@pytest.mark.gpu
def test_kernels_read_the_device_variable_of_the_context_they_run_in(gpus):
    lib = load()
    contexts = three_contexts(*gpus)
    for k, ctx in enumerate(contexts):
        with ctx:
            lib.get_global("gain", np.float32).copy_from(np.array([k + 3.0], np.float32))
    for k, ctx in enumerate(contexts):
        with ctx:
            data = cuctx.to_device(np.ones(N, np.float32))
            lib["apply_gain"][1, N](data, N)
            assert data.to_host().tolist() == [k + 3.0] * N, ctx
    contexts[2].destroy()


@pytest.mark.gpu
def test_torch_tensors_of_device_1_launch_where_torch_made_device_1_current(gpus):
    torch = pytest.importorskip("torch")
    lib = load()
    x = torch.arange(N, dtype=torch.float32, device="cuda:1")
    out = torch.zeros(N, dtype=torch.float32, device="cuda:1")
    with torch.cuda.device(1):  # cudaSetDevice(1): device 1's primary context, shared
        assert cuctx.current_context() is gpus[1].primary_context
        lib["add"][1, N, 0, torch.cuda.current_stream()](out, x, 1.0, N)
    torch.cuda.synchronize(1)
    assert out.tolist() == [i + 1.0 for i in range(N)]
    with gpus[0]:
        with pytest.raises(cuctx.KernelArgumentError, match="needs peer access"):
            lib["add"][1, N](cuctx.zeros(N, np.float32), x, 1.0, N)


# -- copies and waits between devices -----------------------------------------------------


@pytest.mark.parametrize("peer_access", [False, True], ids=["no-peer-access", "peer-access"])
def test_copies_between_devices_both_ways(pair, peer_access):
    d0, d1 = pair
    if peer_access:
        if not (d0.can_access_peer(d1) and d1.can_access_peer(d0)):
            pytest.skip("these devices cannot access each other (cuDeviceCanAccessPeer is 0)")
        d0.enable_peer_access(d1)
        d1.enable_peer_access(d0)
    try:
        host = np.arange(4096, dtype=np.float32)
        a = cuctx.to_device(host, device=d0)
        b = cuctx.zeros(host.shape, np.float32, device=d1)
        cuctx.copy(b, a)  # 0 -> 1 on the current stream of b's device
        np.testing.assert_array_equal(b.to_host(), host)
        b.fill(5.0)
        s0 = Stream(d0)
        s0.wait(cuctx.current_stream(d1))  # after the fill
        cuctx.copy(a[::2], b[1::2], stream=s0)  # 1 -> 0, strided, on a stream of a's device
        s0.synchronize()
        expected = host.copy()
        expected[::2] = 5.0
        np.testing.assert_array_equal(a.to_host(), expected)
    finally:
        d0.disable_peer_access(d1)
        d1.disable_peer_access(d0)


def test_a_stream_of_device_1_waits_for_an_event_recorded_on_device_0(pair):
    d0, d1 = pair
    s0, s1 = Stream(d0), Stream(d1)
    a = cuctx.zeros(1 << 16, np.float32, stream=s0)
    busy(s0, 20)  # the fill below comes late
    a.fill(7.0, stream=s0)
    ready = s0.record()
    s1.wait(ready)
    b = cuctx.empty(a.shape, np.float32, stream=s1)
    cuctx.copy(b, a, stream=s1)
    out = cuctx.pinned_empty(a.shape, np.float32)
    b.to_host(out=out, stream=s1)
    s1.synchronize()  # device 1's stream only: the event ordered it after device 0's fill
    assert (out == 7.0).all()


def test_without_the_wait_device_1_reads_what_was_there_on_the_sim(sim_pair):
    d0, d1 = sim_pair
    s0, s1 = Stream(d0), Stream(d1)
    a = cuctx.zeros(1 << 16, np.float32, stream=s0)
    s0.synchronize()
    busy(s0, 20)
    a.fill(7.0, stream=s0)
    b = cuctx.empty(a.shape, np.float32, stream=s1)
    cuctx.copy(b, a, stream=s1)  # nothing orders it after the fill: it runs first
    assert (b.to_host(stream=s1) == 0.0).all()
    s0.synchronize()


# -- every copy in its stream's context ------------------------------------------------------


def test_the_driver_checks_a_copys_memory_against_the_current_context(backend, pair):
    """What cuctx works around, in raw driver calls: a copy of device 1's memory on a stream
    of device 1 is CUDA_ERROR_INVALID_VALUE while device 0's context is current (two H200s,
    driver 580), and runs with device 1's. The sim refuses it as the driver does."""
    d0, d1 = pair
    drv = backend.driver
    s1 = Stream(d1)
    b = cuctx.full(N, 3.0, np.float32, stream=s1)
    out = cuctx.pinned_empty(N, np.float32)
    for device, expected in ((d0, CUresult.CUDA_ERROR_INVALID_VALUE), (d1, CUresult.CUDA_SUCCESS)):
        with device:
            assert drv.cuMemcpyDtoHAsync(out.ctypes.data, b.ptr, b.nbytes, s1._handle) == (
                expected,
            ), device
    s1.synchronize()
    assert out.tolist() == [3.0] * N


def test_on_the_sim_only_copies_are_checked_against_the_current_context(sim, sim_pair):
    """The sim's model (docs/memory.md, "The sim's memory"; scripts/probe_multi_device.py
    asks a GPU each case): a copy's device memory must be reachable from the current
    context (its device's, or by peer access), or from the stream's when none is current;
    memsets and cuMemcpyPeerAsync, which name their memory's contexts, are not checked so."""
    d0, d1 = sim_pair
    drv = sim.driver
    s1 = Stream(d1)
    a = cuctx.zeros(N, np.float32, stream=s1)
    b = cuctx.zeros(N, np.float32, stream=s1)
    ok, refused = (CUresult.CUDA_SUCCESS,), (CUresult.CUDA_ERROR_INVALID_VALUE,)
    with d0:
        assert drv.cuMemcpyDtoDAsync(b.ptr, a.ptr, a.nbytes, s1._handle) == refused
        assert drv.cuMemsetD32Async(b.ptr, 7, N, s1._handle) == ok
        assert (
            drv.cuMemcpyPeerAsync(
                b.ptr,
                d1.primary_context._handle,
                a.ptr,
                d1.primary_context._handle,
                a.nbytes,
                s1._handle,
            )
            == ok
        )
        d0.enable_peer_access(d1)
        try:
            assert drv.cuMemcpyDtoDAsync(b.ptr, a.ptr, a.nbytes, s1._handle) == ok
        finally:
            d0.disable_peer_access(d1)
    cuctx.Context.pop()  # the primary context lazy initialisation left current: none now
    assert cuctx.current_context() is None
    assert drv.cuMemcpyDtoDAsync(b.ptr, a.ptr, a.nbytes, s1._handle) == ok
    s1.synchronize()


def test_copies_and_fills_on_a_stream_of_device_1_work_whatever_context_is_current(pair):
    d0, d1 = pair
    s1 = Stream(d1)
    host = np.arange(64, dtype=np.float32).reshape(8, 8)
    pinned = cuctx.pinned_empty(host.shape, np.float32)
    with d0:  # every call below with device 0's context current
        a = cuctx.empty(host.shape, np.float32, stream=s1)
        cuctx.copy(a, host, stream=s1)  # host to device, pageable
        b = cuctx.zeros(host.shape, np.float32, stream=s1)  # an allocation and a memset
        cuctx.copy(b[:, :4], a[:, 4:], stream=s1)  # device to device, strided: a 2D copy
        b[:, 4:].fill(-1.0, stream=s1)  # a fill of a strided view
        b.to_host(out=pinned, stream=s1)  # device to host, page-locked
        s1.synchronize()
    expected = np.full(host.shape, -1.0, np.float32)
    expected[:, :4] = host[:, 4:]
    np.testing.assert_array_equal(pinned, expected)


# -- kernels and another device's memory --------------------------------------------------


def test_kernels_use_the_other_devices_memory_after_enable_peer_access(pair):
    d0, d1 = pair
    if not (d0.can_access_peer(d1) and d1.can_access_peer(d0)):
        pytest.skip("these devices cannot access each other (cuDeviceCanAccessPeer is 0)")
    lib = load()
    with d1:
        x1 = arange()
    with d0:
        out0 = cuctx.zeros(N, np.float32)
    with pytest.raises(cuctx.KernelArgumentError, match="needs peer access"):
        lib["add"][1, N, 0, cuctx.current_stream(d0)](out0, x1, 1.0, N)
    d0.enable_peer_access(d1)
    d1.enable_peer_access(d0)
    try:
        with d0:
            lib["add"][1, N](out0, x1, 1.0, N)  # device 0 reads device 1's memory
        with d1:
            cuctx.current_stream().wait(cuctx.current_stream(d0))  # after device 0's launch
            lib["add"][1, N](x1, out0, 1.0, N)  # device 1 reads device 0's memory
        assert x1.to_host().tolist() == [i + 2.0 for i in range(N)]
    finally:
        d0.disable_peer_access(d1)
        d1.disable_peer_access(d0)


def test_on_the_sim_a_kernel_faults_on_another_devices_memory_without_access(sim_pair):
    """A GPU maps another device's memory for a kernel only with peer access: without it, an
    address given as an int (which cuctx cannot check) is an illegal address."""
    d0, d1 = sim_pair
    lib = load()
    with d1:
        x1 = arange()
        gain1 = lib.get_global("gain", np.float32)  # not pool memory: the context's grant
    with d0:
        out0 = cuctx.zeros(N, np.float32)
        d0.enable_peer_access(d1)
        lib["add"][1, N](out0, x1.ptr, 1.0, N)
        lib["add"][1, 1](out0, gain1.ptr, 0.0, 1)
        assert out0.to_host().tolist() == [2.0] + [i + 1.0 for i in range(1, N)]
        d0.disable_peer_access(d1)
        lib["add"][1, N](out0, x1.ptr, 1.0, N)
        with pytest.raises(
            cuctx.StickyFaultError,
            match=r"ILLEGAL_ADDRESS.*twin of kernel "
            r"'add' .* accessed memory of device 1 from device 0 without peer "
            r"access \(cuctx\.Device\(0\)\.enable_peer_access",
        ):
            cuctx.synchronize()
    assert x1.to_host().tolist() == list(range(N))  # device 1 goes on


# -- a pipeline across devices under the race checker -------------------------------------


def pipeline(lib, d0: Device, d1: Device, wait: bool) -> tuple[Stream, Stream, int, list]:
    """Device 0 computes a, device 1 copies it and computes from the copy; the streams, the
    line of device 1's copy and the arrays (kept: freeing `a` would be one more race)."""
    s0, s1 = Stream(d0), Stream(d1)
    x = cuctx.to_device(np.arange(N, dtype=np.float32), stream=s0)
    a = cuctx.empty(N, np.float32, stream=s0)
    b = cuctx.empty(N, np.float32, stream=s1)
    c = cuctx.empty(N, np.float32, stream=s1)
    s0.synchronize()
    s1.synchronize()
    lib["add"][1, N, 0, s0](a, x, 1.0, N)
    if wait:
        s1.wait(s0.record())
    line = here() + 1
    cuctx.copy(b, a, stream=s1)
    lib["add"][1, N, 0, s1](c, b, 1.0, N)
    if wait:
        assert c.to_host(stream=s1).tolist() == [i + 2.0 for i in range(N)]
    return s0, s1, line, [x, a, b, c]


def test_a_pipeline_across_devices_with_its_wait_has_no_race(pair):
    lib = load()
    with cuctx.racecheck() as rc:  # "raise": a race would fail the call that completes it
        pipeline(lib, *pair, wait=True)
        cuctx.Device(0).synchronize()
    assert rc.findings == []


def test_the_race_checker_names_a_missing_wait_across_devices(pair):
    lib = load()
    with cuctx.racecheck("collect") as rc:
        s0, s1, line, arrays = pipeline(lib, *pair, wait=False)
        s1.synchronize()
        s0.synchronize()
    [finding] = rc.findings
    assert finding.kind == "read-after-write"
    assert (finding.first.stream, finding.second.stream) == (s0, s1)
    assert finding.first.what == "launch of 'add'" and finding.second.what == "copy"
    assert finding.second.site[:2] == (__file__, line)
    assert finding.fix == f"s1.wait(s0) before line {line}"
    assert "device 0" in str(finding) and "device 1" in str(finding)


# -- graphs on each device ----------------------------------------------------------------


def test_graphs_run_on_streams_of_their_own_device_only(pair):
    lib = load()
    arrays, executables, streams = [], [], []
    for device in pair:
        with device:
            x = arange()
            g = cuctx.Graph()
            g.launch(lib["add"], 1, N, x, x, 1.0, N)
            exe = g.instantiate()
            assert exe.device is device and exe.context is device.primary_context
            s = Stream()
            s.wait(cuctx.current_stream())  # after the upload of x
            exe.launch(s)
            arrays.append(x)
            executables.append(exe)
            streams.append(s)
    with pair[0]:
        executables[1].launch()  # its own context's current stream, whatever is current
    for s, x, runs in zip(streams, arrays, (1, 2)):
        pair[1].synchronize()
        s.synchronize()
        assert x.to_host().tolist() == [i + runs for i in range(N)]
    for exe, foreign in ((executables[0], streams[1]), (executables[1], streams[0])):
        mine, theirs = exe.device.ordinal, foreign.device.ordinal
        with pytest.raises(
            ValueError,
            match=rf"\(device {mine}\).*\(device {theirs}\); an "
            r"executable runs on streams of its own context",
        ):
            exe.launch(foreign)
        with pytest.raises(ValueError, match="own context"):
            exe.upload(foreign)


def test_a_copy_between_devices_captured_on_one_device_replays(peers):
    d0, d1 = peers
    s0 = Stream(d0)
    a = cuctx.to_device(np.arange(N, dtype=np.float32), stream=s0)
    b = cuctx.zeros(N, np.float32, device=d1)
    cuctx.Device(1).synchronize()
    with s0.capture() as graph:
        a.fill(3.0, stream=s0)
        cuctx.copy(b, a, stream=s0)
    assert b.to_host().tolist() == [0.0] * N  # captured, not run
    with graph.instantiate() as exe:
        exe.launch(s0)
        s0.synchronize()
    assert b.to_host().tolist() == [3.0] * N


def test_a_strided_copy_between_devices_captured_on_the_destinations_device_replays(peers):
    """A graph cannot hold cuMemcpyPeerAsync: the copy is the 2D device-to-device copy a
    strided copy within a device is, here of device 0's memory by device 1."""
    d0, d1 = peers
    s1 = Stream(d1)
    a = cuctx.to_device(np.arange(2 * N, dtype=np.float32), device=d0)
    b = cuctx.zeros(2 * N, np.float32, stream=s1)
    d0.synchronize()
    with s1.capture() as graph:
        cuctx.copy(b[::2], a[1::2], stream=s1)
    with graph.instantiate() as exe:
        exe.launch(s1)
        s1.synchronize()
    expected = np.zeros(2 * N, np.float32)
    expected[::2] = np.arange(1, 2 * N, 2)
    np.testing.assert_array_equal(b.to_host(stream=s1), expected)


def test_a_copy_between_devices_in_a_capture_needs_peer_access(pair):
    d0, d1 = pair
    s0 = Stream(d0)
    a = cuctx.full(N, 2.0, np.float32, stream=s0)
    b = cuctx.zeros(N, np.float32, stream=s0)
    with d1:
        c = cuctx.zeros(N, np.float32)
    cuctx.Device(1).synchronize()
    with pytest.raises(
        ValueError,
        match=r"CUDA cannot capture cuMemcpyPeerAsync, and the copy "
        r"a graph holds is made by device 0, which needs peer access to device "
        r"1: call cuctx\.Device\(0\)\.enable_peer_access\(1\) before the "
        r"capture",
    ):
        with s0.capture():
            cuctx.copy(b, a, stream=s0)  # within device 0: captured
            cuctx.copy(c, a, stream=s0)
    cuctx.copy(c, a, stream=s0)  # outside a capture: cuMemcpyPeerAsync, no access needed
    s0.synchronize()
    assert c.to_host().tolist() == [2.0] * N


def test_a_graphs_copy_node_copies_between_devices_with_peer_access(pair):
    d0, d1 = pair
    a = cuctx.to_device(np.arange(N, dtype=np.float32), device=d0)
    b = cuctx.zeros(N, np.float32, device=d1)
    d0.synchronize()
    d1.synchronize()
    with d0:
        g = cuctx.Graph()
        with pytest.raises(
            ValueError,
            match=r"a copy between devices in a graph is made by "
            r"device 0, which needs peer access to device 1: call "
            r"cuctx\.Device\(0\)\.enable_peer_access\(1\) first",
        ):
            g.copy(b, a)
        if not d0.can_access_peer(d1):
            pytest.skip("these devices cannot access each other (cuDeviceCanAccessPeer is 0)")
        d0.enable_peer_access(d1)
        try:
            g.copy(b, a)
            with pytest.raises(ValueError, match="a graph fills memory of its own device"):
                g.fill(b, 1.0)
            s0 = Stream()
            with g.instantiate() as exe:
                exe.launch(s0)
                s0.synchronize()
        finally:
            d0.disable_peer_access(d1)
    assert b.to_host().tolist() == list(range(N))


def test_cuMemcpyPeerAsync_in_a_capture_is_refused_and_invalidates_it(backend, pair):
    """What cuctx works around, in raw driver calls (two H200s: CUDA_ERROR_STREAM_CAPTURE_
    UNSUPPORTED), and the sim refuses alike: the capture is invalidated, its end gives no
    graph."""
    d0, d1 = pair
    drv = backend.driver
    s0 = Stream(d0)
    a = cuctx.zeros(N, np.float32, stream=s0)
    b = cuctx.zeros(N, np.float32, device=d1)
    d1.synchronize()
    s0.synchronize()
    with d0:
        mode = CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
        assert drv.cuStreamBeginCapture(s0._handle, mode) == (CUresult.CUDA_SUCCESS,)
        assert drv.cuMemcpyPeerAsync(
            b.ptr,
            d1.primary_context._handle,
            a.ptr,
            d0.primary_context._handle,
            a.nbytes,
            s0._handle,
        ) == (CUresult.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,)
        assert drv.cuStreamIsCapturing(s0._handle) == (
            CUresult.CUDA_SUCCESS,
            CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_INVALIDATED,
        )
        err, graph = drv.cuStreamEndCapture(s0._handle)
        assert err == CUresult.CUDA_ERROR_STREAM_CAPTURE_INVALIDATED and not int(graph or 0)


# -- the timeline of two devices ----------------------------------------------------------


def test_a_timeline_groups_each_devices_tracks(pair, tmp_path):
    d0, d1 = pair
    s0, s1 = Stream(d0), Stream(d1)
    a = cuctx.zeros(1 << 16, np.float32, stream=s0)
    b = cuctx.zeros(1 << 16, np.float32, stream=s1)
    s0.synchronize()
    s1.synchronize()
    with cuctx.timeline() as tl:
        b.fill(1.0, stream=s1)  # device 1 first: the groups still come in device order
        a.fill(2.0, stream=s0)
        s1.wait(s0.record())
        cuctx.copy(b, a, stream=s1)
    summary = tl.summary()
    assert set(summary["devices"]) == {0, 1}
    assert {summary["streams"][name]["device"] for name in ("s0", "s1")} == {0, 1}
    with open(tl.save(tmp_path / "trace.json")) as f:
        events = json.load(f)["traceEvents"]
    groups = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    order = {e["pid"]: e["args"]["sort_index"] for e in events if e["name"] == "process_sort_index"}
    pid_of = {}
    for e in events:
        if e["ph"] == "X" and e["pid"] != 0:
            pid_of.setdefault(e["args"]["stream"], set()).add(e["pid"])
    [p0], [p1] = pid_of[f"{s0.handle:#x}"], pid_of[f"{s1.handle:#x}"]
    assert f"device 0 / context {d0.primary_context.handle:#x}" in groups[p0]
    assert f"device 1 / context {d1.primary_context.handle:#x}" in groups[p1]
    assert 0 < order[p0] < order[p1]
    arrows = {(e["pid"], e["ph"]) for e in events if e.get("name") == "event record -> wait"}
    assert {(p0, "s"), (p1, "f")} <= arrows  # device 0's record to device 1's wait
