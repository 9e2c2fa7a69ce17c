"""The sim's timing model and activity feed (src/cuctx/_driver/sim/_timing.py): what the
timeline and the overlap benchmark read on the sim. Times are virtual, so exact."""

import numpy as np
import pytest

import cuctx
from cuctx._driver.sim import Activity
from cuctx._driver.sim import _timing

SOURCE = r"""
extern "C" __global__ void scale(float* out, const float* in, float factor, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i] * factor;
}
"""
N = 1 << 18  # 1 MiB of float32


def scale_twin(grid, block, out, data, factor: float, n):
    out.view(np.float32, n)[:] = data.view(np.float32, n) * np.float32(factor)


@pytest.fixture
def feed(sim):
    records: list[Activity] = []
    assert not sim.sim.subscribe_activity(records.append)[0]
    yield sim, records
    assert not sim.sim.unsubscribe_activity(records.append)[0]


def overlaps(a: Activity, b: Activity) -> bool:
    return a.start_ns < b.end_ns and b.start_ns < a.end_ns


def test_every_operation_is_reported_with_its_stream_context_and_correlation(feed):
    sim, records = feed
    library = cuctx.Library.from_source(SOURCE, sim_kernels={"scale": scale_twin})
    device = cuctx.Device(0)
    with device:
        stream = cuctx.Stream()
        host = cuctx.pinned_empty(N, np.float32)
        host[:] = 1
        x = cuctx.empty(N, np.float32, stream=stream)
        y = cuctx.empty(N, np.float32, stream=stream)
        sim.sim.push_correlation(7)
        cuctx.copy(x, host, stream=stream)
        sim.sim.push_correlation(8)
        library["scale"][N // 256, 256, 0, stream](y, x, 2.0, N)
        assert sim.sim.pop_correlation()[1] == 8
        cuctx.copy(host, y, stream=stream)
        assert sim.sim.pop_correlation()[1] == 7
        assert sim.sim.pop_correlation()[0]  # nothing left: an error code
        stream.synchronize()
        context = int(device.primary_context._handle)
    work = [r for r in records if r.stream == int(stream._handle)]
    assert [(r.kind, r.correlation) for r in work] == [
        ("memcpy HtoD", 7),
        ("kernel", 8),
        ("memcpy DtoH", 7),
    ]
    assert all(r.context == context and r.device == 0 for r in work)
    assert work[1].name == "scale" and work[1].bytes == 2 * N * 4  # read in, wrote out
    assert work[0].end_ns <= work[1].start_ns and work[1].end_ns <= work[2].start_ns
    assert work[0].bytes == N * 4 and all(r.queued_ns <= r.start_ns for r in work)


def test_copies_of_one_direction_share_one_engine_and_the_two_directions_overlap(feed):
    sim, records = feed
    with cuctx.Device(0):
        streams = [cuctx.Stream() for _ in range(3)]
        host = cuctx.pinned_empty(N, np.float32)
        arrays = [cuctx.empty(N, np.float32, stream=s) for s in streams]
        cuctx.copy(arrays[0], host, stream=streams[0])
        cuctx.copy(arrays[1], host, stream=streams[1])
        cuctx.copy(host, arrays[2], stream=streams[2])
        cuctx.current_context().synchronize()
    h2d = [r for r in records if r.kind == "memcpy HtoD"]
    d2h = [r for r in records if r.kind == "memcpy DtoH"]
    assert len(h2d) == 2 and not overlaps(*h2d)
    assert any(overlaps(d2h[0], r) for r in h2d)
    assert h2d[0].end_ns - h2d[0].start_ns == _timing.duration("memcpy HtoD", N * 4, 1.0)


def test_kernels_of_one_context_share_the_sms_and_other_contexts_take_turns(feed):
    sim, records = feed
    library = cuctx.Library.from_source(SOURCE, sim_kernels={"scale": scale_twin})
    device = cuctx.Device(0)
    with device:
        streams = [cuctx.Stream() for _ in range(2)]
        xs = [cuctx.zeros(N, np.float32, stream=s) for s in streams]
        cuctx.current_context().synchronize()
        for s, x in zip(streams, xs):  # 16 blocks each: a small share of 132 SMs
            library["scale"][16, 256, 0, s](x, x, 2.0, N)
        cuctx.current_context().synchronize()
        same = [r for r in records if r.kind == "kernel"]
        assert len(same) == 2 and overlaps(*same)
        records.clear()
        other = cuctx.Context.create(device)
        try:
            z = cuctx.zeros(N, np.float32)
            library["scale"][16, 256](z, z, 2.0, N)
            cuctx.Context.pop()
            library["scale"][16, 256, 0, streams[0]](xs[0], xs[0], 2.0, N)
            other.synchronize()
            cuctx.current_context().synchronize()
            del z
        finally:
            other.destroy()
    kernels = [r for r in records if r.kind == "kernel"]
    assert len({r.context for r in kernels}) == 2 and not overlaps(*kernels)


def test_a_twin_may_declare_its_time(feed):
    sim, records = feed

    def slow(grid, block, out, data, factor: float, n):
        scale_twin(grid, block, out, data, factor, n)

    slow.cost_ns = lambda grid, block, out, data, factor, n: 1000 * n

    library = cuctx.Library.from_source(SOURCE, sim_kernels={"scale": slow})
    with cuctx.Device(0):
        x = cuctx.zeros(16, np.float32)
        library["scale"][1, 16](x, x, 2.0, 16)
        cuctx.current_stream().synchronize()
    (kernel,) = [r for r in records if r.kind == "kernel"]
    assert kernel.end_ns - kernel.start_ns == _timing.LAUNCH_NS + 16_000


def test_the_feed_refuses_what_it_cannot_call_or_does_not_know(sim):
    assert sim.sim.subscribe_activity(42)[0]
    assert sim.sim.unsubscribe_activity(print)[0]


def test_copies_between_devices_take_the_links_measured_time(feed):
    """390 GB/s with peer access, 37 GB/s without (two H200s over NVLink, issue 21): 1 MiB
    takes 2 us of setup and 2689 ns over the link, or 28340 ns staged through the host."""
    sim, records = feed
    d0, d1 = cuctx.Device(0), cuctx.Device(1)
    s1 = cuctx.Stream(d1)
    a = cuctx.zeros(1 << 20, np.uint8, device=d0)
    b = cuctx.zeros(1 << 20, np.uint8, stream=s1)
    s1.wait(cuctx.current_stream(d0))
    cuctx.copy(b, a, stream=s1)  # cuMemcpyPeerAsync, staged
    d1.enable_peer_access(d0)  # device 1 reaches device 0's memory: over the link
    try:
        cuctx.copy(b, a, stream=s1)
        s1.synchronize()
    finally:
        d1.disable_peer_access(d0)
    staged, direct = [r for r in records if r.kind == "memcpy PtoP"]
    assert staged.end_ns - staged.start_ns == 2000 + 28340
    assert direct.end_ns - direct.start_ns == 2000 + 2689
    assert staged.device == direct.device == 1 and staged.bytes == 1 << 20
    assert staged.end_ns <= direct.start_ns  # one link: one copy at a time


def test_a_wait_for_another_devices_event_takes_the_measured_latency(feed):
    """A stream of device 1 waiting for an event of device 0 starts its next work 6 us after
    the event (benchmarks/peer.py's host round trip on two H200s); within a device at once."""
    sim, records = feed
    d0, d1 = cuctx.Device(0), cuctx.Device(1)
    s0, s0b, s1 = cuctx.Stream(d0), cuctx.Stream(d0), cuctx.Stream(d1)
    x0 = cuctx.zeros(N, np.float32, stream=s0b)
    x1 = cuctx.zeros(N, np.float32, stream=s1)
    d0.synchronize()
    d1.synchronize()
    records.clear()
    cuctx.sim.stream_busy(s0, 50_000)
    ready = s0.record()
    for stream, x in ((s0b, x0), (s1, x1)):
        stream.wait(ready)
        x.fill(1.0, stream=stream)
    d0.synchronize()
    d1.synchronize()
    (busy,) = [r for r in records if r.kind == "busy"]
    fills = {r.device: r for r in records if r.kind == "memset"}
    assert fills[0].start_ns == busy.end_ns
    assert fills[1].start_ns == busy.end_ns + 6000
