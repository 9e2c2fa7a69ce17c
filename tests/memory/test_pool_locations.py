"""Pools of page-locked host memory and of managed memory (MemoryPool(location="host" |
"managed"), CUDA 13 pool locations) on both backends: their arrays are arrays like any
other for kernels, copies and fills, and ``arr.host`` is a NumPy view of the same bytes. A
host pool serves its device and other devices once granted; managed memory is every
device's. Where the driver cannot make them, a NotSupportedError says what is needed: CUDA
13.0 drivers crash at a managed pool's first allocation (measured on H200s, driver 580), so
cuctx makes managed pools on newer drivers only; the sim, a CUDA 13.0 driver, is told it is a
newer one to test them."""

from __future__ import annotations

import gc

import numpy as np
import pytest
from cuda.bindings.driver import CUDA_MEMCPY2D, CUmemorytype, CUresult

import cuctx
from cuctx import Device, MemoryPool
from cuctx.kernels import KernelArgumentError

from scenarios import ADD_SOURCE, add, library_fixture

pytestmark = [pytest.mark.usefixtures("nvrtc_cache"), pytest.mark.paths("python", "native")]

lib = library_fixture(ADD_SOURCE, add=add)
N = 8


def made(location: str, monkeypatch: pytest.MonkeyPatch) -> MemoryPool:
    """A pool of ``location`` on device 0, or a skip naming why the driver cannot make it."""
    sim = cuctx.backend().sim
    if location == "managed" and sim is not None:  # the sim as a driver newer than 13.0
        monkeypatch.setattr(cuctx.backend().driver, "cuDriverGetVersion", lambda: (0, 13010))
    try:
        return MemoryPool(Device(0), location=location)
    except cuctx.NotSupportedError as exc:
        pytest.skip(f"this driver or device makes no {location} pools: {exc}")


@pytest.mark.parametrize("location", ["host", "managed"])
def test_arrays_of_host_memory_work_on_the_device_and_the_host(lib, location, monkeypatch):
    pool = made(location, monkeypatch)
    assert pool.location == location and f" {location}:" in repr(pool)
    x = cuctx.to_device(np.arange(N, dtype=np.float32), pool=pool)
    out = cuctx.zeros(N, np.float32, pool=pool)
    lib["add"][1, N](out, x, 1.0, N)
    cuctx.synchronize()  # the host reads what the kernel wrote once it has run
    assert out.host.tolist() == [i + 1.0 for i in range(N)]
    assert out.to_host().tolist() == out.host.tolist()
    out[2:4].host[:] = 0  # the host writes; work enqueued after it sees that
    assert out.to_host().tolist()[1:5] == [2.0, 0.0, 0.0, 5.0]
    assert out.pool is pool and pool.used == 2 * N * 4
    host = out.host
    del out
    gc.collect()
    assert host.tolist()[:3] == [1.0, 2.0, 0.0]  # a host view keeps the memory
    empty = cuctx.empty((0, 4), np.float32, pool=pool)
    assert empty.pool is pool and empty.host.shape == (0, 4)


def test_device_memory_has_no_host_view(backend):
    with Device(0):
        arr = cuctx.zeros(4, pool=MemoryPool(0))
        with pytest.raises(TypeError, match=r"location='host'"):
            _ = arr.host


def on_device_0(
    location: str, monkeypatch: pytest.MonkeyPatch
) -> tuple[MemoryPool, cuctx.DeviceArray]:
    """A pool of ``location`` made on device 0 and an array of it (0, 1, ...), written; or a
    skip where there is no second device to use it from."""
    if len(cuctx.devices()) < 2:
        pytest.skip(f"needs two devices; the {cuctx.backend().name} backend has one")
    with Device(0):
        pool = made(location, monkeypatch)
        x = cuctx.to_device(np.arange(N, dtype=np.float32), pool=pool)
        cuctx.synchronize()
    return pool, x


def test_a_host_pool_serves_another_device_once_granted(backend, lib, monkeypatch):
    pool, x = on_device_0("host", monkeypatch)
    assert pool.access(0) == "rw" and pool.access(1) is None  # the host's memory
    with Device(1):
        out = cuctx.zeros(N, np.float32)
        with pytest.raises(KernelArgumentError, match=r"pool\.set_access\(cuctx\.Device\(1\)"):
            lib["add"][1, N](out, x, 1.0, N)
        pool.set_access(1, "rw")
        lib["add"][1, N](out, x, 1.0, N)
        assert out.to_host().tolist() == [i + 1.0 for i in range(N)]


def test_managed_memory_is_every_devices(backend, lib, monkeypatch):
    pool, x = on_device_0("managed", monkeypatch)
    assert pool.access(1) == "rw"
    with pytest.raises(ValueError, match="every device may use"):
        pool.set_access(1, None)
    with Device(1):
        out = cuctx.zeros(N, np.float32)
        lib["add"][1, N](out, x, 1.0, N)
        assert out.to_host().tolist() == [i + 1.0 for i in range(N)]


def test_bad_locations_are_refused(backend):
    with pytest.raises(ValueError, match=r"location must be one of \('device', 'host', "):
        MemoryPool(0, location="pinned")
    with pytest.raises(ValueError, match="ipc=True is for device pools"):
        MemoryPool(0, location="host", ipc=True)


@pytest.mark.parametrize("location", ["host", "managed"])
def test_an_older_driver_says_what_the_pool_needs(sim, monkeypatch, location):
    monkeypatch.setattr(sim.driver, "cuDriverGetVersion", lambda: (0, 12080))
    with pytest.raises(
        cuctx.NotSupportedError,
        match=rf"{location} memory pools need a CUDA "
        r"13 driver \(this one is 12\.8\)",
    ):
        MemoryPool(0, location=location)


def test_a_cuda_13_0_driver_makes_no_managed_pool_and_says_why(sim):
    assert sim.driver.cuDriverGetVersion() == (0, 13000)  # the sim's recorded driver
    with pytest.raises(
        cuctx.NotSupportedError,
        match=r"managed memory pools crash CUDA 13\.0 "
        r"drivers at their first allocation .*use cuctx\.managed_empty",
    ):
        MemoryPool(0, location="managed")


# -- copies of a host pool's arrays ----------------------------------------------------------
# A host pool's memory is host memory: the driver refuses it as the device side of
# cuMemcpyHtoDAsync (CUDA_ERROR_INVALID_VALUE, two H200s, driver 580), so cuctx copies it
# with cuMemcpyAsync and CU_MEMORYTYPE_UNIFIED, and the sim refuses the device forms as the
# driver does: on both backends these tests fail if a copy takes the device forms.

GRID = np.arange(4 * 5 * 6, dtype=np.float32).reshape(4, 5, 6)
LAYOUTS = {  # the copy planner's layouts: (the view, what it makes of a copy)
    "whole": lambda a: a,  # one linear copy
    "pitched2d": lambda a: a[0, :, 1:5],  # one 2D copy
    "pitched3d": lambda a: a[:, 1:4, 2:5],  # one 3D copy
    "column": lambda a: a[:, 2, 3],  # linear copies in a loop
    "transposed": lambda a: a.transpose(2, 0, 1),  # staged through a host temporary
}


def others(kind: str, shape: tuple, monkeypatch) -> np.ndarray | cuctx.DeviceArray:
    """A zeroed array of ``kind`` to copy a host pool's array to and from (another host
    pool's, for "host pool")."""
    if kind == "pageable":
        return np.zeros(shape, np.float32)
    if kind == "pinned":
        out = cuctx.pinned_empty(shape, np.float32)
        out[...] = 0
        return out
    pool = made("host", monkeypatch) if kind == "host pool" else None
    return cuctx.zeros(shape, np.float32, pool=pool)


def read(arr) -> np.ndarray:
    cuctx.synchronize()
    return arr.copy() if isinstance(arr, np.ndarray) else arr.to_host()


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("kind", ["pageable", "pinned", "device", "host pool"])
def test_a_host_pools_arrays_copy_to_and_from_every_kind_of_memory(
    backend, layout, kind, monkeypatch
):
    view = LAYOUTS[layout]
    with Device(0):
        pooled = cuctx.to_device(GRID, pool=made("host", monkeypatch))
        expected = view(GRID)
        other = others(kind, GRID.shape, monkeypatch)
        cuctx.copy(view(other), view(pooled))  # from the host pool
        model = np.zeros_like(GRID)
        view(model)[...] = expected
        np.testing.assert_array_equal(read(other), model)
        back = cuctx.zeros(GRID.shape, np.float32, pool=pooled.pool)
        cuctx.copy(view(back), view(other))  # into the host pool
        np.testing.assert_array_equal(read(back), model)
        np.testing.assert_array_equal(back.host, model)


def test_a_host_pools_arrays_copy_inside_a_capture(backend, monkeypatch):
    with Device(0):
        pool = made("host", monkeypatch)
        s = cuctx.Stream()
        pooled = cuctx.to_device(GRID, stream=s, pool=pool)
        device = cuctx.zeros(GRID.shape, np.float32, stream=s)
        pinned = cuctx.pinned_empty((5, 4), np.float32)
        back = cuctx.zeros((5, 4), np.float32, stream=s, pool=pool)
        with s.capture() as graph:
            cuctx.copy(device, pooled, s)  # linear, host pool -> device
            cuctx.copy(pinned, device[1, :, 1:5], s)  # 2D, device -> pinned
            cuctx.copy(back, pooled[2, :, 2:6], s)  # 2D, host pool -> host pool
        assert [node.kind for node in graph.nodes] == ["copy"] * 3
        s.synchronize()
        assert not device.to_host().any()  # the capture ran nothing
        graph.instantiate().launch(s)
        s.synchronize()
        np.testing.assert_array_equal(device.to_host(), GRID)
        np.testing.assert_array_equal(pinned, GRID[1, :, 1:5])
        np.testing.assert_array_equal(back.host, GRID[2, :, 2:6])


def test_a_host_pools_array_copies_to_another_device_without_access(backend, monkeypatch):
    pool, x = on_device_0("host", monkeypatch)
    with Device(0):
        s0 = cuctx.Stream()
    with Device(1):
        assert pool.access(1) is None  # kernels on device 1 may not use it; copies may
        out = cuctx.zeros(N, np.float32)
        cuctx.copy(out, x)  # device 1's copy of host memory, on its stream
        assert out.to_host().tolist() == list(range(N))
        out.fill(7.0)
        cuctx.copy(x, out)
        cuctx.synchronize()
        with pytest.raises(ValueError, match="made by the other side's device"):
            cuctx.copy(out, x, s0)
    assert x.host.tolist() == [7.0] * N


@pytest.mark.usefixtures("graphs_pay")
def test_autograph_copies_host_pool_and_device_arrays_as_eagerly(backend, monkeypatch):
    @cuctx.autograph
    def step(out, x):
        cuctx.copy(out, x)
        cuctx.copy(x[::2], out[1::2])  # a 2D copy of every other element

    with Device(0):
        pool = made("host", monkeypatch)
        results = []
        for i in range(8):  # a host pool's sources, then device arrays among them
            src = cuctx.to_device(
                np.arange(i, i + N, dtype=np.float32), pool=pool if i < 4 or i % 2 else None
            )
            out = cuctx.zeros(N, np.float32, pool=pool if i % 3 == 0 else None)
            step(out, src)
            results.append((i, out, src))
        for i, out, src in results:
            expected = np.arange(i, i + N, dtype=np.float32)
            assert out.to_host().tolist() == expected.tolist()
            expected[::2] = expected[1::2]
            assert src.to_host().tolist() == expected.tolist()
    stats = step.stats()
    assert stats["builds"] + stats["replays"] + stats["updates"] >= 4  # graphs ran


# The driver's refusal: measured for cuMemcpyHtoDAsync; the other calls that name a device
# side are refused by the same rule in the sim, and their GPU runs check that rule.
REFUSED = {
    "cuMemcpyHtoDAsync": lambda d, p, dev, host, h: d.cuMemcpyHtoDAsync(p, host, 32, h),
    "cuMemcpyDtoHAsync": lambda d, p, dev, host, h: d.cuMemcpyDtoHAsync(host, p, 32, h),
    "cuMemcpyDtoDAsync to": lambda d, p, dev, host, h: d.cuMemcpyDtoDAsync(p, dev, 32, h),
    "cuMemcpyDtoDAsync from": lambda d, p, dev, host, h: d.cuMemcpyDtoDAsync(dev, p, 32, h),
    "cuMemcpy2DAsync as DEVICE": lambda d, p, dev, host, h: d.cuMemcpy2DAsync(
        pitched(p, DEVICE, host, HOST), h
    ),
}
HOST, DEVICE, UNIFIED = (
    CUmemorytype.CU_MEMORYTYPE_HOST,
    CUmemorytype.CU_MEMORYTYPE_DEVICE,
    CUmemorytype.CU_MEMORYTYPE_UNIFIED,
)


def pitched(dst: int, dst_type, src: int, src_type) -> CUDA_MEMCPY2D:
    """A 2D copy of 4 rows of 8 bytes, each side named as its memory type says."""
    copy = CUDA_MEMCPY2D()
    for side, address, memory_type in (("dst", dst, dst_type), ("src", src, src_type)):
        setattr(copy, side + "MemoryType", memory_type)
        setattr(copy, side + ("Host" if memory_type == HOST else "Device"), address)
        setattr(copy, side + "Pitch", 8)
    copy.WidthInBytes, copy.Height = 8, 4
    return copy


@pytest.mark.parametrize("call", REFUSED)
def test_the_driver_refuses_a_host_pools_memory_as_device_memory(backend, call, monkeypatch):
    drv = backend.driver
    with Device(0):
        s = cuctx.Stream()
        pooled = cuctx.zeros(8, np.float32, stream=s, pool=made("host", monkeypatch))
        device = cuctx.zeros(8, np.float32, stream=s)
        host = cuctx.pinned_empty(8, np.float32)
        host[:] = 3.0
        s.synchronize()
        h = s._handle
        assert REFUSED[call](drv, pooled.ptr, device.ptr, host.ctypes.data, h) == (
            CUresult.CUDA_ERROR_INVALID_VALUE,
        )
        # The unified forms take it, and so does a memset.
        assert drv.cuMemcpyAsync(pooled.ptr, host.ctypes.data, 32, h) == (CUresult.CUDA_SUCCESS,)
        assert drv.cuMemsetD32Async(pooled.ptr + 16, 0, 4, h) == (CUresult.CUDA_SUCCESS,)
        assert drv.cuMemcpy2DAsync(pitched(device.ptr, DEVICE, pooled.ptr, UNIFIED), h) == (
            CUresult.CUDA_SUCCESS,
        )
        s.synchronize()
        assert pooled.host.tolist() == [3.0] * 4 + [0.0] * 4
        assert device.to_host().tolist() == pooled.host.tolist()
