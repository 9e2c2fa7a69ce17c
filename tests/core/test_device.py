"""Devices on every backend: identity, properties generated from the enum, bad ordinals."""

import re

import numpy as np
import pytest
from cuda.bindings.driver import CUdevice_attribute

import cuctx
from cuctx._enums import ATTRIBUTE_NAMES

pytestmark = pytest.mark.paths()


def test_one_object_per_ordinal(backend):
    devices = cuctx.devices()
    assert len(devices) >= 1
    assert devices[0] is cuctx.Device(0) is cuctx.Device(np.int64(0)) is cuctx.Device(devices[0])
    assert [d.ordinal for d in devices] == list(range(len(devices)))


@pytest.mark.parametrize("ordinal", [99, -1])
def test_bad_ordinal_is_a_clear_error(backend, ordinal):
    count = len(cuctx.devices())
    with pytest.raises(
        cuctx.InvalidDeviceError, match=f"valid ordinals are 0 to {count - 1}"
    ) as info:
        cuctx.Device(ordinal)
    assert info.value.code == 101 and info.value.name == "CUDA_ERROR_INVALID_DEVICE"


@pytest.mark.parametrize("ordinal", ["0", 1.0, True, None])
def test_non_integer_ordinal_is_a_type_error(backend, ordinal):
    with pytest.raises(TypeError, match="device ordinal must be an int"):
        cuctx.Device(ordinal)


def test_identity_strings_have_the_standard_formats(backend):
    device = cuctx.Device(0)
    assert "H100" in device.name or backend.name == "cuda"
    hexes = "-".join(f"[0-9a-f]{{{n}}}" for n in (8, 4, 4, 4, 12))
    assert re.fullmatch(f"GPU-{hexes}", device.uuid)
    assert re.fullmatch(r"[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-9a-f]", device.pci_bus_id, re.I)
    uuids = {d.uuid for d in cuctx.devices()}
    assert len(uuids) == len(cuctx.devices())


def test_memory_sizes_are_consistent(backend):
    device = cuctx.Device(0)
    info = device.mem_info()
    assert 0 < info.free <= info.total == device.total_memory
    # It needs a context: with none current, the device's primary one became current.
    assert cuctx.Context.pop() is device.primary_context


def test_properties_cover_every_attribute_of_the_enum(backend):
    props = cuctx.Device(0).properties
    expected = {
        name.removeprefix("CU_DEVICE_ATTRIBUTE_").lower()
        for name in CUdevice_attribute.__members__
        if name != "CU_DEVICE_ATTRIBUTE_MAX"
    }
    assert set(ATTRIBUTE_NAMES) == expected
    values = props.as_dict()
    assert len(values) >= 140  # a few very new attributes may be unknown to the driver
    assert values["warp_size"] == 32 == props.warp_size
    assert type(props.warp_size) is int
    assert values["max_threads_per_block"] == 1024
    cc = cuctx.Device(0).compute_capability
    assert (values["compute_capability_major"], values["compute_capability_minor"]) == cc
    assert cc >= (7, 0) and str(cc) == f"{cc.major}.{cc.minor}"


def test_properties_include_the_enums_aliases(backend):
    props = cuctx.Device(0).properties
    # Two names for one value in CUdevice_attribute: both work and agree.
    assert props.virtual_memory_management_supported == props.virtual_address_management_supported
    assert props.max_shared_memory_per_block == props.shared_memory_per_block
    assert "virtual_memory_management_supported" in props.as_dict()


def test_yes_no_properties_are_bools(backend):
    props = cuctx.Device(0).properties
    for name in (
        "unified_addressing",
        "managed_memory",
        "concurrent_kernels",
        "can_map_host_memory",
        "memory_pools_supported",
        "ecc_enabled",
        "cooperative_launch",
        "virtual_memory_management_supported",
    ):
        assert type(getattr(props, name)) is bool, name
    assert props.unified_addressing is True and props.memory_pools_supported is True
    assert type(props.multiprocessor_count) is int and type(props.compute_mode) is int
    assert all(
        type(value) is bool
        for name, value in props.as_dict().items()
        if name.endswith("_supported")
    )


def test_attribute_unknown_to_the_driver_is_not_supported(sim):
    device = cuctx.Device(0)
    attributes = device._backend.driver._devices[0].attributes
    del attributes[CUdevice_attribute.CU_DEVICE_ATTRIBUTE_WARP_SIZE]
    with pytest.raises(
        cuctx.NotSupportedError, match="does not know CU_DEVICE_ATTRIBUTE_WARP_SIZE"
    ):
        _ = device.properties.warp_size
    assert "warp_size" not in device.properties.as_dict()


def test_sim_models_an_h100(sim):
    device = cuctx.Device(0)
    props = device.properties
    assert device.compute_capability == (9, 0)
    assert props.multiprocessor_count == 132
    assert props.max_shared_memory_per_block_optin == 232448
    grid = (props.max_grid_dim_x, props.max_grid_dim_y, props.max_grid_dim_z)
    assert grid == (2**31 - 1, 65535, 65535)
    assert device.total_memory == 85017493504  # what a real H100 80GB HBM3 reports
    assert len(cuctx.devices()) == 2


def test_peer_access_is_reported(backend):
    devices = cuctx.devices()
    assert devices[0].can_access_peer(devices[0]) is False
    if len(devices) > 1:
        # Peer access is a property of the pair; the sim models NVLink-connected H100s.
        assert devices[0].can_access_peer(1) == devices[1].can_access_peer(0)
        assert devices[0].can_access_peer(1) or backend.name == "cuda"
    with pytest.raises(TypeError, match="needs a Device"):
        devices[0].can_access_peer("gpu1")
