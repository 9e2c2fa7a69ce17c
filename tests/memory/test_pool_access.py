"""Which devices may use a pool's memory (MemoryPool.set_access / access: cuMemPoolSetAccess),
on both backends: a kernel on device 1 is refused an array of device 0's pool until the pool
grants device 1 access, then reads and writes it; taking access away refuses it again.
Read-only access ("r") is refused by CUDA 13.0 drivers, and asking one crashed the process
later (measured on two H200s, driver 580): cuctx refuses it without asking, saying so.
Device.enable_peer_access covers the default pools only, not an explicit pool. On the sim a
kernel that reaches the memory anyway (a raw address) faults, as on a GPU. Bad requests are
clear errors."""

from __future__ import annotations

import gc

import numpy as np
import pytest
from cuda.bindings.driver import CUmemAccess_flags, CUmemAccessDesc, CUmemLocationType, CUresult

import cuctx
from cuctx import Device, MemoryPool
from cuctx.kernels import KernelArgumentError

from scenarios import ADD_SOURCE, add, driver_calls, library_fixture

pytestmark = [pytest.mark.usefixtures("nvrtc_cache"), pytest.mark.paths("python", "native")]

lib = library_fixture(ADD_SOURCE, add=add)
N = 8


@pytest.fixture
def two(backend):
    """Devices 0 and 1, where 1 can access 0's memory."""
    devices = cuctx.devices()
    if len(devices) < 2:
        pytest.skip(f"needs two devices; the {backend.name} backend has {len(devices)}")
    if not devices[1].can_access_peer(devices[0]):
        pytest.skip("device 1 cannot access device 0's memory (cuDeviceCanAccessPeer is 0)")
    yield devices[0], devices[1]
    gc.collect()
    for device in devices[:2]:
        device.synchronize()


def pool_array(device: Device) -> tuple[MemoryPool, cuctx.DeviceArray]:
    with device:
        pool = MemoryPool(device)
        x = cuctx.to_device(np.arange(N, dtype=np.float32), pool=pool)
        cuctx.synchronize()
    return pool, x


def test_a_kernel_on_another_device_uses_a_pools_array_once_granted(two, lib):
    d0, d1 = two
    pool, x = pool_array(d0)
    assert pool.access(d0) == "rw" and pool.access(d1) is None
    with d1:
        out = cuctx.zeros(N, np.float32)
        with pytest.raises(
            KernelArgumentError,
            match=r"no access to that pool's memory: call "
            r"pool\.set_access\(cuctx\.Device\(1\), 'rw'\)",
        ):
            lib["add"][1, N](out, x, 1.0, N)
        pool.set_access(d1, "rw")
        assert pool.access(d1) == "rw" and pool.access(1) == "rw"
        lib["add"][1, N](out, x, 1.0, N)  # reads device 0's memory
        lib["add"][1, N](x, out, 1.0, N)  # and writes it
        cuctx.synchronize()
    assert out.to_host().tolist() == [i + 1.0 for i in range(N)]
    assert x.to_host().tolist() == [i + 2.0 for i in range(N)]
    pool.set_access(d1, None)  # waits for device 1's work first
    assert pool.access(d1) is None
    with d1, pytest.raises(KernelArgumentError, match="no access to that pool's memory"):
        lib["add"][1, N](out, x, 1.0, N)


def test_read_only_access_is_refused_saying_so(two):
    d0, d1 = two
    pool, _ = pool_array(d0)
    with pytest.raises(
        cuctx.NotSupportedError,
        match=r"cuMemPoolSetAccess.*no read-only "
        r"access to a pool's memory .*grant 'rw'",
    ):
        pool.set_access(d1, "r")
    assert pool.access(d1) is None  # nothing changed


def test_read_only_access_is_refused_without_asking_the_driver(two, monkeypatch):
    """Asked for read-only access, a CUDA 13.0 driver refuses, and the process crashed in a
    later cuMemAllocFromPoolAsync or cuMemPoolDestroy (two H200s, driver 580: 3 runs of 3
    with both paths' variants in one process): cuctx refuses before the driver is asked."""
    d0, d1 = two
    pool, _ = pool_array(d0)
    if int(d0._backend.driver.cuDriverGetVersion()[1]) >= 13010:
        pytest.skip("a driver newer than CUDA 13.0 is asked (no measurement says it crashes)")
    asked = driver_calls(monkeypatch, d0._backend.driver, "cuMemPoolSetAccess")
    with pytest.raises(cuctx.NotSupportedError, match="no read-only access"):
        pool.set_access(d1, "r")
    assert asked == []


def test_peer_access_covers_the_default_pools_only(two, lib):
    d0, d1 = two
    pool, x = pool_array(d0)
    d1.enable_peer_access(d0)
    try:
        with d0:
            plain = cuctx.to_device(np.arange(N, dtype=np.float32))  # the default pool's
        with d1:
            out = cuctx.zeros(N, np.float32)
            lib["add"][1, N](out, plain, 1.0, N)
            with pytest.raises(KernelArgumentError, match=r"pool\.set_access"):
                lib["add"][1, N](out, x, 1.0, N)
            assert out.to_host().tolist() == [i + 1.0 for i in range(N)]
    finally:
        d1.disable_peer_access(d0)


def primary_active(device: Device) -> bool:
    err, _, active = device._backend.driver.cuDevicePrimaryCtxGetState(device._handle)
    assert not err
    return bool(active)


@pytest.mark.primary_unheld
def test_a_grant_keeps_the_devices_primary_context_until_taken_away_or_destroyed(two, monkeypatch):
    """Device 1's address space maps the pool's memory while it has access: its primary
    context stays retained till the access goes, or the pool is destroyed (and then after
    cuMemPoolDestroy). Judged by cuctx's own retains and releases of it: an earlier test of
    the process may hold it too (`Device.set_current` keeps it, as cudaSetDevice does)."""
    d0, d1 = two
    calls = driver_calls(
        monkeypatch,
        d0._backend.driver,
        "cuMemPoolDestroy",
        "cuDevicePrimaryCtxRetain",
        "cuDevicePrimaryCtxRelease",
    )

    def of_device_1() -> list[str]:
        gc.collect()
        names = [
            name
            for name, args in calls
            if name == "cuMemPoolDestroy" or int(args[0]) == int(d1._handle)
        ]
        calls.clear()
        return names

    pool, x = pool_array(d0)
    of_device_1()
    pool.set_access(d1, "rw")
    assert of_device_1() == ["cuDevicePrimaryCtxRetain"]  # the grant holds it
    assert primary_active(d1)
    pool.set_access(d1, "rw")  # granted again: still one hold
    assert of_device_1() == []
    pool.set_access(d1, None)
    assert of_device_1() == ["cuDevicePrimaryCtxRelease"]
    pool.set_access(d1, "rw")
    assert of_device_1() == ["cuDevicePrimaryCtxRetain"]
    del pool, x
    assert of_device_1() == ["cuMemPoolDestroy", "cuDevicePrimaryCtxRelease"]


def test_a_reset_of_a_granted_device_takes_the_access_away(two, lib):
    d0, d1 = two
    pool, x = pool_array(d0)
    pool.set_access(d1, "rw")
    d1.reset()
    assert pool.access(d1) is None
    with d1:
        out = cuctx.zeros(N, np.float32)
        with pytest.raises(KernelArgumentError, match="no access to that pool's memory"):
            lib["add"][1, N](out, x, 1.0, N)
        pool.set_access(d1, "rw")  # granted again
        lib["add"][1, N](out, x, 1.0, N)
        cuctx.synchronize()
    assert out.to_host().tolist() == [i + 1.0 for i in range(N)]
    assert x.to_host().tolist() == list(range(N))  # the pool's memory is as it was


def test_a_reset_of_the_pools_own_device_takes_its_grants_away(two):
    d0, d1 = two
    pool, x = pool_array(d0)
    pool.set_access(d1, "rw")
    d0.reset()
    assert pool.access(d1) is None


def test_bad_requests_are_refused(two):
    d0, d1 = two
    pool, _ = pool_array(d0)
    with pytest.raises(ValueError, match=r"mode must be 'rw', 'r' or None, not 'w'"):
        pool.set_access(d1, "w")
    with pytest.raises(ValueError, match="always has read-write access"):
        pool.set_access(d0, None)
    with pytest.raises(TypeError, match="needs a Device of the pool's backend"):
        pool.set_access("1", "rw")
    with pytest.raises(cuctx.InvalidDeviceError):
        pool.access(7)
    assert pool.access(d1) is None  # nothing changed


def test_on_the_sim_a_kernel_faults_on_a_pools_memory_it_may_not_use(backend, lib):
    """A raw address passes no argument check: the sim's kernel reach check reads the
    pool's access list, as the GPU's page tables would."""
    if backend.sim is None:
        pytest.skip("on a GPU the fault is sticky for the whole process: the sim shows it")
    d0, d1 = Device(0), Device(1)
    pool, x = pool_array(d0)
    with d1:
        out = cuctx.zeros(N, np.float32)
        lib["add"][1, N](out, x.ptr, 1.0, N)
        with pytest.raises(
            cuctx.StickyFaultError,
            match=r"ILLEGAL_ADDRESS.*memory of device 0 "
            r"from device 1 without access to its pool \(pool\.set_access",
        ):
            cuctx.synchronize()


def test_the_sims_raw_pool_access_follows_the_driver_rules(sim):
    pool, _ = pool_array(Device(0))
    drv = sim.driver
    grant = CUmemAccessDesc()
    grant.location.type = CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    grant.location.id = 1
    grant.flags = CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READ  # H200s, driver 580:
    assert drv.cuMemPoolSetAccess(pool._handle, [grant], 1) == (CUresult.CUDA_ERROR_NOT_SUPPORTED,)
    grant.flags = CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
    assert drv.cuMemPoolSetAccess(pool._handle, [grant], 1) == (CUresult.CUDA_SUCCESS,)
    assert drv.cuMemPoolGetAccess(pool._handle, grant.location)[1] == grant.flags
    grant.location.id = 0  # the owner's access cannot be lowered (an H100, driver 580)
    grant.flags = CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_NONE
    assert drv.cuMemPoolSetAccess(pool._handle, [grant], 1) == (CUresult.CUDA_ERROR_INVALID_DEVICE,)
