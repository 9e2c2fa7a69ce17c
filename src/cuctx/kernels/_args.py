"""Kernel arguments: how one Python value becomes the bytes of one kernel parameter.

The layout (offset and size of each parameter) comes from the driver. The types come from
the PTX of the same program where there is one (`cuctx.devcode._ptx`: code compiled from source, or
loaded as PTX), and numbers are converted to them: an int to a ``float`` parameter becomes
a float, a float to an ``int`` parameter is an error. A foreign cubin has no PTX: there,
a Python number packs by its own type and the size is all that is checked. docs/kernels.md
has the table.

`slot` answers, for one argument type in one parameter, how it is packed: a struct code, a
kind (`VALUE`, `ARRAY`, `POINTER`, `CONVERT`) and the conversion that gives the value to
pack; an array's conversion checks its dtype against what the parameter points at
(`cuctx.kernels._dtypes`) first. `cuctx.kernels._plan` puts the slots of a whole signature
together into a plan.
"""

from __future__ import annotations

import ctypes
import struct
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from . import _dtypes
from ..devcode._ptx import ParamType
from ..context import ACTIVE
from ..device import Device
from ..memory._array import DeviceArray
from ..memory._construct import asarray

if TYPE_CHECKING:
    from ._plan import Packer
    from ..stream import Stream

INT_CODES = {1: "b", 2: "h", 4: "i", 8: "q"}
_FLOAT_CODES = {2: "e", 4: "f", 8: "d"}
# ctypes' simple number types by their format code: converted by value like Python numbers.
_CTYPES_NUMBERS = {
    **dict.fromkeys("bBhHiIlLqQ", "int"),
    **dict.fromkeys("fdg", "float"),
    "?": "bool",
}
# What packing raises for a value its code cannot hold (an int beyond the signed range,
# a float beyond a float32's): the slow packer then says which parameter, or packs unsigned.
PACK_ERRORS = (struct.error, OverflowError)

# How an argument becomes its parameter's value (the kinds a plan records per parameter):
VALUE = "value"  # the argument itself, as its struct code packs it
ARRAY = "array"  # a DeviceArray: its address, after the context/device/contiguity checks
POINTER = "pointer"  # another library's device array: its address, by its conversion
CONVERT = "convert"  # anything else with a conversion (NULL, ctypes, bytes, complex, ...)

Convert = Callable[[Any, "Stream"], Any]


class KernelArgumentError(TypeError):
    """Arguments that do not fit the kernel's parameters: names the parameter."""


# -- one argument in one parameter --------------------------------------------------------


def _number(arg: Any) -> str | None:
    """ "bool", "int", "float" or "complex" for Python numbers (subclasses such as IntEnum
    included) and NumPy scalars; None for anything else."""
    if isinstance(arg, (bool, np.bool_)):
        return "bool"
    if isinstance(arg, (int, np.integer)):
        return "int"
    if isinstance(arg, (float, np.floating)):
        return "float"
    if isinstance(arg, (complex, np.complexfloating)):
        return "complex"
    return None


def slot(
    packer: Packer, index: int, arg: Any
) -> tuple[str, str, Convert | None, tuple[np.dtype, ...] | None]:
    """(struct code, kind, conversion or None, dtypes) for an argument of this type in
    parameter ``index``; raises `KernelArgumentError` for one the parameter cannot take.
    For an array whose parameter says its element type, the conversion checks the array's
    dtype first, and ``dtypes`` (a DeviceArray's) are those the fast paths let through."""
    code, convert = _slot(packer, index, arg)
    kind = (
        VALUE
        if convert is None
        else ARRAY
        if convert is _device_array_pointer
        else POINTER
        if convert in _POINTERS
        else CONVERT
    )
    expect = packer.expects[index]
    if expect is None or kind not in (ARRAY, POINTER):
        return code, kind, convert, None
    return code, kind, _typed(packer, expect, convert), expect.dtypes if kind == ARRAY else None


def _slot(packer: Packer, index: int, arg: Any) -> tuple[str, Convert | None]:
    size = packer.params[index][1]
    ptype = packer.type_of(index)
    if isinstance(arg, np.ndarray):
        raise KernelArgumentError(
            f"{packer.describe(index)} got a NumPy array, which is host memory; copy it to the "
            "device with cuctx.to_device(ary) and pass that"
        )
    number = _number(arg)
    if ptype is not None and number is None and isinstance(arg, ctypes._SimpleCData):
        number = _CTYPES_NUMBERS.get(arg._type_)
    if number is not None:
        if ptype is None:
            return _untyped_number(packer, index, size, arg, number)
        return _typed_number(packer, index, ptype, arg, number)
    if isinstance(arg, np.generic):  # structured (np.void) and byte-string scalars
        _same_size(packer, index, size, arg.dtype.itemsize, f"a NumPy {arg.dtype} scalar")
        return f"{size}s", _sized_bytes(packer, index, size)
    if isinstance(arg, (ctypes._SimpleCData, ctypes.Structure, ctypes.Union, ctypes.Array)):
        _same_size(packer, index, size, ctypes.sizeof(arg), f"a ctypes {type(arg).__name__}")
        return f"{size}s", _ctypes_bytes
    if arg is None:
        _need_pointer(packer, index, ptype, "None (a null pointer)")
        return "Q", _null
    getter = _pointer_getter(arg)
    if getter is None:
        raise KernelArgumentError(
            f"{packer.describe(index)} cannot take {type(arg).__name__}: pass an int or float, "
            "a NumPy scalar, a ctypes structure, or device memory (DeviceArray, torch/CuPy "
            "arrays, anything with __cuda_array_interface__ or DLPack)"
        )
    _need_pointer(packer, index, ptype, f"a {type(arg).__name__} (a device pointer)")
    return "Q", getter


def _untyped_number(packer: Packer, index: int, size: int, arg: Any, number: str):
    """No PTX: a NumPy scalar gives its bytes (of the parameter's size); a Python number
    packs by its own type."""
    if isinstance(arg, np.generic):
        _same_size(packer, index, size, arg.dtype.itemsize, f"a NumPy {arg.dtype} scalar")
        return f"{size}s", _sized_bytes(packer, index, size)
    if number in ("bool", "int") and size in INT_CODES:
        return INT_CODES[size], None  # out of the signed range: the slow packer takes over
    if number == "float" and size in _FLOAT_CODES:
        return _FLOAT_CODES[size], None
    if number == "complex" and size in (8, 16):
        return f"{size}s", _complex_bytes(packer, index, size)
    raise KernelArgumentError(
        f"{packer.describe(index)} cannot take a Python {number}; pass "
        "a ctypes structure or NumPy scalar of that size"
    )


def _typed_number(packer: Packer, index: int, ptype: ParamType, arg: Any, number: str):
    """A number converted to the parameter's type (its PTX declaration)."""
    what = f"{packer.describe(index)} cannot take {type(arg).__name__} {arg!r}"
    from_ctypes = isinstance(arg, ctypes._SimpleCData)
    if ptype.kind == "int":
        if number in ("bool", "int"):
            getter = (
                _ctypes_value if from_ctypes else _as_int if isinstance(arg, np.bool_) else None
            )
            return INT_CODES[ptype.size], getter
        raise KernelArgumentError(
            f"{what}: the parameter is an integer; pass an int "
            "(convert it yourself, e.g. round(x) or int(x))"
        )
    if ptype.kind == "float":
        if number in ("int", "float"):
            return _FLOAT_CODES[ptype.size], _ctypes_value if from_ctypes else None
        reason = (
            "a bool is not converted to a floating-point parameter; pass 0.0 or 1.0"
            if number == "bool"
            else "pass a float (use a struct parameter for complex)"
        )
        raise KernelArgumentError(f"{what}: {reason}")
    # A struct by value: complex numbers fill one of two floats or two doubles; other
    # values only as bytes of exactly its size.
    if number == "complex" and (
        (ptype.size == 8 and ptype.align >= 4) or (ptype.size == 16 and ptype.align >= 8)
    ):
        return f"{ptype.size}s", _complex_bytes(packer, index, ptype.size)
    if from_ctypes:
        _same_size(packer, index, ptype.size, ctypes.sizeof(arg), f"a ctypes {type(arg).__name__}")
        return f"{ptype.size}s", _ctypes_bytes
    if isinstance(arg, np.generic):
        _same_size(packer, index, ptype.size, arg.dtype.itemsize, f"a NumPy {arg.dtype} scalar")
        return f"{ptype.size}s", _sized_bytes(packer, index, ptype.size)
    half = " (np.float16(x) for a __half)" if ptype.size == 2 else ""
    raise KernelArgumentError(
        f"{what}: the parameter is a struct of {ptype.size} bytes; pass a ctypes structure or "
        f"a NumPy scalar of that size{half}"
    )


def _need_pointer(packer: Packer, index: int, ptype: ParamType | None, what: str) -> None:
    if packer.params[index][1] != 8:
        raise KernelArgumentError(
            f"{packer.describe(index)} is not pointer-sized; it cannot take {what}"
        )
    if ptype is not None and ptype.kind != "int":
        raise KernelArgumentError(
            f"{packer.describe(index)} is not a pointer; it cannot take {what}"
        )


def _same_size(packer: Packer, index: int, size: int, got: int, what: str) -> None:
    if got != size:
        raise KernelArgumentError(
            f"{packer.describe(index)} got {what} of {got} bytes; the parameter is {size} bytes"
        )


def _null(arg, stream) -> int:
    return 0


def _as_int(arg, stream) -> int:
    return int(arg)  # np.bool_ has no __index__, which struct's integer codes need


def _ctypes_value(arg, stream):
    return arg.value


def _sized_bytes(packer: Packer, index: int, size: int) -> Callable:
    """The bytes of a NumPy scalar, checked at every call: one type (np.void, np.bytes_)
    covers every size, so a plan made for one size must not take another."""

    def as_bytes(arg, stream) -> bytes:
        if arg.dtype.itemsize != size:
            _same_size(packer, index, size, arg.dtype.itemsize, f"a NumPy {arg.dtype} scalar")
        return arg.tobytes()

    return as_bytes


def _complex_bytes(packer: Packer, index: int, size: int) -> Callable:
    """A complex number as two floats (8 bytes) or two doubles (16 bytes): real, imaginary."""
    pack = struct.Struct("<2f" if size == 8 else "<2d").pack

    def as_bytes(arg, stream) -> bytes:
        try:
            return pack(arg.real, arg.imag)
        except PACK_ERRORS as exc:
            raise KernelArgumentError(
                f"{packer.describe(index)} cannot hold {arg!r}: {exc}"
            ) from None

    return as_bytes


def _ctypes_bytes(arg, stream) -> bytes:
    return bytes(arg)


# -- device memory ------------------------------------------------------------------------


def _pointer_getter(arg: Any):
    """A converter from this kind of device array to its address, checking its device, or
    None when ``arg`` is no device array."""
    if isinstance(arg, DeviceArray):
        return _device_array_pointer
    module = type(arg).__module__.split(".", 1)[0]
    if module == "torch" and hasattr(arg, "data_ptr"):
        return _torch_pointer
    if module == "cupy" and hasattr(arg, "data"):
        return _cupy_pointer
    if hasattr(arg, "__cuda_array_interface__") or hasattr(arg, "__dlpack_device__"):
        return _foreign_pointer
    return None


def _device_array_pointer(arr, stream: Stream) -> int:
    device = stream._ctx._device
    ctx = arr._ctx
    if ctx._state is not ACTIVE:
        raise ctx._unusable("launch (a DeviceArray argument)")
    # Memory of another context on the same device is fine: the driver maps every
    # context's allocations into the device's one address space (docs/kernels.md).
    pool = arr._alloc.pool if arr._alloc is not None else None
    if pool is not None and (pool._location == "host" or pool._device is not device):
        _pool_reachable(pool, device, arr)  # an explicit pool's own access list
    elif ctx._device is not device:
        _reachable(ctx.device, device, arr)
    if not arr._c:
        _not_contiguous(arr)
    return arr.ptr


def _torch_pointer(tensor, stream: Stream) -> int:
    device = stream._ctx._device
    where = tensor.device
    if where.type != "cuda":
        raise KernelArgumentError(
            f"a torch tensor on {where} is host memory; move it to the GPU (tensor.cuda()) first"
        )
    if where.index != device.ordinal:
        _reachable(Device._for_backend(device._backend, where.index), device, tensor)
    if not tensor.is_contiguous():
        _not_contiguous(tensor)
    return tensor.data_ptr()


def _cupy_pointer(array, stream: Stream) -> int:
    device = stream._ctx._device
    if array.device.id != device.ordinal:
        _reachable(Device._for_backend(device._backend, array.device.id), device, array)
    if not array.flags.c_contiguous:
        _not_contiguous(array)
    return array.data.ptr


def _foreign_pointer(obj, stream: Stream) -> int:
    # The launch's own stream, not the current one, must wait for the producer's work.
    return _device_array_pointer(asarray(obj, stream=stream), stream)


_POINTERS = (_torch_pointer, _cupy_pointer, _foreign_pointer)


def _typed(packer: Packer, expect: _dtypes.Expect, getter: Convert) -> Convert:
    """``getter`` after the check that the array's dtype is one the parameter takes."""
    kernel = packer.kernel.name

    def check(arr, got: str) -> None:
        if got not in expect.accepts:
            raise KernelArgumentError(_dtypes.mismatch(kernel, expect, arr, got))

    if getter is _foreign_pointer:  # its dtype is known once it is viewed as a DeviceArray

        def checked_foreign(obj, stream: Stream) -> int:
            arr = asarray(obj, stream=stream)
            check(obj, arr.dtype.name)
            return _device_array_pointer(arr, stream)

        return checked_foreign

    def checked(arr, stream: Stream) -> int:
        check(arr, _dtypes.name_of(arr))
        return getter(arr, stream)

    return checked


def _reachable(owner: Device, device: Device, arr) -> None:
    """Kernels on ``device`` may use ``owner``'s memory once peer access is enabled."""
    if owner in getattr(device, "_peers", ()):
        return
    what = (
        f"{type(arr).__name__} on device {owner.ordinal} passed to a launch on device "
        f"{device.ordinal}"
    )
    if not device.can_access_peer(owner):
        raise KernelArgumentError(
            f"{what}, which cannot access it (no peer access between "
            "them); copy it to the launch device first"
        )
    raise KernelArgumentError(
        f"{what} needs peer access: call cuctx.Device({device.ordinal}).enable_peer_access("
        f"cuctx.Device({owner.ordinal})) first, or copy it to device {device.ordinal}"
    )


def _pool_reachable(pool, device: Device, arr) -> None:
    """Kernels on ``device`` may use memory of an explicit pool (of another device, or host
    memory) once the pool grants it (`MemoryPool.set_access`): `Device.enable_peer_access`
    covers the default pools only."""
    if pool.access(device) is None:
        raise KernelArgumentError(
            f"{type(arr).__name__} of {pool!r} passed to a launch on device {device.ordinal}, "
            f"which has no access to that pool's memory: call pool.set_access("
            f"cuctx.Device({device.ordinal}), 'rw') first ('r' to read only), or copy it to "
            f"device {device.ordinal}"
        )


def _not_contiguous(arr) -> None:
    """A kernel receives a bare pointer: strides do not reach it, so it would read a strided
    or transposed view as if it were dense and C-ordered."""
    raise KernelArgumentError(
        f"a {type(arr).__name__} that is not C-contiguous (shape {tuple(arr.shape)}) passed "
        "to a kernel, which receives only its address and would read it as dense C-ordered "
        "data; pass a C-contiguous copy, or its address (an int) if the kernel takes the "
        "strides itself"
    )


def traced_array(arg: Any, stream: Stream) -> DeviceArray:
    """The `DeviceArray` a pointer argument (kind ARRAY or POINTER) is, for the trace's byte
    extents: another library's array is viewed as the launch's packing viewed it."""
    return arg if isinstance(arg, DeviceArray) else asarray(arg, stream=stream)
