"""Which kind of device code a piece of bytes is, by its content: the one place that sniffs.

cubin    ELF with e_machine EM_CUDA (loadable; relocatable from -rdc too)
fatbin   the fat binary container (magic 0xBA55ED50)
ptx      text with .version and .target directives (NUL-terminated or not)
ltoir    NVVM's LTO intermediate code, as NVRTC's -dlto and libNVVM's -gen-lto write it
         (magic 0x7F4E43ED): linked with nvJitLink, never loaded
nvvm     NVVM IR for libNVVM: LLVM bitcode, or its text form
object   a host object file (ELF for the host machine, e.g. nvcc -c -rdc), whose device
         code nvJitLink takes out of its .nv_fatbin section
library  an archive of such objects (ar's "!<arch>")
"""

from __future__ import annotations

import re
import struct

KINDS = ("cubin", "fatbin", "ptx", "ltoir", "nvvm", "object", "library")
# What the driver loads as it is (cuLibraryLoadData); the others are linked or compiled first.
LOADABLE = ("cubin", "fatbin", "ptx")

EM_CUDA = 190
_FATBIN_MAGIC = 0xBA55ED50
_LTOIR_MAGIC = b"\xedCN\x7f"
_BITCODE_MAGICS = (b"BC\xc0\xde", b"\xde\xc0\x17\x0b")  # raw bitcode, the bitcode wrapper
_ARCHIVE_MAGIC = b"!<arch>\n"

PTX_VERSION_RE = re.compile(r"^\s*\.version\s+(\d+)\.(\d+)", re.MULTILINE)
_PTX_TARGET_RE = re.compile(r"^\s*\.target\s+\w", re.MULTILINE)
_NVVM_TEXT_RE = re.compile(r"^\s*(target\s+(triple|datalayout)|define\s|declare\s)", re.MULTILINE)


def is_cubin(data: bytes) -> bool:
    """ELF with e_machine EM_CUDA."""
    return _elf_machine(data) == EM_CUDA


def is_fatbin(data: bytes) -> bool:
    return len(data) >= 4 and struct.unpack_from("<I", data)[0] == _FATBIN_MAGIC


def is_ptx(data: bytes | str) -> bool:
    """PTX text (optionally NUL-terminated) with .version and .target directives."""
    text = ptx_text(data)
    return (
        text is not None and bool(PTX_VERSION_RE.search(text)) and bool(_PTX_TARGET_RE.search(text))
    )


def is_ltoir(data: bytes) -> bool:
    return bytes(data[:4]) == _LTOIR_MAGIC


def is_nvvm_ir(data: bytes | str) -> bool:
    """LLVM bitcode, or NVVM IR text (a target triple or datalayout, or definitions)."""
    if isinstance(data, (bytes, bytearray, memoryview)) and bytes(data[:4]) in _BITCODE_MAGICS:
        return True
    text = ptx_text(data)  # the same test: NUL-free UTF-8
    return text is not None and not is_ptx(text) and bool(_NVVM_TEXT_RE.search(text))


def kind_of(data: bytes | str) -> str | None:
    """The kind of ``data`` (one of `KINDS`), None when it is none of them."""
    if isinstance(data, str):
        return "ptx" if is_ptx(data) else "nvvm" if is_nvvm_ir(data) else None
    data = bytes(data)
    machine = _elf_machine(data)
    if machine is not None:
        return "cubin" if machine == EM_CUDA else "object"
    if is_fatbin(data):
        return "fatbin"
    if is_ltoir(data):
        return "ltoir"
    if data.startswith(_ARCHIVE_MAGIC):
        return "library"
    if is_ptx(data):
        return "ptx"
    if is_nvvm_ir(data):
        return "nvvm"
    return None


def _elf_machine(data: bytes) -> int | None:
    """e_machine of an ELF file; None for anything else."""
    if len(data) < 20 or bytes(data[:4]) != b"\x7fELF":
        return None
    return struct.unpack_from("<H", data, 18)[0]


def ptx_text(data: bytes | str) -> str | None:
    """The text of PTX (or any NUL-free UTF-8) without its trailing NULs; None for binary
    data."""
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
