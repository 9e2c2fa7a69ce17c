"""Copies of any layout: strided, transposed and reversed views in every direction (host to
device, device to host, device to device, between contexts of a device, between devices),
checked against NumPy; fills of non-contiguous views; overlapping copies; page-locked
strided copies stay asynchronous."""

import gc

import numpy as np
import pytest

import cuctx
from cuctx import Context, Device, Stream
from cuctx.memory import _copy

HOST = np.arange(4 * 5 * 6, dtype=np.float32).reshape(4, 5, 6)

LAYOUTS = {  # views of a (4, 5, 6) array; each is also a host layout of the same shape
    "whole": lambda a: a,
    "rows": lambda a: a[1:3],  # contiguous
    "pitched2d": lambda a: a[0, :, 1:5],  # a 2D pitched layout
    "pitched3d": lambda a: a[:, 1:4, 2:5],  # a 3D pitched layout
    "every_other": lambda a: a[:, ::2, ::2],  # element rows
    "column": lambda a: a[:, 2, 3],  # one element per row
    "transposed": lambda a: a.transpose(2, 0, 1),
    "T": lambda a: a.T,
    "reversed": lambda a: a[::-1, :, ::-1],
    "mixed": lambda a: a[::-2, 1:, ::3].transpose(1, 2, 0),
}


@pytest.mark.parametrize("name", LAYOUTS)
def test_strided_views_to_and_from_the_host(backend, name):
    view = LAYOUTS[name]
    arr = cuctx.to_device(HOST)
    expected = view(HOST)
    np.testing.assert_array_equal(view(arr).to_host(), expected)  # device view -> new host
    out = view(np.zeros_like(HOST))
    view(arr).to_host(out=out)  # device view -> host view
    np.testing.assert_array_equal(out, expected)
    target = cuctx.zeros(HOST.shape, HOST.dtype)
    view(target).copy_from(expected)  # contiguous host -> device view
    model = np.zeros_like(HOST)
    view(model)[...] = expected
    np.testing.assert_array_equal(target.to_host(), model)
    np.testing.assert_array_equal(cuctx.to_device(view(HOST)).to_host(), expected)  # host view


@pytest.mark.parametrize("src_name", LAYOUTS)
@pytest.mark.parametrize("dst_name", ["whole", "pitched3d", "transposed", "reversed", "mixed"])
def test_device_to_device_between_any_layouts(backend, src_name, dst_name):
    src_view, dst_view = LAYOUTS[src_name], LAYOUTS[dst_name]
    expected = src_view(HOST)
    if dst_view(HOST).shape != expected.shape:
        # Same shapes are needed: copy into a fresh array laid out like dst_view.
        dst = cuctx.empty(expected.shape[::-1], HOST.dtype).T
    else:
        dst = dst_view(cuctx.zeros(HOST.shape, HOST.dtype))
    cuctx.copy(dst, src_view(cuctx.to_device(HOST)))
    np.testing.assert_array_equal(dst.to_host(), expected)


@pytest.mark.parametrize("name", LAYOUTS)
def test_fill_of_any_view_sets_only_its_elements(backend, name):
    view = LAYOUTS[name]
    arr = cuctx.to_device(HOST)
    view(arr).fill(-1)
    model = HOST.copy()
    view(model)[...] = -1
    np.testing.assert_array_equal(arr.to_host(), model)


def test_fill_of_a_misaligned_view(backend):
    arr = cuctx.zeros(9, np.uint8)
    words = arr[1:].view(np.uint32)  # 4-byte elements at an odd address: no memset fits
    words.fill(0x01020304)
    assert arr.to_host().tolist() == [0] + [4, 3, 2, 1] * 2


def test_fill_refuses_values_it_would_change(backend):
    arr = cuctx.zeros(3, np.int8)
    for value, error, match in (
        (300, ValueError, "out of range"),
        (np.int64(300), ValueError, "out of range"),
        (1.5, TypeError, "truncated"),
        ([1, 2], TypeError, "one number"),
        ("3", TypeError, "one number"),
    ):
        with pytest.raises(error, match=match):
            arr.fill(value)
    with pytest.raises(TypeError, match="imaginary"):
        cuctx.zeros(3, np.float32).fill(1 + 2j)
    assert arr.to_host().tolist() == [0, 0, 0]


def test_overlapping_copies_read_before_they_write(backend):
    host = np.arange(100, dtype=np.int64)
    arr = cuctx.to_device(host)
    arr[1:].copy_from(arr[:-1])
    np.testing.assert_array_equal(arr.to_host(), np.concatenate([[0], host[:-1]]))
    arr = cuctx.to_device(host)
    arr[:-3].copy_from(arr[3:])
    np.testing.assert_array_equal(arr.to_host(), np.concatenate([host[3:], host[-3:]]))
    square = cuctx.to_device(host.reshape(10, 10))
    square.copy_from(square.T)  # an in-place transpose
    np.testing.assert_array_equal(square.to_host(), host.reshape(10, 10).T)


@pytest.mark.parametrize(
    "make",
    [
        lambda: np.arange(10.0),
        lambda: np.arange(10.0)[3:],
        lambda: np.arange(24.0)[::-2],
        lambda: np.arange(24).reshape(4, 6).T[1:, 2:],
        lambda: np.empty(0),
        lambda: np.arange(4, dtype=">i4"),
        lambda: np.broadcast_to(np.arange(3), (4, 3)),
        lambda: np.ma.masked_array(np.arange(5)),
        lambda: cuctx.pinned_empty(8)[2:],
    ],
    ids=[
        "whole",
        "offset",
        "reversed",
        "transposed view",
        "empty",
        "big-endian",
        "read-only broadcast",
        "subclass",
        "page-locked",
    ],
)
def test_a_host_arrays_address_is_its_first_elements(backend, make):
    """Copies read it without building __array_interface__ (in C where the extension is
    built): the same address either way."""
    host = make()
    expected = host.__array_interface__["data"][0]
    assert _copy.host_address(host) == _copy._interface_address(host) == expected


def test_host_address_refuses_what_is_not_numpys_array_interface():
    class Impostor:
        __array_struct__ = 5

    with pytest.raises((TypeError, AttributeError)):
        _copy.host_address(Impostor())


def test_copy_plans_are_kept_for_a_bounded_number_of_layouts(backend, monkeypatch):
    """Each pair of layouts is planned once; a program making ever new layouts keeps at most
    PLANS_KEPT plans, and every copy is still right."""
    monkeypatch.setattr(_copy, "PLANS_KEPT", 4)
    for rows in range(1, 12):
        host = np.arange(rows * 3, dtype=np.float32).reshape(rows, 3)
        arr = cuctx.zeros((rows, 3), np.float32)
        arr.T.copy_from(host.T)
        np.testing.assert_array_equal(arr.to_host(), host)
        assert len(_copy._planned) <= 4


def test_pinned_strided_copies_are_asynchronous_and_complete_after_sync(backend):
    stream = Stream(Device(0))
    pinned = cuctx.pinned_empty((4, 5, 6), np.float32)
    pinned[...] = HOST
    arr = cuctx.zeros((4, 5, 6), np.float32, stream=stream)
    arr[:, 1:4, 2:5].copy_from(pinned[:, 1:4, 2:5], stream=stream)  # one 3D copy
    out = cuctx.pinned_empty((4, 3, 3), np.float32)
    arr[:, 1:4, 2:5].to_host(out=out, stream=stream)
    del pinned
    gc.collect()  # the stream holds the host array of its queued copy
    stream.synchronize()
    np.testing.assert_array_equal(out, HOST[:, 1:4, 2:5])


def test_copies_between_contexts_of_one_device(backend):
    """The driver lets every context of a device use the others' memory (unified
    addressing); cuctx allows it, as docs/memory.md explains."""
    a = cuctx.to_device(HOST)  # in the primary context
    a.context.synchronize()  # the upload is on its stream; `other`'s streams do not wait for it
    other = Context.create(Device(0))
    try:
        b = cuctx.zeros(HOST.shape, HOST.dtype)
        assert b.context is other and a.context is not other
        cuctx.copy(b, a)  # on b's context's stream
        np.testing.assert_array_equal(b.to_host(), HOST)
        c = cuctx.zeros((6, 5, 4), HOST.dtype)
        c.copy_from(a.T)  # strided, between contexts
        a.fill(0)
        a.context.synchronize()  # the fill is on another context's stream: order it
        other.synchronize()  # and c's copy: a created stream does not wait for the legacy one
        a.copy_from(c.T, stream=Stream(Device(0)))  # a stream of the source's context
        other.synchronize()
    finally:
        Context.pop()
    np.testing.assert_array_equal(c.to_host(), HOST.T)
    np.testing.assert_array_equal(a.to_host(), HOST)
    other.destroy()


def test_strided_copies_between_devices(backend):
    if len(cuctx.devices()) < 2:
        pytest.skip("needs two devices")
    a = cuctx.to_device(HOST, device=0)
    b = cuctx.zeros((6, 5, 4), HOST.dtype, device=1)
    cuctx.copy(b, a.T)  # a non-contiguous source, staged on its device
    np.testing.assert_array_equal(b.to_host(), HOST.T)
    c = cuctx.zeros(HOST.shape, HOST.dtype, device=1)
    cuctx.copy(c[:, ::2], a[::-1, ::2])  # both sides strided
    model = np.zeros_like(HOST)
    model[:, ::2] = HOST[::-1, ::2]
    np.testing.assert_array_equal(c.to_host(), model)
    s0 = Stream(Device(0))
    cuctx.copy(a.T, b, stream=s0)  # a stream of the destination's device
    s0.synchronize()
    np.testing.assert_array_equal(a.to_host(), HOST)
