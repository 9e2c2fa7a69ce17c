"""What the fuzzer draws: dtypes, shapes, fill values, host data, indices (valid and not),
launch configurations and kernel arguments."""

from __future__ import annotations

import enum

import numpy as np
from hypothesis import strategies as st

DTYPES = [
    np.dtype(t)
    for t in (
        np.bool_,
        np.int8,
        np.uint8,
        np.int16,
        np.uint16,
        np.int32,
        np.uint32,
        np.int64,
        np.uint64,
        np.float16,
        np.float32,
        np.float64,
        np.complex64,
        np.complex128,
    )
]

dtypes = st.sampled_from(DTYPES)
# The kernels' element types come up more often, so launches find arrays to work on.
array_dtypes = st.one_of(
    dtypes, st.sampled_from([np.dtype(np.float32), np.dtype(np.int64), np.dtype(np.uint32)])
)

shapes = st.one_of(
    st.integers(0, 12),
    st.lists(st.integers(0, 5), min_size=0, max_size=3).map(tuple),
)

# Values exactly representable in every float type (halves, small), so kernels on a GPU
# (with fused multiply-add) and NumPy agree bit for bit.
halves = st.integers(-64, 64).map(lambda i: i / 2)

fill_values = st.one_of(
    st.integers(-3, 130),
    halves,
    st.booleans(),
    st.sampled_from([float("inf"), float("-inf"), float("nan")]),
    st.builds(complex, halves, halves),
    st.sampled_from([np.float32(1.5), np.int16(-7), np.uint8(200), np.bool_(True)]),
)


def host_data(shape, dtype: np.dtype, seed: int) -> np.ndarray:
    """A host array of small, exactly representable values."""
    rng = np.random.default_rng(seed)
    ints = np.asarray(rng.integers(-8, 9, size=shape))
    if dtype.kind == "b":
        values = ints > 0
    elif dtype.kind == "u":
        values = np.abs(ints)
    elif dtype.kind in "fc":
        values = ints / 2
    else:
        values = ints
    return np.asarray(values, dtype)  # an array even for shape (), where NumPy gives scalars


seeds = st.integers(0, 2**16)

# -- indices ------------------------------------------------------------------------------

small = st.integers(-7, 7)
slices = st.builds(slice, st.none() | small, st.none() | small, st.none() | st.integers(-3, 3))
index_items = st.one_of(small, slices, st.just(Ellipsis), st.just(None), small.map(np.int64))
basic_keys = st.one_of(index_items, st.lists(index_items, max_size=4).map(tuple))

# Keys that are not basic indices: each must raise IndexError (a 0-d integer array is an
# int, and is among the basic keys above once that holds).
bad_index_items = st.one_of(
    st.lists(st.integers(-2, 2), min_size=0, max_size=3),
    st.lists(st.integers(-2, 2), min_size=1, max_size=3).map(np.array),
    st.lists(st.booleans(), min_size=1, max_size=3).map(np.array),
    st.booleans(),
    st.sampled_from([np.bool_(True), 1.0, "0", b"0", 1j]),
)
bad_keys = st.one_of(
    bad_index_items,
    st.tuples(st.one_of(slices, small), bad_index_items),
    st.tuples(bad_index_items, st.one_of(slices, small)),
)

# -- launches -----------------------------------------------------------------------------

grids = st.one_of(
    st.integers(1, 6), st.tuples(st.integers(1, 4), st.integers(1, 3), st.integers(1, 2))
)
blocks = st.one_of(
    st.sampled_from([1, 32, 64, 128, 256, 1024]),
    st.tuples(st.integers(1, 32), st.integers(1, 8), st.integers(1, 4)),
)
bad_dims = st.sampled_from(
    [
        0,
        -1,
        (1, 0),
        (1, 2, 3, 4),
        (),
        1.0,
        True,
        "1",
        None,
        (1, 65536),
        (2**31, 1, 1),
        (1, 1, 65536),
        2048,
        (1, 1, 65),
        (32, 32, 2),
    ]
)
configs_dims = st.one_of(grids, blocks, bad_dims)
shared_mems = st.sampled_from(
    [0, 0, 16, 1024, 48 * 1024, 64 * 1024, 200 * 1024, 10**7, -1, 1.5, True]
)
clusters = st.sampled_from([None, None, None, 1, 2, (2, 1, 1), (1, 2, 1), 3, 16, 0])


class Mode(enum.IntEnum):
    """An IntEnum argument: ints' subclasses are ints to the kernel."""

    FOUR = 4


# Arguments for a scalar parameter, by kind: (value, what the kernel sees or None when the
# argument must be refused).
def scalar_args(kind: str):
    if kind == "f32":
        good = st.one_of(
            st.sampled_from([-2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0]).map(lambda v: (v, v)),
            st.sampled_from([-2, -1, 0, 1, 2]).map(lambda v: (v, float(v))),  # int -> float
            st.sampled_from(
                [np.float32(0.5), np.float32(-2.0), np.float64(1.0)]  # float kinds
            ).map(lambda v: (v, float(v))),
        )
        bad = st.sampled_from([True, "1.0", [1.0], 1 + 0j]).map(lambda v: (v, None))
        return st.one_of(good, bad)
    if kind in ("i32", "i64"):
        # PTX does not tell int from unsigned, nor an 8-byte int from a pointer: the signed
        # minimum to the unsigned maximum is accepted (the kernel sees the bits as signed),
        # and None is a null pointer for an 8-byte parameter (docs/kernels.md).
        top = 2**31 if kind == "i32" else 2**63
        good = st.one_of(
            st.integers(-3, 40).map(lambda v: (v, v)),
            st.sampled_from([Mode.FOUR]).map(lambda v: (v, int(v))),
            st.sampled_from(
                [np.int32(3)] if kind == "i32" else [np.int64(-(2**63)), np.int64(5)]
            ).map(lambda v: (v, int(v))),
            st.just((top, -top)),
            *([st.just((None, 0))] if kind == "i64" else []),
        )
        bad = st.sampled_from(
            [2.0, 1.5, 2 * top, -top - 1, "3", [3], *([None] if kind == "i32" else [])]
        ).map(lambda v: (v, None))
        return st.one_of(good, bad)
    raise ValueError(kind)
