"""Indexing a DeviceArray: basic indices give views computed without touching memory (NumPy
never sees the device address); everything else is an IndexError that says what is
supported, never a crash. Views are checked against NumPy on the same data."""

import enum

import numpy as np
import pytest

import cuctx

HOST = np.arange(2 * 3 * 4, dtype=np.int32).reshape(2, 3, 4)


class Axis(enum.IntEnum):
    SECOND = 1


@pytest.mark.parametrize(
    "key",
    [
        0,
        -1,
        (1, 2),
        (1, 2, 3),
        slice(None),
        slice(1, None),
        slice(None, None, -1),
        (slice(None), slice(0, 3, 2)),
        (Ellipsis, 1),
        (None, 0),
        (0, None, slice(1, 3)),
        (slice(None), None, -1, slice(None, None, -2)),
        Ellipsis,
        (),
        np.int64(1),
        (np.array(1), slice(None), np.array(-1)),
        Axis.SECOND,
        (slice(5, 9),),
        (slice(2, 1),),
        (slice(np.array(1), None),),
    ],
    ids=repr,
)
def test_basic_indices_give_the_view_numpy_gives(backend, key):
    arr = cuctx.to_device(HOST)
    full = tuple(
        int(k) if isinstance(k, np.ndarray) else k  # NumPy would copy for these
        for k in (key if isinstance(key, tuple) else (key,))
    )
    if not any(k is Ellipsis for k in full):
        full += (Ellipsis,)  # so that NumPy gives a 0-d view, not a scalar
    view, expected = arr[key], HOST[full]
    assert view.shape == expected.shape
    np.testing.assert_array_equal(view.to_host(), expected)
    if expected.size:
        offset = expected.__array_interface__["data"][0] - HOST.__array_interface__["data"][0]
        assert view.ptr == arr.ptr + offset and view.strides == expected.strides


@pytest.mark.parametrize("shape", [(24,), (4, 6), (4, 0, 3), (1,), (0,), (1, 5)], ids=repr)
@pytest.mark.parametrize(
    "key",
    [
        slice(None),
        slice(1, 3),
        slice(-3, None),
        slice(5, 2),
        slice(None, 100),
        slice(-100, 2),
        slice(3, 3),
        slice(np.int64(1), np.uint8(3)),
        slice(Axis.SECOND, None),
    ],
    ids=repr,
)
def test_a_leading_slice_is_the_view_the_general_indexing_gives(backend, shape, key):
    """arr[a:b] of a C-contiguous array (every pipeline's chunk) takes a shorter path: the
    same view as NumPy's and as the general indexing's (arr[a:b, ...]), contiguity included."""
    host = np.arange(int(np.prod(shape)), dtype=np.int32).reshape(shape)
    arr = cuctx.to_device(host)
    view, general, expected = arr[key], arr[key, ...], host[key]
    for got in (view, general):
        assert got.shape == expected.shape
        assert (got._c, got._f) == (expected.flags.c_contiguous, expected.flags.f_contiguous)
    assert (view.ptr, view.strides) == (general.ptr, general.strides)
    if expected.size:  # (NumPy's strides of empty arrays vary with how they were made)
        assert view.strides == expected.strides
    np.testing.assert_array_equal(view.to_host(), expected)
    if not expected.size:
        assert view.ptr == arr.ptr  # an empty view points nowhere new


def test_slices_of_views_that_are_not_c_contiguous(backend):
    host = np.arange(24, dtype=np.int32).reshape(4, 6)
    arr = cuctx.to_device(host)
    for view, expected in ((arr.T, host.T), (arr[:, ::2], host[:, ::2]), (arr[::-1], host[::-1])):
        part, numpy_part = view[1:3], expected[1:3]
        assert part.shape == numpy_part.shape and part.strides == numpy_part.strides
        np.testing.assert_array_equal(part.to_host(), numpy_part)


@pytest.mark.parametrize(
    "key",
    [
        np.array([0, 1]),
        np.array([True, False]),
        (slice(None), np.array([0, 2])),
        [0, 1],
        [True, False],
        (0, [1, 2]),
        1.0,
        np.float32(0),
        True,
        np.bool_(False),
        np.array(True),
        np.array(1.0),
        "0",
        (0, 0.5),
        slice(0.5, 2),
        object(),
    ],
    ids=lambda key: "object()" if type(key) is object else repr(key),
)  # the same in every process
def test_other_indices_are_an_index_error_naming_the_supported_ones(backend, key):
    arr = cuctx.full((2, 3), 7, np.int32)
    with pytest.raises(
        IndexError,
        match=r"basic indices \(ints, slices, \.\.\., None and 0-d "
        r"integer arrays\)|bad slice",
    ):
        arr[key]
    assert arr.to_host().tolist() == [[7] * 3] * 2  # and the array is untouched


def test_a_zero_d_integer_array_acts_as_an_int(backend):
    arr = cuctx.full((2, 3), 7, np.int32)
    row = arr[np.array(1)]
    assert row.shape == (3,) and row.ptr == arr.ptr + 12
    assert arr[np.array(1), np.uint8(2)].shape == ()


def test_objects_numpy_would_treat_as_arrays_are_refused(backend):
    arr = cuctx.zeros((2, 3))

    class ArrayLike:  # an __array__ without __index__: NumPy would index with it
        def __array__(self, dtype=None, copy=None):
            return np.array([0, 1])

    for key in (ArrayLike(), (ArrayLike(), 0), cuctx.zeros(2, np.int64), (0, (1,))):
        with pytest.raises(IndexError, match="basic indices"):
            arr[key]


def test_out_of_range_and_malformed_keys(backend):
    arr = cuctx.zeros((2, 3))
    with pytest.raises(IndexError, match="out of bounds for axis 0 with size 2"):
        arr[2]
    with pytest.raises(IndexError, match="out of bounds for axis 1 with size 3"):
        arr[0, -4]
    with pytest.raises(IndexError, match="too many indices"):
        arr[0, 0, 0]
    with pytest.raises(IndexError, match="single ellipsis"):
        arr[..., 0, ...]
    with pytest.raises(IndexError, match="bad slice"):
        arr[::0]


def test_iteration_and_truth(backend):
    arr = cuctx.to_device(np.arange(6).reshape(3, 2))
    assert [row.to_host().tolist() for row in arr] == [[0, 1], [2, 3], [4, 5]]
    with pytest.raises(TypeError, match="0-d"):
        iter(arr[0, 0])
    with pytest.raises(TypeError, match="truth value"):
        bool(arr)
