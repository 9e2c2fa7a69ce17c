"""Peer access on every backend: Device.enable_peer_access / disable_peer_access grant and
revoke both the context access (cuCtxEnablePeerAccess) and the default memory pool's access
(cuMemPoolSetAccess), idempotently; the device itself and devices that cannot access are
clear errors. The sim answers the raw calls as the driver does."""

import pytest
from cuda.bindings.driver import CUmemAccess_flags, CUmemLocation, CUmemLocationType, CUresult

import cuctx
from cuctx import Context, Device

READWRITE = CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
NONE = CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_NONE


@pytest.fixture
def pair(backend):
    """Two devices where the first can access the second's memory."""
    devices = cuctx.devices()
    if len(devices) < 2:
        pytest.skip(f"needs two devices; the {backend.name} backend has {len(devices)}")
    a, b = devices[:2]
    if not a.can_access_peer(b):
        pytest.skip(f"{a!r} cannot access {b!r} on this machine (cuDeviceCanAccessPeer is 0)")
    yield a, b
    a.disable_peer_access(b)


def pool_access(accessing: Device, owner: Device):
    drv = owner._backend.driver
    err, pool = drv.cuDeviceGetDefaultMemPool(owner._handle)
    assert not err
    location = CUmemLocation()
    location.type = CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    location.id = accessing.ordinal
    err, flags = drv.cuMemPoolGetAccess(pool, location)
    assert not err
    return flags


def raw_enable(accessing: Device, owner: Device) -> CUresult:
    """cuCtxEnablePeerAccess between the primary contexts, as a probe of the driver's state."""
    peer = owner.primary_context  # held: a released primary context is no peer
    with accessing:
        return accessing._backend.driver.cuCtxEnablePeerAccess(peer._handle, 0)[0]


def test_enable_grants_context_and_pool_access_and_disable_revokes_both(pair):
    a, b = pair
    held = a.primary_context, b.primary_context  # so that the raw probes see the same two
    peer = held[1]
    assert b not in a._peers and pool_access(a, b) == NONE
    a.enable_peer_access(b)
    assert a._peers == {b} and a not in b._peers  # one direction only
    assert pool_access(a, b) == READWRITE and pool_access(b, a) == NONE
    assert raw_enable(a, b) == CUresult.CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED
    a.disable_peer_access(b)
    assert a._peers == set() and pool_access(a, b) == NONE
    assert raw_enable(a, b) == CUresult.CUDA_SUCCESS  # it was disabled: enabling works again
    with a:
        assert a._backend.driver.cuCtxDisablePeerAccess(peer._handle)[0] == 0


def test_enable_and_disable_are_idempotent(pair):
    a, b = pair
    a.enable_peer_access(b)
    a.enable_peer_access(b.ordinal)
    assert a._peers == {b}
    a.disable_peer_access(b)
    a.disable_peer_access(b)
    assert a._peers == set()


def test_access_enabled_by_other_code_is_taken_over(pair):
    a, b = pair
    held = a.primary_context, b.primary_context  # so that the raw probes see the same two
    peer = held[1]
    assert raw_enable(a, b) == CUresult.CUDA_SUCCESS  # as torch's enable_peer_access would
    a.enable_peer_access(b)  # the driver says "already enabled": fine
    assert a._peers == {b} and pool_access(a, b) == READWRITE
    a.disable_peer_access(b)
    assert raw_enable(a, b) == CUresult.CUDA_SUCCESS  # disabled, whoever enabled it
    with a:
        assert a._backend.driver.cuCtxDisablePeerAccess(peer._handle)[0] == 0


def test_the_device_itself_is_a_clear_error(backend):
    device = Device(0)
    assert device.can_access_peer(device) is False
    for method in (device.enable_peer_access, device.disable_peer_access):
        with pytest.raises(ValueError, match="the device itself; kernels always have access"):
            method(device)
    with pytest.raises(TypeError, match="needs a Device"):
        device.enable_peer_access("gpu1")


def test_the_driver_refuses_peer_access_within_one_device(backend):
    """Contexts of one device share its memory: the driver has no peer access between them."""
    device = Device(0)
    primary = device.primary_context
    created = Context.create(device)
    try:
        (err,) = backend.driver.cuCtxEnablePeerAccess(primary._handle, 0)
        assert err == CUresult.CUDA_ERROR_PEER_ACCESS_UNSUPPORTED
    finally:
        created.destroy()


def test_a_reset_ends_peer_access(pair):
    a, b = pair
    a.enable_peer_access(b)
    b.reset()
    assert a._peers == set()  # enable again after a reset
    a.enable_peer_access(b)
    assert a._peers == {b}


def test_a_device_that_cannot_access_is_a_clear_error(sim, monkeypatch):
    a, b = cuctx.devices()
    monkeypatch.setattr(sim.driver, "cuDeviceCanAccessPeer", lambda dev, peer: (0, 0))
    with pytest.raises(cuctx.NotSupportedError, match=r"cannot access memory of .*cuctx\.copy"):
        a.enable_peer_access(b)
    assert a._peers == set()
    a.disable_peer_access(b)  # nothing to disable: fine


def test_the_sims_pool_access_follows_the_driver_rules(sim):
    from cuda.bindings.driver import CUmemAccessDesc

    drv = sim.driver
    _, pool = drv.cuDeviceGetDefaultMemPool(0)

    def desc(device, flags):
        d = CUmemAccessDesc()
        d.location.type = CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        d.location.id = device
        d.flags = flags
        return d

    # the owner's access cannot be lowered (an H100, driver 580, answers INVALID_DEVICE)
    assert drv.cuMemPoolSetAccess(pool, [desc(0, NONE)], 1) == (CUresult.CUDA_ERROR_INVALID_DEVICE,)
    bad_device = drv.cuMemPoolSetAccess(pool, [desc(5, READWRITE)], 1)
    assert bad_device == (CUresult.CUDA_ERROR_INVALID_DEVICE,)
    assert drv.cuMemPoolSetAccess(pool, [desc(0, READWRITE), desc(1, READWRITE)], 2) == (0,)
    assert drv.cuDeviceCanAccessPeer(0, 0) == (0, 0) and drv.cuDeviceCanAccessPeer(0, 1) == (0, 1)
