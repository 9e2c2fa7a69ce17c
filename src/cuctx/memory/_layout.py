"""Array layouts without memory: shapes, dtypes, strides, basic indexing, reshape and dtype
views, and the plan of a copy between two layouts (rows, pitches, loops).

Nothing here touches memory or the driver: DeviceArray (memory.py) keeps a device address
and asks these functions for the arithmetic, so NumPy never sees a device address.
"""

from __future__ import annotations

import operator
import sys
from math import prod
from typing import Any, NamedTuple

import numpy as np

# CU_DEVICE_ATTRIBUTE_MAX_PITCH on every current GPU (H100 included): a larger row pitch in
# a 2D/3D copy is refused by the driver, so such axes are looped over instead.
MAX_PITCH = 2**31 - 1


def _dims(shape: Any) -> tuple[int, ...]:
    """The ints of an int or a tuple of ints; bools are refused, as NumPy refuses them."""
    try:
        items = (shape,) if hasattr(type(shape), "__index__") else tuple(shape)
        if any(isinstance(d, bool) for d in items):
            raise TypeError
        return tuple(operator.index(d) for d in items)
    except TypeError:
        raise TypeError(f"a shape is an int or a tuple of ints, not {shape!r}") from None


def shape_of(shape: Any) -> tuple[int, ...]:
    dims = _dims(shape)
    if any(d < 0 for d in dims):
        raise ValueError(f"negative dimension in shape {dims}: sizes must be >= 0")
    return dims


def nbytes_of(shape: tuple[int, ...], dtype: np.dtype, what: str) -> int:
    """The bytes of a ``what`` (e.g. "device array") of ``shape`` and ``dtype``. More than
    ``sys.maxsize`` is a ValueError (NumPy's limit too: no host array could hold it, and
    the driver's size_t would overflow); less, but more than there is, is the driver's
    OUT_OF_MEMORY."""
    nbytes = prod(shape) * dtype.itemsize
    if nbytes > sys.maxsize:
        raise ValueError(
            f"a {what} of shape {shape} and dtype {dtype} would take {nbytes} "
            f"bytes, more than any array can address (at most sys.maxsize = "
            f"{sys.maxsize}); check the shape"
        )
    return nbytes


# The dtype arguments accepted so far (np.float32, "f4", a dtype...) and their (dtype,
# itemsize): the compiled `empty` reads them (cuctx/csrc/arrays.c). Bounded, since any
# hashable argument NumPy takes is a key.
KNOWN_DTYPES: dict[Any, tuple[np.dtype, int]] = {}
_KNOWN_MOST = 256


def dtype_of(dtype: Any) -> np.dtype:
    dt = np.dtype(dtype)
    if dt.kind not in "biufc" or not dt.isnative:
        raise TypeError(
            f"device arrays hold bool, integer, float or complex values in native "
            f"byte order, not {dt}"
        )
    if len(KNOWN_DTYPES) < _KNOWN_MOST:
        try:
            KNOWN_DTYPES[dtype] = (dt, dt.itemsize)
        except TypeError:  # an unhashable argument: not remembered
            pass
    return dt


def c_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    strides, step = [], itemsize
    for d in reversed(shape):
        strides.append(step)
        step *= max(d, 1)
    return tuple(reversed(strides))


def contiguity(shape, strides, itemsize) -> tuple[bool, bool]:
    """(C-contiguous, Fortran-contiguous), as NumPy decides them (size-1 axes don't count)."""

    def dense(axes):
        step = itemsize
        for d, s in axes:
            if d != 1 and s != step:
                return False
            step *= d
        return True

    if prod(shape) == 0:
        return True, True
    pairs = list(zip(shape, strides))
    return dense(reversed(pairs)), dense(pairs)


def span(shape, strides, itemsize) -> tuple[int, int]:
    """The byte range [lo, hi) the elements cover, relative to the first element."""
    if prod(shape) == 0:
        return 0, 0
    lo = sum((n - 1) * s for n, s in zip(shape, strides) if s < 0)
    hi = sum((n - 1) * s for n, s in zip(shape, strides) if s > 0) + itemsize
    return lo, hi


def self_overlapping(shape, strides, itemsize) -> bool:
    """True when two elements may share bytes (a zero stride, say): such an array cannot be
    the destination of a copy. Conservative: False means certainly disjoint."""
    if prod(shape) == 0:
        return False
    extent = itemsize
    for n, s in sorted(((n, abs(s)) for n, s in zip(shape, strides) if n > 1), key=lambda a: a[1]):
        if s < extent:
            return True
        extent = s * (n - 1) + extent
    return False


# -- basic indexing ---------------------------------------------------------------------

SUPPORTED = "ints, slices, ..., None and 0-d integer arrays"


def _entry(k: Any) -> Any:
    """One index entry, checked: an int, a slice, None or Ellipsis, else IndexError."""
    if k is None or k is Ellipsis or isinstance(k, slice):
        return k
    if isinstance(k, np.ndarray):  # a 0-d integer array acts as an int, as in NumPy
        if k.ndim == 0 and k.dtype.kind in "iu":
            return int(k)
    elif not isinstance(k, (bool, np.bool_)) and hasattr(type(k), "__index__"):
        try:
            return operator.index(k)
        except TypeError:
            pass
    raise IndexError(
        f"device arrays take basic indices ({SUPPORTED}), not "
        f"{type(k).__name__}; copy to the host (arr.to_host()) for fancy or "
        "boolean indexing"
    )


def index(shape, strides, key: Any) -> tuple[int, tuple[int, ...], tuple[int, ...]]:
    """Basic indexing: (byte offset, shape, strides) of ``view[key]``."""
    entries = [_entry(k) for k in (key if isinstance(key, tuple) else (key,))]
    ellipses = sum(k is Ellipsis for k in entries)
    if ellipses > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    used = sum(k is not None and k is not Ellipsis for k in entries)
    if used > len(shape):
        raise IndexError(
            f"too many indices: the array is {len(shape)}-dimensional, but {used} were indexed"
        )
    if not ellipses:
        entries.append(Ellipsis)
    offset, out_shape, out_strides, axis = 0, [], [], 0
    for k in entries:
        if k is Ellipsis:
            for _ in range(len(shape) - used):
                out_shape.append(shape[axis])
                out_strides.append(strides[axis])
                axis += 1
        elif k is None:
            out_shape.append(1)
            out_strides.append(0)
        elif isinstance(k, slice):
            try:
                start, stop, step = k.indices(shape[axis])
            except (TypeError, ValueError) as exc:
                raise IndexError(f"bad slice {k!r}: {exc}") from None
            n = len(range(start, stop, step))
            offset += start * strides[axis] if n else 0
            out_shape.append(n)
            out_strides.append(strides[axis] * step)
            axis += 1
        else:
            n = shape[axis]
            if not -n <= k < n:
                raise IndexError(f"index {k} is out of bounds for axis {axis} with size {n}")
            offset += (k % n) * strides[axis]
            axis += 1
    return offset, tuple(out_shape), tuple(out_strides)


# -- reshape, dtype views, transpose -------------------------------------------------------


def reshape(shape, strides, itemsize, new: tuple[int, ...], order: str) -> tuple[int, ...] | None:
    """The strides of the view with shape ``new`` (no -1 left) in ``order`` ("C" or "F"),
    or None when the layout needs a copy (NumPy's no-copy reshape rule)."""
    if prod(new) == 0 or prod(shape) == 0:
        return (
            c_strides(new, itemsize)
            if order == "C"
            else tuple(reversed(c_strides(tuple(reversed(new)), itemsize)))
        )
    old = [(n, s) for n, s in zip(shape, strides) if n != 1]
    if order == "F":  # F order is C order of the reversed axes
        result = reshape(
            tuple(n for n, _ in reversed(old)),
            tuple(s for _, s in reversed(old)),
            itemsize,
            tuple(reversed(new)),
            "C",
        )
        return None if result is None else tuple(reversed(result))
    out: list[int] = []
    i = j = 0
    old_shape, old_strides = [n for n, _ in old], [s for _, s in old]
    while i < len(old_shape) and j < len(new):
        if new[j] == 1:
            out.append(0)
            j += 1
            continue
        # Group axes of both shapes until their products match.
        oi, oj = i + 1, j + 1
        po, pn = old_shape[i], new[j]
        while po != pn:
            if po < pn:
                po *= old_shape[oi]
                oi += 1
            else:
                pn *= new[oj]
                oj += 1
        for k in range(i, oi - 1):  # the old group must be one dense block
            if old_strides[k] != old_shape[k + 1] * old_strides[k + 1]:
                return None
        step = old_strides[oi - 1]
        group = []
        for k in range(oj - 1, j - 1, -1):
            group.append(step)
            step *= new[k]
        out.extend(reversed(group))
        i, j = oi, oj
    out.extend(itemsize for _ in range(j, len(new)))  # trailing 1s
    return tuple(s if n != 1 else itemsize for n, s in zip(new, out))


def resolve_shape(size: int, new: Any) -> tuple[int, ...]:
    """``new`` (an int or a tuple of ints) with one -1 replaced so that it holds ``size``
    elements."""
    new = _dims(new)
    if sum(d == -1 for d in new) > 1:
        raise ValueError("can only specify one unknown dimension (-1)")
    known = prod(d for d in new if d != -1)
    if -1 in new:
        if known <= 0 or size % known:
            raise ValueError(f"cannot reshape an array of size {size} into shape {new}")
        new = tuple(size // known if d == -1 else d for d in new)
    shape_of(new)
    if prod(new) != size:
        raise ValueError(f"cannot reshape an array of size {size} into shape {new}")
    return new


def view_dtype(shape, strides, old: np.dtype, new: np.dtype):
    """(shape, strides) of a view with another dtype, by NumPy's rules: an itemsize change
    rescales the last axis, which must be contiguous."""
    if new.itemsize == old.itemsize:
        return shape, strides
    if not shape:
        raise ValueError(
            "changing the dtype of a 0-d array is only supported if the itemsize is unchanged"
        )
    if shape[-1] != 1 and prod(shape) and strides[-1] != old.itemsize:
        raise ValueError(
            "to change to a dtype of a different size, the last axis must be "
            "contiguous; copy the array first (arr.copy())"
        )
    last = shape[-1] * old.itemsize
    if new.itemsize < old.itemsize and old.itemsize % new.itemsize:
        raise ValueError(
            "when changing to a smaller dtype, its size must be a divisor of "
            "the size of the original dtype"
        )
    if last % new.itemsize:
        raise ValueError(
            "when changing to a larger dtype, its size must be a divisor of the "
            "total size in bytes of the last axis of the array"
        )
    return shape[:-1] + (last // new.itemsize,), strides[:-1] + (new.itemsize,)


def axes_order(ndim: int, axes: tuple) -> tuple[int, ...]:
    if not axes:
        return tuple(range(ndim - 1, -1, -1))
    if len(axes) == 1 and not isinstance(axes[0], int):
        axes = tuple(axes[0])
    try:
        order = tuple(operator.index(a) for a in axes)
    except TypeError:
        raise TypeError(f"transpose takes axis numbers, not {axes!r}") from None
    norm = tuple(a % ndim if -ndim <= a < ndim else ndim for a in order)
    if sorted(norm) != list(range(ndim)):
        raise ValueError(f"axes {order} are not a permutation of the {ndim} axes")
    return norm


# -- copy plans -----------------------------------------------------------------------------


class Plan(NamedTuple):
    """A copy of equal-shaped layouts as driver calls. Each call copies ``rows`` x ``slices``
    rows of ``width`` contiguous bytes (``rows``/``slices`` (count, dst pitch, src pitch), or
    None for a plain 1D copy, or a 2D copy without ``slices``); ``loops`` are the outer axes
    (count, dst stride, src stride) that Python iterates, one call each."""

    dst_offset: int
    src_offset: int
    width: int
    rows: tuple[int, int, int] | None
    slices: tuple[int, int, int] | None
    loops: tuple[tuple[int, int, int], ...]

    @property
    def calls(self) -> int:
        return prod(n for n, _, _ in self.loops)


def plan(shape, dst_strides, src_strides, itemsize: int) -> Plan:
    """The plan with the fewest calls, trying the axis orders of both sides."""
    axes, dst_offset, src_offset = [], 0, 0
    for n, d, s in zip(shape, dst_strides, src_strides):
        if n == 1:
            continue
        if d < 0:  # walk the destination forwards: flip the axis on both sides
            dst_offset += (n - 1) * d
            src_offset += (n - 1) * s
            d, s = -d, -s
        axes.append((n, d, s))
    plans = [
        _build(sorted(axes, key=key, reverse=True), itemsize, dst_offset, src_offset)
        for key in (lambda a: a[1], lambda a: abs(a[2]))
    ]
    return min(plans, key=lambda p: p.calls)


def _build(axes, itemsize: int, dst_offset: int, src_offset: int) -> Plan:
    merged: list[tuple[int, int, int]] = []
    for n, d, s in axes:  # outer to inner: merge an axis into the previous when dense in both
        if merged and merged[-1][1] == n * d and merged[-1][2] == n * s:
            merged[-1] = (merged[-1][0] * n, d, s)
        else:
            merged.append((n, d, s))
    width = itemsize
    if merged and merged[-1][1] == itemsize and merged[-1][2] == itemsize:
        width = merged.pop()[0] * itemsize
    rows = slices = None
    if merged and all(width <= p <= MAX_PITCH for p in merged[-1][1:]):
        rows = merged.pop()
        if merged:
            n, d, s = merged[-1]
            if all(
                p > 0 and p % pitch == 0 and p // pitch >= rows[0]
                for p, pitch in ((d, rows[1]), (s, rows[2]))
            ):
                slices = merged.pop()
    return Plan(dst_offset, src_offset, width, rows, slices, tuple(merged))


def dense_strides(shape, strides, itemsize: int) -> tuple[tuple[int, ...], int]:
    """(strides, offset of the first element) of a dense buffer with the axis order and
    directions of ``strides``: a copy between the two is as few calls as that layout allows."""
    order = sorted(range(len(shape)), key=lambda i: abs(strides[i]))
    out, step = [0] * len(shape), itemsize
    for i in order:
        out[i] = step
        step *= max(shape[i], 1)
    offset = 0
    for i, s in enumerate(strides):
        if s < 0:
            offset += (shape[i] - 1) * out[i]
            out[i] = -out[i]
    return tuple(out), offset
