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

import cuctx
from cuctx import Device, MemoryPool
from cuctx.kernels import KernelArgumentError

from scenarios import ADD_SOURCE, add, library_fixture
from test_pool import pools_on_gpu_opt_in  # noqa: F401 - the fixture, shared

pytestmark = [pytest.mark.usefixtures("nvrtc_cache", "pools_on_gpu_opt_in"),
              pytest.mark.paths("python", "native")]

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


def on_device_0(location: str, monkeypatch: pytest.MonkeyPatch
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
    with pytest.raises(cuctx.NotSupportedError, match=rf"{location} memory pools need a CUDA "
                       r"13 driver \(this one is 12\.8\)"):
        MemoryPool(0, location=location)


def test_a_cuda_13_0_driver_makes_no_managed_pool_and_says_why(sim):
    assert sim.driver.cuDriverGetVersion() == (0, 13000)  # the sim's recorded driver
    with pytest.raises(cuctx.NotSupportedError, match=r"managed memory pools crash CUDA 13\.0 "
                       r"drivers at their first allocation .*use cuctx\.managed_empty"):
        MemoryPool(0, location="managed")
