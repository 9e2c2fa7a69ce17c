"""Cubins (ELF for CUDA) read without the driver.

`read_cubin` reads kernels with their parameter layouts and resources
(registers, static shared and local memory, ``__launch_bounds__``), the ``__device__``,
``__constant__`` and ``__managed__`` variables with their initial bytes, the architecture.
`read_kernels` gives the parameter layouts alone (the tests check them against the C ABI and
the driver).

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

import struct

from ._kinds import is_cubin
from ._layout import Image, KernelImage, KernelInfo, Param

_ELFCLASS64 = 2
_ELFDATA2LSB = 1
_SHT_SYMTAB = 2
_SHT_NOBITS = 8
_STT_OBJECT = 1
_STT_FUNC = 2
_STO_CUDA_ENTRY = 0x10
_STO_CUDA_MANAGED = 0x04  # st_other bit of a __managed__ variable's symbol

_EHDR = struct.Struct("<16sHHIQQQIHHHHHH")
_SHDR = struct.Struct("<IIQQQQIIQQ")
_SYM = struct.Struct("<IBBHQQ")

_EIFMT_SVAL = 4
_EIATTR_MAX_THREADS = 0x05
_EIATTR_PARAM_CBANK = 0x0A
_EIATTR_FRAME_SIZE = 0x11
_EIATTR_REGCOUNT = 0x2F
_EIATTR_KPARAM_INFO = 0x17
_EIATTR_KPARAM_INFO_V2 = 0x45
_RECORD_HEAD = struct.Struct("<BBH")
_KPARAM = struct.Struct("<IHHI")
_KPARAM_V2 = struct.Struct("<IHHHH")
_PARAM_CBANK = struct.Struct("<IHH")


def read_kernels(image: bytes) -> dict[str, KernelInfo]:
    """Parameter layout of every kernel in a cubin, keyed by mangled name.

    Raises ValueError if ``image`` is not a well-formed ELF64 cubin.
    """
    elf = _Elf(bytes(image))
    return {name: kernel.info for name, kernel in _kernels(elf).items()}


class _Elf:
    """The sections (headers, names) and symbols of a checked ELF64 cubin."""

    def __init__(self, image: bytes) -> None:
        if not is_cubin(image):
            raise ValueError("not a cubin: missing ELF magic or e_machine is not EM_CUDA")
        header = _unpack(_EHDR, image, 0, "ELF header")
        phoff, shoff, self.flags, _, phentsize, phnum, shentsize, shnum, shstrndx = header[5:]
        if image[4] != _ELFCLASS64 or image[5] != _ELFDATA2LSB:
            raise ValueError("unsupported cubin: only little-endian ELF64 is handled")
        if shentsize != _SHDR.size:
            raise ValueError(
                f"malformed cubin: section header size {shentsize}, expected {_SHDR.size}"
            )
        if shnum == 0 or shstrndx >= shnum:
            raise ValueError(f"malformed cubin: {shnum} sections, string table index {shstrndx}")
        self.image = image
        self.sections = [
            _unpack(_SHDR, image, shoff + i * shentsize, f"section header {i}")
            for i in range(shnum)
        ]
        # A truncated image must not pass as a smaller valid one, so every part the
        # headers describe has to be present, not just the parts read here.
        if phoff + phnum * phentsize > len(image):
            raise ValueError(
                f"truncated cubin: program headers end at {phoff + phnum * phentsize}, "
                f"image has {len(image)}"
            )
        for i, sh in enumerate(self.sections):
            _section_data(image, sh, f"section {i}")
        shstrtab = _section_data(image, self.sections[shstrndx], "section name table")
        self.names = [_cstr(shstrtab, sh[0], "section name") for sh in self.sections]
        self.by_name = dict(zip(self.names, self.sections))
        self.symbols = list(self._symbols())

    def _symbols(self):
        """(name, st_info, st_other, st_shndx, st_value, st_size) of every symbol."""
        for sh in self.sections:
            if sh[1] != _SHT_SYMTAB:
                continue
            link = sh[6]
            if link >= len(self.sections):
                raise ValueError(f"malformed cubin: symbol table links to missing section {link}")
            strtab = _section_data(self.image, self.sections[link], "symbol string table")
            symtab = _section_data(self.image, sh, "symbol table")
            for off in range(0, len(symtab) - _SYM.size + 1, _SYM.size):
                st_name, *fields = _SYM.unpack_from(symtab, off)
                yield _cstr(strtab, st_name, "symbol name"), *fields

    def data(self, name: str) -> bytes:
        """A section's bytes (b"" for a section that is absent or holds none in the file)."""
        sh = self.by_name.get(name)
        return b"" if sh is None else _section_data(self.image, sh, name)

    def records(self, name: str):
        """(attribute, payload) of each record of an .nv.info section (none when absent)."""
        return _nv_info_records(name.removeprefix(".nv.info."), self.data(name))


def _kernels(elf: _Elf) -> dict[str, KernelImage]:
    kernels = {}
    for name, info, other, *_ in elf.symbols:
        if info & 0xF == _STT_FUNC and other & _STO_CUDA_ENTRY:
            if f".nv.info.{name}" not in elf.by_name:
                raise ValueError(f"malformed cubin: kernel {name!r} has no .nv.info.{name} section")
            kernels[name] = KernelImage(_parse_nv_info(name, elf.data(f".nv.info.{name}")))
    return kernels


_VARIABLE_SECTIONS = (".nv.global", ".nv.global.init", ".nv.constant3")
_RESERVED_SHARED = 1024


def read_cubin(image: bytes) -> Image:
    """The parsed cubin; ValueError for a malformed one."""
    elf = _Elf(bytes(image))
    kernels = _kernels(elf)
    variables, managed = {}, {}
    for name, info, other, shndx, value, size in elf.symbols:
        if (
            info & 0xF == _STT_OBJECT
            and 0 < shndx < len(elf.sections)
            and elf.names[shndx] in _VARIABLE_SECTIONS
        ):
            if value + size > elf.sections[shndx][5]:  # sh_size: it lies inside its section
                raise ValueError(f"malformed cubin: variable {name!r} ends past its section")
            initial = elf.data(elf.names[shndx])[value : value + size].ljust(size, b"\0")
            (managed if other & _STO_CUDA_MANAGED else variables)[name] = initial
    for attr, payload in elf.records(".nv.info"):
        if attr in (_EIATTR_REGCOUNT, _EIATTR_FRAME_SIZE) and len(payload) == 8:
            sym, value = struct.unpack("<II", payload)
            kernel = kernels.get(elf.symbols[sym][0]) if sym < len(elf.symbols) else None
            if kernel is not None:
                setattr(kernel, "regs" if attr == _EIATTR_REGCOUNT else "local", value)
    # On sm_80 and later a kernel's shared section starts with 1 KiB the system reserves,
    # which the driver does not count as the kernel's static shared memory.
    reserved = _RESERVED_SHARED if ".nv.shared.reserved.0" in elf.by_name else 0
    for name, kernel in kernels.items():
        shared = elf.by_name.get(f".nv.shared.{name}")
        kernel.shared = max(shared[5] - reserved, 0) if shared else 0
        for attr, payload in elf.records(f".nv.info.{name}"):
            if attr == _EIATTR_MAX_THREADS and len(payload) == 12:
                x, y, z = struct.unpack("<III", payload)
                kernel.max_threads = x * y * z
    # Newer cubins keep the SM version in bits 8-15 of e_flags, older ones in bits 0-7.
    arch = elf.flags & 0xFF if elf.flags & 0xFF >= 0x14 else (elf.flags >> 8) & 0xFF
    const = elf.by_name.get(".nv.constant3")
    return Image("cubin", arch, arch, kernels, variables, managed, const[5] if const else 0)


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
