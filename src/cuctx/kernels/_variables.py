"""The views of device code's variables: a `DeviceArray` of a ``__device__`` (or
``__constant__``) variable in one context (`Library.get_global`, `Module.get_global`) and a
NumPy view of a ``__managed__`` one (`Library.get_managed`), which keeps its library loaded.
Apart from `_library` (loading code, finding kernels and variables): how a variable's bytes
are seen as an array, with the dtype and shape checked against its size.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ..memory._array import DeviceArray
from ..memory._layout import dtype_of, shape_of

if TYPE_CHECKING:
    from ..context import Context
    from ._library import Library


def _view_shape(nbytes: int, dtype: Any, shape, name: str):
    dtype = dtype_of(dtype)  # plain numbers only: a view of raw memory never holds objects
    if shape is None:
        if nbytes % dtype.itemsize:
            raise ValueError(
                f"variable {name!r} is {nbytes} bytes, not a whole number of "
                f"{dtype} ({dtype.itemsize} bytes); pass shape="
            )
        shape = (nbytes // dtype.itemsize,)
    shape = shape_of(shape)
    need = int(np.prod(shape)) * dtype.itemsize
    if need > nbytes:
        raise ValueError(
            f"variable {name!r} is {nbytes} bytes; a {shape} view of {dtype} needs {need}"
        )
    return dtype, shape


def _variable_view(
    ctx: Context, ptr: int, nbytes: int, dtype, shape, owner, name: str
) -> DeviceArray:
    dtype, shape = _view_shape(nbytes, dtype, shape, name)
    return DeviceArray._make(ctx, ptr, shape, dtype, None, None, owner)


class _HostView:
    """The base of a NumPy view of managed memory: keeps the library loaded while it lives."""

    __slots__ = ("__array_interface__", "library")

    def __init__(self, ptr: int, shape, dtype: np.dtype, library: Library):
        self.__array_interface__ = {
            "data": (ptr, False),
            "shape": shape,
            "typestr": dtype.str,
            "version": 3,
        }
        self.library = library
