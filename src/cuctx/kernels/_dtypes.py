"""Which arrays a pointer parameter takes: the dtypes of its element type in C, as the source
cuctx compiled declares it (`cuctx.kernels._access`; PTX does not keep it, a pointer is a
``.u64``), or as `Kernel.set_dtypes` says.

One C element type, one dtype: ``float*`` takes float32 arrays, ``const int*`` int32,
``unsigned long long*`` uint64, ``__half*`` float16. Byte pointers (``void*``, ``char*``,
``unsigned char*``, ``int8_t*``, ``std::byte*``) take any array, as C lets them read any
object's bytes; so does a type cuctx does not know (a struct, a template parameter without
a name expression). A vector type takes its component's dtype, and the two- and four-wide
float and double ones complex numbers too (``float2*``: float32 or complex64). NumPy has
no bfloat16: ``__nv_bfloat16*`` takes uint16 (its bits) and other libraries' bfloat16.
docs/kernels.md has the table.
"""

from __future__ import annotations

import ctypes
import re
from typing import Any, Mapping, NamedTuple

import numpy as np

from . import _access

_LONG = "int64" if ctypes.sizeof(ctypes.c_long) == 8 else "int32"  # NVRTC follows the host
_BF16 = ("uint16", "bfloat16")
_C64, _C128 = ("float32", "complex64"), ("float64", "complex128")
_ADDRESSES = ("uint64", "int64")  # what a pointer to pointers reads

_BYTES = frozenset({"void", "char", "signed char", "unsigned char", "byte", "int8_t", "uint8_t"})
_NAMED = {
    "bool": ("bool",),
    "float": ("float32",),
    "double": ("float64",),
    "__half": ("float16",),
    "half": ("float16",),
    "_Float16": ("float16",),
    "__half2": ("float16",),
    "half2": ("float16",),
    "__nv_bfloat16": _BF16,
    "nv_bfloat16": _BF16,
    "__bf16": _BF16,
    "__nv_bfloat162": _BF16,
    "nv_bfloat162": _BF16,
    "int16_t": ("int16",),
    "uint16_t": ("uint16",),
    "int32_t": ("int32",),
    "uint32_t": ("uint32",),
    "int64_t": ("int64",),
    "uint64_t": ("uint64",),
    "size_t": ("uint64",),
    "ptrdiff_t": ("int64",),
    "intptr_t": ("int64",),
    "uintptr_t": ("uint64",),
    "cuFloatComplex": _C64,
    "cuComplex": _C64,
    "complex<float>": _C64,
    "cuDoubleComplex": _C128,
    "complex<double>": _C128,
}
_INTEGER_WORDS = frozenset({"signed", "unsigned", "char", "short", "int", "long"})
_VECTOR = re.compile(r"(u?)(char|short|int|longlong|long|float|double)([1-4])(?:_(?:16|32)a)?")
_COMPONENTS = {
    "short": "int16",
    "int": "int32",
    "long": _LONG,
    "longlong": "int64",
    "float": "float32",
    "double": "float64",
}
_NAMESPACES = re.compile(r"^(?:::)?(?:\w+::)*")  # std::, cuda::std::, thrust::

# NumPy's dtype objects by name (int64 is both 'l' and 'q'): the fast paths compare the
# array's dtype with these by identity.
_OBJECTS: dict[str, tuple[np.dtype, ...]] = {}
for _code in "?bBhHiIlLqQefdFD":
    _OBJECTS[np.dtype(_code).name] = (*_OBJECTS.get(np.dtype(_code).name, ()), np.dtype(_code))


def accepts(pointee: str | None) -> tuple[str, ...] | None:
    """The dtype names a pointer to ``pointee`` (a type as `_access` spells it) takes;
    None: any array."""
    if pointee is None:
        return None
    if pointee.endswith("*"):
        return _ADDRESSES
    name = _NAMESPACES.sub("", pointee)
    if name in _BYTES:
        return None
    if name in _NAMED:
        return _NAMED[name]
    words = name.split()
    if words and set(words) <= _INTEGER_WORDS:
        if "char" in words:
            return None
        size = (
            "int16"
            if "short" in words
            else "int64"
            if words.count("long") == 2
            else _LONG
            if "long" in words
            else "int32"
        )
        return (("u" + size if "unsigned" in words else size),)
    vector = _VECTOR.fullmatch(name)
    if vector is None or vector[2] == "char":
        return None
    component = ("u" if vector[1] else "") + _COMPONENTS[vector[2]]
    if vector[3] in "24" and component in ("float32", "float64"):
        return _C64 if component == "float32" else _C128
    return (component,)


class Expect(NamedTuple):
    """The arrays one pointer parameter takes."""

    index: int
    name: str  # in the source ("" where unknown)
    ctype: str  # its C type as declared ("" where unknown)
    element: str | None  # what it points at, for the message; None: set by set_dtypes
    accepts: tuple[str, ...]  # dtype names: NumPy's, and "bfloat16"
    dtypes: tuple[np.dtype, ...]  # NumPy's dtype objects of those names


def _expect(
    index: int, param: _access.Param | None, names: tuple[str, ...], element: str | None
) -> Expect:
    dtypes = tuple(d for n in names for d in _OBJECTS.get(n, ()))
    return Expect(
        index, param.name if param else "", param.ctype if param else "", element, names, dtypes
    )


def expects(kernel: Any) -> tuple[Expect | None, ...]:
    """One `Expect` per parameter (None: any argument): `Kernel.set_dtypes`, else the type
    its source declares."""
    params = _access.declared(kernel)
    out: list[Expect | None] = [None] * len(kernel.param_layout)
    for i, p in enumerate(params or ()):
        names = accepts(p.pointee)
        if names is not None:
            out[i] = _expect(i, p, names, p.pointee)
    for i, names in (kernel._dtypes or {}).items():
        out[i] = None if names is None else _expect(i, params[i] if params else None, names, None)
    return tuple(out)


def resolve(kernel: Any, given: Mapping[str | int, Any]) -> dict[int, tuple[str, ...] | None]:
    """``given`` for `Kernel.set_dtypes` (parameter name or index -> a dtype, several, or
    None) checked and keyed by index: names of dtypes, or None."""
    params = _access.declared(kernel)
    out: dict[int, tuple[str, ...] | None] = {}
    for index, value in _access.keyed(kernel, given).items():
        size = kernel.param_layout[index][1]
        pointer = params[index].pointee is not None if params else size == 8
        if not pointer:
            what = f"{params[index].ctype} {params[index].name}" if params else f"{size} bytes"
            raise ValueError(
                f"parameter {index} of kernel {kernel.name!r} ({what}) is not a "
                "pointer: set_dtypes is for the arrays a pointer parameter takes"
            )
        values = value if isinstance(value, (tuple, list, set, frozenset)) else (value,)
        out[index] = None if value is None else tuple(_name(v, index) for v in values)
    return out


def _name(value: Any, index: int) -> str:
    if value == "bfloat16":
        return value
    try:
        return np.dtype(value).name
    except TypeError as exc:
        raise TypeError(
            f"set_dtypes: {value!r} for parameter {index} is not a dtype (a NumPy "
            f'dtype or type such as np.float32, "bfloat16", or None for any '
            f"array): {exc}"
        ) from None


def name_of(arg: Any) -> str:
    """The dtype's name of an array: NumPy's (cuctx, CuPy) or torch's (``torch.float32``)."""
    dtype = arg.dtype
    return dtype.name if isinstance(dtype, np.dtype) else str(dtype).rpartition(".")[2]


def mismatch(kernel: str, expect: Expect, arg: Any, got: str) -> str:
    """What a launch with an array of dtype ``got`` for ``expect``'s parameter is told."""
    e = expect
    declared = " ".join(filter(None, (e.ctype, e.name)))
    what = f"parameter {e.index}{f' ({declared})' if declared else ''} of kernel {kernel!r}"
    said = "" if e.element else " (kernel.set_dtypes)"
    reads = f": the kernel would read its bytes as {e.element}" if e.element else ""
    torch = type(arg).__module__.startswith("torch")
    first = "bfloat16" if torch and "bfloat16" in e.accepts else e.accepts[0]
    as_view = f"tensor.view(torch.{first})" if torch else f"arr.view(np.{first})"
    as_dtype = f"np.{got}" if got in _OBJECTS else repr(got)
    key = f"{e.name}={as_dtype}" if e.name else f"{{{e.index}: {as_dtype}}}"
    return (
        f"{what} takes {' or '.join(e.accepts)} arrays{said}, not a {type(arg).__name__} "
        f"of {got}{reads}. Pass {first} data, or let it through knowingly: "
        f"{as_view} for this launch, or kernel.set_dtypes({key}) for every launch"
    )
