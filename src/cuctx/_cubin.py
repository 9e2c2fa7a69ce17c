"""Kernel parameter layouts from CUDA images, without the driver.

A cubin is an ELF64 file (e_machine EM_CUDA). Each kernel is an STT_FUNC
symbol whose st_other carries STO_CUDA_ENTRY, and has a `.nv.info.<name>`
section: a sequence of records

    u8 format, u8 attribute, then
      EIFMT_NVAL/BVAL/HVAL (1/2/3): u16 value        (4 bytes in all)
      EIFMT_SVAL (4):               u16 size, payload (4 + size bytes)

Parameter records (all SVAL, 12-byte payload, one per parameter, listed in
reverse order, unused parameters included):

    EIATTR_KPARAM_INFO    (0x17): u32 index, u16 ordinal, u16 offset,
                                  u32 flags; size = flags >> 18 (14 bits)
    EIATTR_KPARAM_INFO_V2 (0x45): u32 index, u16 ordinal, u16 offset,
                                  u16 size, u16 (zero)

NVRTC 13.5 (sm_90) switches a kernel to V2 once its parameter space exceeds
4352 bytes; both must be read. EIATTR_PARAM_CBANK (0x0a), payload u32 symbol, u16 offset, u16 size,
gives the total parameter size (end of the last parameter).
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass

__all__ = [
    "KernelInfo",
    "Param",
    "is_cubin",
    "is_fatbin",
    "is_ptx",
    "kernel_layouts",
    "ptx_kernels",
    "ptx_layouts",
    "read_kernels",
]

_EM_CUDA = 190
_ELFCLASS64 = 2
_ELFDATA2LSB = 1
_SHT_SYMTAB = 2
_SHT_NOBITS = 8
_STT_FUNC = 2
_STO_CUDA_ENTRY = 0x10
_FATBIN_MAGIC = 0xBA55ED50

_EHDR = struct.Struct("<16sHHIQQQIHHHHHH")
_SHDR = struct.Struct("<IIQQQQIIQQ")
_SYM = struct.Struct("<IBBHQQ")

_EIFMT_SVAL = 4
_EIATTR_PARAM_CBANK = 0x0A
_EIATTR_KPARAM_INFO = 0x17
_EIATTR_KPARAM_INFO_V2 = 0x45
_RECORD_HEAD = struct.Struct("<BBH")
_KPARAM = struct.Struct("<IHHI")
_KPARAM_V2 = struct.Struct("<IHHHH")
_PARAM_CBANK = struct.Struct("<IHH")


@dataclass(frozen=True)
class Param:
    index: int
    offset: int
    size: int


@dataclass(frozen=True)
class KernelInfo:
    name: str
    params: tuple[Param, ...]
    param_size: int


# --------------------------------------------------------------------------
# Content sniffing


def is_cubin(data: bytes) -> bool:
    """ELF with e_machine EM_CUDA."""
    return (
        len(data) >= 20
        and data[:4] == b"\x7fELF"
        and struct.unpack_from("<H", data, 18)[0] == _EM_CUDA
    )


def is_fatbin(data: bytes) -> bool:
    return len(data) >= 4 and struct.unpack_from("<I", data)[0] == _FATBIN_MAGIC


_PTX_VERSION_RE = re.compile(r"^\s*\.version\s+\d+\.\d+", re.MULTILINE)
_PTX_TARGET_RE = re.compile(r"^\s*\.target\s+\w", re.MULTILINE)


def is_ptx(data: bytes | str) -> bool:
    """PTX text (optionally NUL-terminated) with .version and .target directives."""
    text = _ptx_text(data)
    return (
        text is not None
        and bool(_PTX_VERSION_RE.search(text))
        and bool(_PTX_TARGET_RE.search(text))
    )


def _ptx_text(data: bytes | str) -> str | None:
    if isinstance(data, (bytes, bytearray, memoryview)):
        # The driver wants PTX NUL-terminated, so images often end in NULs.
        raw = bytes(data).rstrip(b"\0")
        if b"\0" in raw:
            return None
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return None
    return data.rstrip("\0")


# --------------------------------------------------------------------------
# Cubin (ELF64)


def read_kernels(image: bytes) -> dict[str, KernelInfo]:
    """Parameter layout of every kernel in a cubin, keyed by mangled name.

    Raises ValueError if ``image`` is not a well-formed ELF64 cubin.
    """
    image = bytes(image)
    if not is_cubin(image):
        raise ValueError("not a cubin: missing ELF magic or e_machine is not EM_CUDA")
    _, _, _, _, _, phoff, shoff, _, _, phentsize, phnum, shentsize, shnum, shstrndx = _unpack(
        _EHDR, image, 0, "ELF header"
    )
    if image[4] != _ELFCLASS64 or image[5] != _ELFDATA2LSB:
        raise ValueError("unsupported cubin: only little-endian ELF64 is handled")
    if shentsize != _SHDR.size:
        raise ValueError(f"malformed cubin: section header size {shentsize}, expected {_SHDR.size}")
    if shnum == 0 or shstrndx >= shnum:
        raise ValueError(f"malformed cubin: {shnum} sections, string table index {shstrndx}")
    sections = [
        _unpack(_SHDR, image, shoff + i * shentsize, f"section header {i}") for i in range(shnum)
    ]
    # A truncated image must not pass as a smaller valid one, so every part the
    # headers describe has to be present, not just the parts read here.
    if phoff + phnum * phentsize > len(image):
        raise ValueError(
            f"truncated cubin: program headers end at {phoff + phnum * phentsize}, "
            f"image has {len(image)}"
        )
    for i, sh in enumerate(sections):
        _section_data(image, sh, f"section {i}")
    shstrtab = _section_data(image, sections[shstrndx], "section name table")
    by_name = {_cstr(shstrtab, sh[0], "section name"): sh for sh in sections}
    kernels = {}
    for name in _entry_names(image, sections):
        info_section = by_name.get(f".nv.info.{name}")
        if info_section is None:
            raise ValueError(f"malformed cubin: kernel {name!r} has no .nv.info.{name} section")
        kernels[name] = _parse_nv_info(name, _section_data(image, info_section, f".nv.info.{name}"))
    return kernels


def _entry_names(image: bytes, sections: list[tuple]) -> list[str]:
    names = []
    for sh in sections:
        if sh[1] != _SHT_SYMTAB:
            continue
        link = sh[6]
        if link >= len(sections):
            raise ValueError(f"malformed cubin: symbol table links to missing section {link}")
        strtab = _section_data(image, sections[link], "symbol string table")
        symtab = _section_data(image, sh, "symbol table")
        for off in range(0, len(symtab) - _SYM.size + 1, _SYM.size):
            st_name, st_info, st_other, _, _, _ = _SYM.unpack_from(symtab, off)
            if st_info & 0xF == _STT_FUNC and st_other & _STO_CUDA_ENTRY:
                names.append(_cstr(strtab, st_name, "symbol name"))
    return names


def _parse_nv_info(kernel: str, data: bytes) -> KernelInfo:
    params: dict[int, Param] = {}
    cbank_size = None
    for attr, payload in _nv_info_records(kernel, data):
        if attr == _EIATTR_KPARAM_INFO:
            _, ordinal, offset, flags = _unpack_payload(
                _KPARAM, payload, kernel, "EIATTR_KPARAM_INFO"
            )
            param = Param(ordinal, offset, flags >> 18)
        elif attr == _EIATTR_KPARAM_INFO_V2:
            _, ordinal, offset, size, _ = _unpack_payload(
                _KPARAM_V2, payload, kernel, "EIATTR_KPARAM_INFO_V2"
            )
            param = Param(ordinal, offset, size)
        elif attr == _EIATTR_PARAM_CBANK:
            cbank_size = _unpack_payload(_PARAM_CBANK, payload, kernel, "EIATTR_PARAM_CBANK")[2]
            continue
        else:
            continue
        if param.index in params:
            raise ValueError(
                f"malformed cubin: kernel {kernel!r} describes parameter {param.index} twice"
            )
        params[param.index] = param
    if sorted(params) != list(range(len(params))):
        raise ValueError(
            f"malformed cubin: kernel {kernel!r} has parameter ordinals {sorted(params)}, "
            "not 0..n-1"
        )
    ordered = tuple(params[i] for i in range(len(params)))
    end = max((p.offset + p.size for p in ordered), default=0)
    if cbank_size is not None and cbank_size < end:
        raise ValueError(
            f"malformed cubin: kernel {kernel!r} parameters end at {end} "
            f"but EIATTR_PARAM_CBANK says {cbank_size}"
        )
    return KernelInfo(kernel, ordered, end if cbank_size is None else cbank_size)


def _nv_info_records(kernel: str, data: bytes):
    """Yield (attribute, payload) for each record; payload is b"" unless SVAL."""
    pos = 0
    while pos < len(data):
        if pos + _RECORD_HEAD.size > len(data):
            raise ValueError(
                f"malformed cubin: .nv.info.{kernel} ends inside a record header at {pos}"
            )
        fmt, attr, value = _RECORD_HEAD.unpack_from(data, pos)
        pos += _RECORD_HEAD.size
        if fmt == _EIFMT_SVAL:
            if pos + value > len(data):
                raise ValueError(
                    f"malformed cubin: .nv.info.{kernel} attribute {attr:#x} claims {value} bytes, "
                    f"{len(data) - pos} remain"
                )
            yield attr, data[pos : pos + value]
            pos += value
        elif fmt in (1, 2, 3):
            yield attr, b""
        else:
            raise ValueError(
                f"malformed cubin: .nv.info.{kernel} has unknown record format {fmt:#x} "
                f"at {pos - 4}"
            )


def _unpack_payload(layout: struct.Struct, payload: bytes, kernel: str, what: str) -> tuple:
    if len(payload) != layout.size:
        raise ValueError(
            f"malformed cubin: {what} of {kernel!r} has {len(payload)} bytes, "
            f"expected {layout.size}"
        )
    return layout.unpack(payload)


def _unpack(layout: struct.Struct, data: bytes, offset: int, what: str) -> tuple:
    if offset < 0 or offset + layout.size > len(data):
        raise ValueError(
            f"truncated cubin: {what} at offset {offset} needs {layout.size} bytes, "
            f"image has {len(data)}"
        )
    return layout.unpack_from(data, offset)


def _section_data(image: bytes, sh: tuple, what: str) -> bytes:
    sh_type, offset, size = sh[1], sh[4], sh[5]
    if sh_type == _SHT_NOBITS:
        return b""
    if offset + size > len(image):
        raise ValueError(
            f"truncated cubin: {what} spans bytes {offset}..{offset + size}, image has {len(image)}"
        )
    return image[offset : offset + size]


def _cstr(table: bytes, offset: int, what: str) -> str:
    end = table.find(b"\0", offset)
    if offset >= len(table) or end < 0:
        raise ValueError(f"malformed cubin: {what} at string offset {offset} is outside its table")
    try:
        return table[offset:end].decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"malformed cubin: {what} at string offset {offset} is not UTF-8") from exc


# --------------------------------------------------------------------------
# PTX

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


def ptx_layouts(text: bytes | str) -> dict[str, KernelInfo]:
    """Parameter layout of every .entry in PTX, with C ABI offsets.

    Offsets follow each parameter's alignment: its .align if given, else the
    size of its element type (the rule the cubin records follow too).
    """
    source = _ptx_text(text)
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


# --------------------------------------------------------------------------


def kernel_layouts(image: bytes | str) -> dict[str, KernelInfo]:
    """Layouts from a cubin or PTX image; ValueError for anything else (fatbins included)."""
    if isinstance(image, str):
        return ptx_layouts(image)
    if is_cubin(image):
        return read_kernels(image)
    if is_fatbin(image):
        raise ValueError("fatbin images are not parsed for kernel layouts; pass a cubin or PTX")
    if is_ptx(image):
        return ptx_layouts(image)
    raise ValueError("unrecognised image: neither a cubin, a fatbin nor PTX")
