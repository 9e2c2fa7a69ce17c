"""PTX read without the driver: each ``.entry``'s parameter layout (C ABI offsets), the
image's variables, and the parameter types PTX declares.

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

import re
from typing import NamedTuple

from ._kinds import PTX_VERSION_RE, ptx_text
from ._layout import Image, KernelImage, KernelInfo, Param

_PTX_ARCH_RE = re.compile(r"^\s*\.target\s+sm_(\d+)", re.MULTILINE)

_PTX_TYPE_SIZES = {
    **dict.fromkeys(("b8", "u8", "s8"), 1),
    **dict.fromkeys(("b16", "u16", "s16", "f16", "bf16"), 2),
    **dict.fromkeys(("b32", "u32", "s32", "f32", "f16x2", "bf16x2"), 4),
    **dict.fromkeys(("b64", "u64", "s64", "f64"), 8),
    "b128": 16,
}
_PTX_COMMENT_RE = re.compile(r"//[^\n]*|/\*.*?\*/", re.DOTALL)
_PTX_ENTRY_RE = re.compile(r"\.entry\s+([A-Za-z_$%][\w$%]*)\s*(?:\(([^)]*)\))?")
_PTX_PARAM_RE = re.compile(
    r"""\.param
        (?:\s+\.align\s+(?P<align>\d+))?
        \s+\.(?P<type>\w+)
        (?:\s+\.ptr(?:\s+\.(?:global|const|local|shared))?(?:\s+\.align\s+\d+)?)?
        \s+[A-Za-z_$%][\w$%]*
        (?:\s*\[\s*(?P<count>\d+)\s*\])?""",
    re.VERBOSE,
)
_PTX_GLOBAL_RE = re.compile(
    r"^\s*(?:\.visible\s+|\.extern\s+)?\.(global|const)\s+(?:\.align\s+(\d+)\s+)?\.(\w+)\s+"
    r"([A-Za-z_$%][\w$%]*)\s*(?:\[(\d+)\])?",
    re.MULTILINE,
)


def ptx_layouts(text: bytes | str) -> dict[str, KernelInfo]:
    """Parameter layout of every .entry in PTX, with C ABI offsets.

    Offsets follow each parameter's alignment: its .align if given, else the
    size of its element type (the rule the cubin records follow too).
    """
    source = ptx_text(text)
    if source is None:
        raise ValueError("not PTX: data is not NUL-free UTF-8 text")
    source = _PTX_COMMENT_RE.sub("", source)
    kernels = {}
    for match in _PTX_ENTRY_RE.finditer(source):
        name, param_list = match.group(1), match.group(2) or ""
        decls = [d.strip() for d in param_list.split(",") if d.strip()]
        params = []
        end = 0
        for index, decl in enumerate(decls):
            size, align = _ptx_param(name, decl)
            offset = -(-end // align) * align
            params.append(Param(index, offset, size))
            end = offset + size
        kernels[name] = KernelInfo(name, tuple(params), end)
    return kernels


def read_ptx(data: bytes | str) -> Image:
    """The parsed PTX image: kernels with their layouts, variables (zeroed)."""
    layouts = ptx_layouts(data)
    text = ptx_text(data)
    version = PTX_VERSION_RE.search(text)
    target = _PTX_ARCH_RE.search(text)
    variables = {}
    for match in _PTX_GLOBAL_RE.finditer(_PTX_COMMENT_RE.sub("", text)):
        elem = _PTX_TYPE_SIZES.get(match.group(3), 1)
        count = int(match.group(5)) if match.group(5) else 1
        variables[match.group(4)] = bytes(elem * count)  # initializers are not parsed
    return Image(
        "ptx",
        int(target.group(1)) if target else 0,
        int(version.group(1)) * 10 + int(version.group(2)) if version else 0,
        {name: KernelImage(info) for name, info in layouts.items()},
        variables,
        {},
    )


def ptx_kernels(text: bytes | str) -> dict[str, list[int]]:
    """Parameter sizes of every .entry in PTX."""
    return {name: [p.size for p in info.params] for name, info in ptx_layouts(text).items()}


def _ptx_param(kernel: str, decl: str) -> tuple[int, int]:
    match = _PTX_PARAM_RE.fullmatch(" ".join(decl.split()))
    if match is None:
        raise ValueError(f"unsupported PTX parameter in .entry {kernel}: {decl!r}")
    elem = _PTX_TYPE_SIZES.get(match["type"])
    if elem is None:
        raise ValueError(
            f"unsupported PTX parameter type .{match['type']} in .entry {kernel}: {decl!r}"
        )
    count = int(match["count"]) if match["count"] is not None else 1
    align = int(match["align"]) if match["align"] is not None else elem
    if align <= 0 or align & (align - 1):
        raise ValueError(
            f"PTX parameter in .entry {kernel} has invalid alignment {align}: {decl!r}"
        )
    return elem * count, align


# -- parameter types -----------------------------------------------------------------

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
        what = {
            "int": "an integer",
            "float": "a floating-point number",
            "struct": "a struct passed by value",
        }.get(self.kind, "a value")
        return f".{self.ptx}: {what}"


def param_types(ptx: bytes | str) -> dict[str, tuple[ParamType, ...]]:
    """The parameter types of each ``.entry`` (by mangled name); an entry whose declaration
    this reader does not understand is left out, so its kernel is checked by size only."""
    source = ptx_text(ptx)
    if source is None:
        return {}
    source = _PTX_COMMENT_RE.sub("", source)
    kernels = {}
    for match in _PTX_ENTRY_RE.finditer(source):
        name, declarations = match.group(1), match.group(2) or ""
        try:
            kernels[name] = _entry(name, [d.strip() for d in declarations.split(",") if d.strip()])
        except ValueError:
            continue
    return kernels


def _entry(name: str, declarations: list[str]) -> tuple[ParamType, ...]:
    params, end = [], 0
    for declaration in declarations:
        size, align = _ptx_param(name, declaration)
        found = _PTX_PARAM_RE.fullmatch(" ".join(declaration.split()))
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


def matching(
    types: tuple[ParamType, ...] | None, layout: tuple[tuple[int, int], ...]
) -> tuple[ParamType, ...] | None:
    """``types`` when they describe exactly the driver's ``layout`` ((offset, size), ...),
    else None: types that disagree with the driver are never used to convert arguments."""
    if types is None or len(types) != len(layout):
        return None
    if any((t.offset, t.size) != tuple(p) for t, p in zip(types, layout)):
        return None
    return types
