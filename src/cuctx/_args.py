"""Kernel arguments: how each Python value becomes the bytes of one kernel parameter.

The layout (offset and size of each parameter) comes from the driver. The types come from
the PTX of the same program where there is one (`cuctx._ptx`: code compiled from source, or
loaded as PTX), and numbers are converted to them: an int to a ``float`` parameter becomes
a float, a float to an ``int`` parameter is an error. A foreign cubin has no PTX: there,
a Python number packs by its own type and the size is all that is checked. docs/kernels.md
has the table.

A `Packer` (one per kernel) makes a `_Plan` per signature of argument types: a generated
``pack(buffer, stream, args)`` doing a type guard, the conversions and one
``struct.pack_into``. `cuctx.launch` builds its fast path from the same plan.
"""

from __future__ import annotations

import ctypes
import struct
import threading
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from ._ptx import ParamType
from .context import ACTIVE
from .device import Device

if TYPE_CHECKING:
    from ._kernel import Kernel
    from .stream import Stream

_INT_CODES = {1: "b", 2: "h", 4: "i", 8: "q"}
_FLOAT_CODES = {2: "e", 4: "f", 8: "d"}
# ctypes' simple number types by their format code: converted by value like Python numbers.
_CTYPES_NUMBERS = {**dict.fromkeys("bBhHiIlLqQ", "int"), **dict.fromkeys("fdg", "float"),
                   "?": "bool"}


class KernelArgumentError(TypeError):
    """Arguments that do not fit the kernel's parameters: names the parameter."""


class Packer:
    """A kernel's parameter layout (offsets and sizes from the driver, types from its PTX
    when known) and its packing plans, one per argument type signature, built on first use
    and shared by its launchers."""

    __slots__ = ("kernel", "params", "types", "size", "plans", "lock")

    def __init__(self, kernel: Kernel, params: tuple, types: tuple[ParamType, ...] | None):
        self.kernel = kernel
        self.params = params  # ((offset, size), ...)
        self.types = types  # one ParamType per parameter, or None: sizes only
        self.size = max((o + s for o, s in params), default=0)
        self.plans: dict[tuple[type, ...], _Plan] = {}
        self.lock = threading.Lock()

    def plan(self, args: tuple) -> _Plan:
        """The plan for the types of ``args``; checks their count, types and sizes."""
        key = tuple(map(type, args))
        plan = self.plans.get(key)
        if plan is None:
            with self.lock:
                plan = self.plans.get(key) or _Plan(self, args)
                self.plans[key] = plan
        return plan

    def buffers(self) -> tuple[bytearray, ctypes.Array | None]:
        """A parameter buffer and a ``void*`` array pointing into it (None without
        parameters), which the driver reads at each launch."""
        buffer = bytearray(max(self.size, 1))
        if not self.params:
            return buffer, None
        base = ctypes.addressof((ctypes.c_char * len(buffer)).from_buffer(buffer))
        pointers = (ctypes.c_void_p * len(self.params))(
            *[base + offset for offset, _ in self.params])
        return buffer, pointers

    def describe(self, index: int) -> str:
        offset, size = self.params[index]
        typed = f"{self.types[index].describe()}; " if self.types else ""
        return (f"parameter {index} of kernel {self.kernel.name!r} ({typed}offset {offset}, "
                f"{size} bytes)")

    def type_of(self, index: int) -> ParamType | None:
        """The parameter's type where it decides the conversion; None: by size only."""
        if self.types is None or self.types[index].kind == "other":
            return None
        return self.types[index]


class _Miss(Exception):
    """The arguments are not of the types a plan was made for."""


class _Plan:
    """How arguments of one type signature become parameter bytes: ``pack(buffer, stream,
    args)``, generated for the signature (a type guard, the conversions, one
    ``struct.pack_into``), so the hot path runs no per-argument Python loop."""

    __slots__ = ("pack", "getters", "codes", "types", "pack_into")

    def __init__(self, packer: Packer, args: tuple):
        if len(args) != len(packer.params):
            raise KernelArgumentError(
                f"kernel {packer.kernel.name!r} takes {len(packer.params)} argument(s) "
                f"(parameter sizes {[s for _, s in packer.params]} bytes), got {len(args)}")
        fmt, pos, getters, codes = ["<"], 0, [], []
        for index, ((offset, size), arg) in enumerate(zip(packer.params, args)):
            code, getter = _slot(packer, index, arg)
            fmt.append("x" * (offset - pos) + code)
            pos = offset + size
            getters.append(getter)
            codes.append(code)
        self.getters = tuple(getters)
        self.codes = tuple(codes)
        self.types = tuple(map(type, args))
        self.pack_into = struct.Struct("".join(fmt)).pack_into
        self.pack = _generate_pack(self)


class _NoPlan:
    __slots__ = ()

    @staticmethod
    def pack(buffer, stream, args):
        raise _Miss


NO_PLAN = _NoPlan()
# What packing raises for a value its code cannot hold (an int beyond the signed range,
# a float beyond a float32's): `pack_slowly` then says which parameter, or packs unsigned.
PACK_ERRORS = (struct.error, OverflowError)


def argument_code(plan: _Plan, miss: str) -> tuple[str, str, dict]:
    """Source that unpacks ``args``, checks the types against the plan (running ``miss``
    when they differ), and the ``, value, ...`` list for ``pack_into``; and its scope."""
    n = len(plan.types)
    lines = [f"    if len(args) != {n}:\n        {miss}\n"]
    if n:
        lines.append(f"    {', '.join(f'a{i}' for i in range(n))}, = args\n")
        guard = " or ".join(f"type(a{i}) is not T{i}" for i in range(n))
        lines.append(f"    if {guard}:\n        {miss}\n")
    values = []
    for i, getter in enumerate(plan.getters):
        if getter is _device_array_pointer:  # inlined: the common case on the hot path
            lines.append(f"    c = a{i}._ctx\n"
                         f"    if c._state is not ACTIVE or c._device is not device "
                         f"or not a{i}._c:\n"
                         f"        G{i}(a{i}, stream)\n")
            values.append(f", a{i}.ptr")
        else:
            values.append(f", G{i}(a{i}, stream)" if getter else f", a{i}")
    scope = {"ACTIVE": ACTIVE, "pack_into": plan.pack_into,
             **{f"T{i}": t for i, t in enumerate(plan.types)},
             **{f"G{i}": g for i, g in enumerate(plan.getters) if g}}
    return "".join(lines), "".join(values), scope


def compile_function(source: str, scope: dict, name: str, what: str) -> Callable:
    exec(compile(source, f"<cuctx {what}>", "exec"), scope)  # noqa: S102 - our own source
    return scope[name]


def _generate_pack(plan: _Plan) -> Callable:
    """``pack(buffer, stream, args)`` for one type signature; raises _Miss for others."""
    checks, values, scope = argument_code(plan, "raise Miss")
    source = (f"def pack(buffer, stream, args):\n    device = stream._ctx._device\n{checks}"
              f"    pack_into(buffer, 0{values})\n")
    return compile_function(source, {**scope, "Miss": _Miss}, "pack", f"packer {plan.types}")


def pack_slowly(packer: Packer, args: tuple, stream: Stream, buffer: bytearray) -> None:
    """Pack ``args`` one by one into ``buffer``, with clear errors: the path for values the
    plan's codes rejected (unsigned values for a signed code, values out of range)."""
    plan = packer.plan(args)
    for index, ((offset, size), arg) in enumerate(zip(packer.params, args)):
        getter, code = plan.getters[index], plan.codes[index]
        value = arg if getter is None else getter(arg, stream)
        try:
            try:
                data = struct.pack("<" + code, value)
            except PACK_ERRORS:
                if code not in _INT_CODES.values():
                    raise
                # C's conversion: values up to the unsigned maximum fit as well.
                data = int(value).to_bytes(size, "little", signed=int(value) < 0)
        except PACK_ERRORS as exc:
            raise KernelArgumentError(f"{packer.describe(index)} cannot hold {arg!r}: {exc}") \
                from None
        buffer[offset:offset + size] = data


# -- one argument in one parameter --------------------------------------------------------

def _number(arg: Any) -> str | None:
    """"bool", "int", "float" or "complex" for Python numbers (subclasses such as IntEnum
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


def _slot(packer: Packer, index: int, arg: Any):
    """(struct code, converter or None) for one argument of this type in this parameter."""
    size = packer.params[index][1]
    ptype = packer.type_of(index)
    if isinstance(arg, np.ndarray):
        raise KernelArgumentError(
            f"{packer.describe(index)} got a NumPy array, which is host memory; copy it to the "
            "device with cuctx.to_device(ary) and pass that")
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
            "arrays, anything with __cuda_array_interface__ or DLPack)")
    _need_pointer(packer, index, ptype, f"a {type(arg).__name__} (a device pointer)")
    return "Q", getter


def _untyped_number(packer: Packer, index: int, size: int, arg: Any, number: str):
    """No PTX: a NumPy scalar gives its bytes (of the parameter's size); a Python number
    packs by its own type."""
    if isinstance(arg, np.generic):
        _same_size(packer, index, size, arg.dtype.itemsize, f"a NumPy {arg.dtype} scalar")
        return f"{size}s", _sized_bytes(packer, index, size)
    if number in ("bool", "int") and size in _INT_CODES:
        return _INT_CODES[size], None  # out of the signed range: pack_slowly takes over
    if number == "float" and size in _FLOAT_CODES:
        return _FLOAT_CODES[size], None
    if number == "complex" and size in (8, 16):
        return f"{size}s", _complex_bytes(packer, index, size)
    raise KernelArgumentError(f"{packer.describe(index)} cannot take a Python {number}; pass "
                              "a ctypes structure or NumPy scalar of that size")


def _typed_number(packer: Packer, index: int, ptype: ParamType, arg: Any, number: str):
    """A number converted to the parameter's type (its PTX declaration)."""
    what = f"{packer.describe(index)} cannot take {type(arg).__name__} {arg!r}"
    from_ctypes = isinstance(arg, ctypes._SimpleCData)
    if ptype.kind == "int":
        if number in ("bool", "int"):
            getter = (_ctypes_value if from_ctypes
                      else _as_int if isinstance(arg, np.bool_) else None)
            return _INT_CODES[ptype.size], getter
        raise KernelArgumentError(f"{what}: the parameter is an integer; pass an int "
                                  "(convert it yourself, e.g. round(x) or int(x))")
    if ptype.kind == "float":
        if number in ("int", "float"):
            return _FLOAT_CODES[ptype.size], _ctypes_value if from_ctypes else None
        reason = ("a bool is not converted to a floating-point parameter; pass 0.0 or 1.0"
                  if number == "bool" else "pass a float (use a struct parameter for complex)")
        raise KernelArgumentError(f"{what}: {reason}")
    # A struct by value: complex numbers fill one of two floats or two doubles; other
    # values only as bytes of exactly its size.
    if number == "complex" and ((ptype.size == 8 and ptype.align >= 4)
                                or (ptype.size == 16 and ptype.align >= 8)):
        return f"{ptype.size}s", _complex_bytes(packer, index, ptype.size)
    if from_ctypes:
        _same_size(packer, index, ptype.size, ctypes.sizeof(arg),
                   f"a ctypes {type(arg).__name__}")
        return f"{ptype.size}s", _ctypes_bytes
    if isinstance(arg, np.generic):
        _same_size(packer, index, ptype.size, arg.dtype.itemsize, f"a NumPy {arg.dtype} scalar")
        return f"{ptype.size}s", _sized_bytes(packer, index, ptype.size)
    half = " (np.float16(x) for a __half)" if ptype.size == 2 else ""
    raise KernelArgumentError(
        f"{what}: the parameter is a struct of {ptype.size} bytes; pass a ctypes structure or "
        f"a NumPy scalar of that size{half}")


def _need_pointer(packer: Packer, index: int, ptype: ParamType | None, what: str) -> None:
    if packer.params[index][1] != 8:
        raise KernelArgumentError(f"{packer.describe(index)} is not pointer-sized; it cannot "
                                  f"take {what}")
    if ptype is not None and ptype.kind != "int":
        raise KernelArgumentError(f"{packer.describe(index)} is not a pointer; it cannot "
                                  f"take {what}")


def _same_size(packer: Packer, index: int, size: int, got: int, what: str) -> None:
    if got != size:
        raise KernelArgumentError(f"{packer.describe(index)} got {what} of {got} bytes; the "
                                  f"parameter is {size} bytes")


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
            raise KernelArgumentError(f"{packer.describe(index)} cannot hold {arg!r}: "
                                      f"{exc}") from None
    return as_bytes


def _ctypes_bytes(arg, stream) -> bytes:
    return bytes(arg)


# -- device memory ------------------------------------------------------------------------

def _pointer_getter(arg: Any):
    """A converter from this kind of device array to its address, checking its device, or
    None when ``arg`` is no device array."""
    from .memory import DeviceArray
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
    if ctx._device is not device:
        _reachable(ctx.device, device, arr)
    if not arr._c:
        _not_contiguous(arr)
    return arr.ptr


def _torch_pointer(tensor, stream: Stream) -> int:
    device = stream._ctx._device
    where = tensor.device
    if where.type != "cuda":
        raise KernelArgumentError(f"a torch tensor on {where} is host memory; move it to the "
                                  "GPU (tensor.cuda()) first")
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
    from .memory import asarray
    # The launch's own stream, not the current one, must wait for the producer's work.
    return _device_array_pointer(asarray(obj, stream=stream), stream)


def _reachable(owner: Device, device: Device, arr) -> None:
    """Kernels on ``device`` may use ``owner``'s memory once peer access is enabled."""
    if owner in getattr(device, "_peers", ()):
        return
    what = (f"{type(arr).__name__} on device {owner.ordinal} passed to a launch on device "
            f"{device.ordinal}")
    if not device.can_access_peer(owner):
        raise KernelArgumentError(f"{what}, which cannot access it (no peer access between "
                                  "them); copy it to the launch device first")
    raise KernelArgumentError(
        f"{what} needs peer access: call cuctx.Device({device.ordinal}).enable_peer_access("
        f"cuctx.Device({owner.ordinal})) first, or copy it to device {device.ordinal}")


def _not_contiguous(arr) -> None:
    """A kernel receives a bare pointer: strides do not reach it, so it would read a strided
    or transposed view as if it were dense and C-ordered."""
    raise KernelArgumentError(
        f"a {type(arr).__name__} that is not C-contiguous (shape {tuple(arr.shape)}) passed "
        "to a kernel, which receives only its address and would read it as dense C-ordered "
        "data; pass a C-contiguous copy, or its address (an int) if the kernel takes the "
        "strides itself")
