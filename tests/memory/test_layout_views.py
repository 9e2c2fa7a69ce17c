"""DeviceArray basics: reshape, view(dtype), transpose/.T and copy() follow NumPy's rules on
the same data; a layout that needs a copy is a clear error saying so; repr shows a
destroyed or poisoned context without asking the driver."""

import numpy as np
import pytest

import cuctx
import cuctx.sim
from cuctx import Context, Device

HOST = np.arange(24, dtype=np.int32).reshape(2, 3, 4)


def view_id(value) -> str:
    """A parameter's id, the same in every process (pytest -n compares them): a view's
    lambda by name, not by its address."""
    return "view" if callable(value) else repr(value)


def check(view, expected):
    assert view.shape == expected.shape and view.dtype == expected.dtype
    np.testing.assert_array_equal(view.to_host(), expected)


@pytest.mark.parametrize(
    "make, shape, order",
    [
        (lambda a: a, (6, 4), "C"),
        (lambda a: a, (-1,), "C"),
        (lambda a: a, (4, -1, 2), "C"),
        (lambda a: a, (2, 1, 12, 1), "C"),
        (lambda a: a.T, (4, 6), "F"),
        (lambda a: a.T, (-1,), "A"),
        (lambda a: a[:, :, ::2], (6, 2), "C"),
        (lambda a: a[1], (12,), "C"),
        (lambda a: a[:, 1:2], (2, 4), "C"),
        (lambda a: a[::-1], (2, 12), "C"),
    ],
    ids=view_id,
)
def test_reshape_views_where_numpy_views(backend, make, shape, order):
    arr = make(cuctx.to_device(HOST))
    expected = make(HOST).reshape(shape, order=order)
    assert np.shares_memory(expected, HOST)  # NumPy needs no copy here either
    view = arr.reshape(shape, order=order)
    check(view, expected)
    assert view.ptr == arr.ptr and view._alloc is arr._alloc
    assert arr.reshape(*shape, order=order).shape == expected.shape


@pytest.mark.parametrize(
    "make, shape, order",
    [
        (lambda a: a.T, (24,), "C"),
        (lambda a: a, (4, 6), "F"),
        (lambda a: a[:, :, 1:3], (12,), "C"),
        (lambda a: a[:, 1:], (16,), "C"),
    ],
    ids=view_id,
)
def test_reshape_that_needs_a_copy_says_to_copy(backend, make, shape, order):
    arr = make(cuctx.to_device(HOST))
    with pytest.raises(ValueError, match="without copying; copy it first") as info:
        arr.reshape(shape, order=order)
    # The advice works as written.
    advice = str(info.value).split("copy it first: ")[1].replace(f"{shape}", "shape", 1)
    assert advice.startswith("arr.")
    got = eval(advice, {"arr": arr, "shape": shape})  # noqa: S307 - our own message
    check(got, make(HOST).reshape(shape, order=order))


def test_reshape_refuses_bad_shapes(backend):
    arr = cuctx.to_device(HOST)
    with pytest.raises(ValueError, match="size 24 into shape"):
        arr.reshape(5, -1)
    with pytest.raises(ValueError, match="one unknown dimension"):
        arr.reshape(-1, -1)
    with pytest.raises(ValueError, match="negative dimension"):
        arr.reshape(-2, -12)
    with pytest.raises(TypeError, match="tuple of ints"):
        arr.reshape(2.0, 12)
    with pytest.raises(ValueError, match="order"):
        arr.reshape(24, order="K")


@pytest.mark.parametrize(
    "dtype", [np.int32, np.uint8, np.int16, np.float64, np.complex128, np.float32]
)
def test_view_dtype_follows_numpy(backend, dtype):
    arr = cuctx.to_device(HOST)
    check(arr.view(dtype), HOST.view(dtype))
    check(arr[:, 1].view(dtype), HOST[:, 1].view(dtype))  # last axis contiguous, others not


def test_view_dtype_refusals_follow_numpy(backend):
    arr = cuctx.to_device(HOST)
    with pytest.raises(ValueError, match="last axis must be contiguous"):
        arr[:, :, ::2].view(np.int64)
    with pytest.raises(ValueError, match="0-d"):
        arr[0, 0, 0].view(np.int16)
    with pytest.raises(ValueError, match="divisor"):
        arr[:, :, :3].view(np.int64)
    with pytest.raises(TypeError, match="bool, integer, float or complex"):
        arr.view(object)
    assert arr[0, 0, 0].view(np.float32).shape == ()


def test_transpose_and_T_are_views(backend):
    arr = cuctx.to_device(HOST)
    check(arr.T, HOST.T)
    check(arr.transpose(1, 0, 2), HOST.transpose(1, 0, 2))
    check(arr.transpose((2, 0, 1)), HOST.transpose((2, 0, 1)))
    check(arr.transpose(-1, 0, 1), HOST.transpose(-1, 0, 1))
    assert arr.T.ptr == arr.ptr and arr.T.strides == HOST.T.strides and arr.T.is_contiguous
    with pytest.raises(ValueError, match="permutation"):
        arr.transpose(0, 0, 1)
    with pytest.raises(ValueError, match="permutation"):
        arr.transpose(0, 1)


def test_copy_makes_a_new_contiguous_array(backend):
    arr = cuctx.to_device(HOST)
    for view, expected in ((arr.T, HOST.T), (arr[:, ::-2, 1:], HOST[:, ::-2, 1:]), (arr, HOST)):
        out = view.copy()
        check(out, expected)
        assert out.ptr != arr.ptr and out.strides == np.ascontiguousarray(expected).strides
    out = arr.copy()
    arr.fill(0)
    np.testing.assert_array_equal(out.to_host(), HOST)  # not a view


def test_copy_is_stream_ordered(backend):
    stream = cuctx.Stream(Device(0))
    arr = cuctx.zeros((64, 64), np.float32, stream=stream)
    arr.fill(3, stream=stream)  # still queued, maybe
    out = arr.T.copy(stream=stream)  # ordered after the fill on the same stream
    assert out._alloc.stream == stream
    stream.synchronize()
    assert out.to_host().sum() == 3 * 64 * 64


def test_repr_shows_a_destroyed_context_without_the_driver(backend):
    ctx = Context.create(Device(0))
    try:
        arr = cuctx.zeros(3, np.float32)
    finally:
        Context.pop()
    assert repr(arr) == f"<DeviceArray shape=(3,) float32 device 0 ptr={arr.ptr:#x}>"
    ctx.destroy()
    assert repr(arr) == (
        f"<DeviceArray shape=(3,) float32 device 0 ptr={arr.ptr:#x} context destroyed>"
    )
    assert "context destroyed" in repr(arr[1:])


def test_repr_shows_a_poisoned_context_on_the_sim(sim):
    arr = cuctx.zeros(3, np.float32)
    cuctx.sim.inject_fault(arr.context)
    with pytest.raises(cuctx.StickyFaultError):
        arr.context.synchronize()  # the next work in the context meets the fault
    assert repr(arr).endswith(" context poisoned>")
