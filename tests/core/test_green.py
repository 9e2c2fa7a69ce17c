"""Green contexts (`Device.partition`): contexts on disjoint SMs of one device. On the GPU
(the `backend` fixture's cuda run) this needs driver support (CUDA 12.4+, sm_80+)."""

import numpy as np
import pytest

import cuctx
from cuctx._driver.sim import Activity

SOURCE = r"""
extern "C" __global__ void scale(float* out, const float* in, float factor, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i] * factor;
}
"""
N = 1 << 16


def scale_twin(grid, block, out, data, factor: float, n):
    out.view(np.float32, n)[:] = data.view(np.float32, n) * np.float32(factor)


def test_a_partition_gives_green_contexts_that_run_work(backend):
    library = cuctx.Library.from_source(SOURCE, sim_kernels={"scale": scale_twin})
    device = cuctx.Device(0)
    with device.partition([16, 16]) as parts:
        assert len(parts) == 2 and parts.sm_counts == [16, 16]
        assert all(ctx.kind == "green" for ctx in parts)
        for ctx in parts:
            with ctx:
                x = cuctx.to_device(np.ones(N, np.float32))
                library["scale"][N // 256, 256](x, x, 3.0, N)
                assert float(x.to_host().sum()) == 3.0 * N
                del x
    assert all(ctx.state == "destroyed" for ctx in parts)


def test_partitions_of_different_sizes_take_groups_of_one_split(backend):
    # The driver does not split a split's output again: each partition is made of groups of
    # the driver's granularity from one split (on the GPU, one group at a time failed with
    # CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION).
    library = cuctx.Library.from_source(SOURCE, sim_kernels={"scale": scale_twin})
    with cuctx.Device(0).partition([8, 20]) as parts:
        assert parts.sm_counts == [8, 24]  # rounded up to multiples of 8
        for ctx in parts:
            with ctx:
                x = cuctx.to_device(np.ones(N, np.float32))
                library["scale"][N // 256, 256](x, x, 2.0, N)
                assert float(x.to_host().sum()) == 2.0 * N
                del x


def test_the_sim_makes_the_groups_an_h100_makes(sim):
    device = cuctx.Device(0)  # 132 SMs: 15 groups of 8 (not 16), 8 of 16, one of all 132
    with device.partition([8] * 15) as parts, device.partition([16] * 8) as halves:
        assert sum(parts.sm_counts) == 120 and sum(halves.sm_counts) == 128
    with pytest.raises(ValueError, match=r"makes only 15 group\(s\) of 8 .* where 16 are"):
        device.partition([120, 8])
    with device.partition([132]) as whole:
        assert whole.sm_counts == [132]


def test_a_partition_larger_than_the_device_is_refused(backend):
    device = cuctx.Device(0)
    with pytest.raises(ValueError, match="SMs"):
        device.partition([4096])
    with pytest.raises(ValueError, match="positive"):
        device.partition([])


def test_sm_counts_must_be_a_list_of_positive_ints(backend):
    device = cuctx.Device(0)
    with pytest.raises(TypeError, match=r"SM counts are ints.*\[64\.9\] holds float 64\.9"):
        device.partition([64.9])  # not rounded down to 64
    with pytest.raises(
        TypeError,
        match=r"list of SM counts.*not int 64; for one partition "
        r"of 64 SMs, pass \[64\]",
    ):
        device.partition(64)
    with pytest.raises(TypeError, match="not str '64'"):
        device.partition("64")  # not the counts 6 and 4
    with pytest.raises(TypeError, match="holds bool True"):
        device.partition([True])
    with pytest.raises(TypeError, match="not NoneType None"):
        device.partition(None)
    with pytest.raises(ValueError, match=r"positive ints.*got \[16, -4\]"):
        device.partition([16, -4])
    with device.partition(np.array([16, 16])) as parts:  # NumPy's ints are ints
        assert parts.sm_counts == [16, 16]


def test_kernels_of_two_partitions_overlap_on_the_sim(sim):
    records: list[Activity] = []
    sim.sim.subscribe_activity(records.append)
    try:
        library = cuctx.Library.from_source(SOURCE, sim_kernels={"scale": scale_twin})
        with cuctx.Device(0).partition([64, 64]) as parts:
            arrays = []
            for ctx in parts:
                with ctx:
                    x = cuctx.zeros(N, np.float32)
                    ctx.synchronize()
                    library["scale"][N // 256, 256](x, x, 2.0, N)
                    arrays.append(x)
            for ctx in parts:
                ctx.synchronize()
            del arrays, x
    finally:
        sim.sim.unsubscribe_activity(records.append)
    a, b = [r for r in records if r.kind == "kernel"]
    assert a.context != b.context and a.start_ns < b.end_ns and b.start_ns < a.end_ns
