"""Kernel parameter types from PTX.

A cubin records each parameter's offset and size only; the PTX of the same program declares
its type. NVRTC writes C's scalar types as

    float -> .f32, double -> .f64, _Float16 -> .f16
    int, unsigned -> .u32; short -> .u16; char, bool -> .u8; long long, size_t,
    pointers -> .u64 (signedness is not kept; a pointer is not marked)
    structs, unions, vector types, __half, __nv_bfloat16, complex types ->
        .param .align A .b8 name[SIZE]

so a parameter is one of four kinds: "int", "float", "struct" (any ``[count]`` array) or
"other" (.bf16, .f16x2, .b128, ...: by size only).
"""

from __future__ import annotations

from typing import NamedTuple

from . import _cubin

_INT = frozenset(f"{sign}{bits}" for sign in "usb" for bits in (8, 16, 32, 64))
_FLOAT = frozenset({"f16", "f32", "f64"})


class ParamType(NamedTuple):
    """One kernel parameter as PTX declares it."""

    ptx: str  # the declaration's type, e.g. "f32", "u64", "b8[8]"
    kind: str  # "int", "float", "struct" or "other"
    offset: int
    size: int
    align: int

    def describe(self) -> str:
        what = {"int": "an integer", "float": "a floating-point number",
                "struct": "a struct passed by value"}.get(self.kind, "a value")
        return f".{self.ptx}: {what}"


def param_types(ptx: bytes | str) -> dict[str, tuple[ParamType, ...]]:
    """The parameter types of each ``.entry`` (by mangled name); an entry whose declaration
    this reader does not understand is left out, so its kernel is checked by size only."""
    source = _cubin._ptx_text(ptx)
    if source is None:
        return {}
    source = _cubin._PTX_COMMENT_RE.sub("", source)
    kernels = {}
    for match in _cubin._PTX_ENTRY_RE.finditer(source):
        name, declarations = match.group(1), match.group(2) or ""
        try:
            kernels[name] = _entry(name, [d.strip() for d in declarations.split(",")
                                          if d.strip()])
        except ValueError:
            continue
    return kernels


def _entry(name: str, declarations: list[str]) -> tuple[ParamType, ...]:
    params, end = [], 0
    for declaration in declarations:
        size, align = _cubin._ptx_param(name, declaration)
        found = _cubin._PTX_PARAM_RE.fullmatch(" ".join(declaration.split()))
        base, count = found["type"], found["count"]
        if count is not None:
            ptx, kind = f"{base}[{count}]", "struct"
        else:
            ptx = base
            kind = "int" if base in _INT else "float" if base in _FLOAT else "other"
        offset = -(-end // align) * align  # the C ABI, as the cubin's records follow it
        params.append(ParamType(ptx, kind, offset, size, align))
        end = offset + size
    return tuple(params)


def matching(types: tuple[ParamType, ...] | None,
             layout: tuple[tuple[int, int], ...]) -> tuple[ParamType, ...] | None:
    """``types`` when they describe exactly the driver's ``layout`` ((offset, size), ...),
    else None: types that disagree with the driver are never used to convert arguments."""
    if types is None or len(types) != len(layout):
        return None
    if any((t.offset, t.size) != tuple(p) for t, p in zip(types, layout)):
        return None
    return types
