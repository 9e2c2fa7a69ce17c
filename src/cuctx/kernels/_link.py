"""`Library.link`: pieces of device code (C++ sources, PTX, cubins, LTO-IR, fatbins, host
objects, libraries, NVVM IR; in memory or in files) made into one image by the linker
(`_jitlink`), cached by every input and option. docs/kernels.md has the table of inputs."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from . import _jitlink
from ..devcode._kinds import KINDS, is_nvvm_ir, is_ptx, kind_of
from ._compile_cache import CompileResult
from ._compiler import cached, compile_source


_CPP_SUFFIXES = (".cu", ".cuh", ".cpp", ".cc", ".h", ".hpp")


@dataclass
class Linked:
    """What a link gives `Library`: the image, the names of its kernels by name expression,
    the PTX its kernels' parameter types come from, and the C++ it was compiled from."""

    image: bytes
    names: dict[str, str] = field(default_factory=dict)
    ptx: bytes | None = None
    source: str | None = None


def link_pieces(
    pieces: Iterable[Any],
    *,
    arch: str,
    lto: bool,
    options: Iterable[str],
    compile_options: Iterable[str | bytes],
    headers: Mapping | None,
    cache_dir,
) -> Linked:
    """Compile what needs compiling, link, and cache the link by every input and option."""
    if isinstance(pieces, (str, bytes, bytearray, memoryview, os.PathLike, CompileResult)):
        raise TypeError("Library.link takes a list of pieces (even of one), not a single piece")
    if isinstance(options, (str, bytes)):
        raise TypeError("options must be a sequence of str (the linker's), not one string")
    options = tuple(options)
    _jitlink.check_options(options)
    compile_options = tuple(compile_options)
    given = list(pieces)
    if not given:
        raise ValueError("Library.link needs at least one piece of device code")
    linked = Linked(b"")
    ptx: list[bytes] = []
    sources: list[str] = []
    ready = []
    for index, piece in enumerate(given, 1):
        name, data = _named(piece, index)
        result = None
        if isinstance(data, CompileResult):
            result = data
        elif isinstance(data, str) and not is_ptx(data) and not is_nvvm_ir(data):
            sources.append(data)
            result = compile_source(
                data,
                arch=arch,
                target="ltoir" if lto else "cubin",
                relocatable=True,
                options=compile_options,
                headers=headers,
                name=name,
                cache_dir=cache_dir,
            )
            if lto:  # LTO-IR keeps no PTX: the parameter types come from the PTX of the same
                result_ptx = compile_source(
                    data,
                    arch=arch,
                    target="ptx",
                    relocatable=True,
                    options=compile_options,
                    headers=headers,
                    name=name,
                    cache_dir=cache_dir,
                ).ptx
                result = _with_ptx(result, result_ptx)
        else:
            raw = data.encode() if isinstance(data, str) else bytes(data)
            kind = kind_of(raw)
            if kind is None:
                raise ValueError(
                    f"piece {name!r} is not device code: it is neither C++ source "
                    f"(str) nor one of {', '.join(KINDS)}"
                )
            if kind == "nvvm":  # compiled through libNVVM first
                result = compile_source(
                    raw,
                    arch=arch,
                    language="nvvm",
                    target="ltoir" if lto else "ptx",
                    name=name,
                    cache_dir=cache_dir,
                )
            else:
                ready.append(_jitlink.Piece(kind, name, raw))
                if kind == "ptx":
                    ptx.append(raw)
        if result is not None:
            if result.kind not in ("cubin", "ptx", "ltoir"):
                raise ValueError(f"piece {name!r}: a compile result of kind {result.kind!r}")
            ready.append(
                _jitlink.Piece(
                    result.kind,
                    result.name or name,
                    result.image,
                    data if isinstance(data, str) else "",
                )
            )
            linked.names.update(result.lowered_names)
            if result.ptx is not None:
                ptx.append(result.ptx)
    ready = tuple(ready)
    linker = _jitlink.linker_identity(lto, ready)
    material = [
        "link",
        linker,
        arch,
        lto,
        list(options),
        [[p.kind, p.name, hashlib.sha256(p.data).hexdigest()] for p in ready],
    ]
    result = cached(cache_dir, lambda: material, lambda: _link(ready, arch, lto, options, linker))
    linked.image = result.image
    linked.ptx = b"\n".join(p.rstrip(b"\0") for p in ptx) or None
    linked.source = "\n".join(sources) or None
    return linked


def _named(piece: Any, index: int) -> tuple[str, Any]:
    """(the name errors use, the data) of one piece as given."""
    if isinstance(piece, tuple):
        if len(piece) != 2 or not isinstance(piece[0], str):
            raise TypeError(f"piece {index}: a named piece is (name, data), got {piece!r:.80}")
        return piece
    if isinstance(piece, os.PathLike):
        path = os.fspath(piece)
        with open(path, "rb") as f:
            data = f.read()
        # A C++ source file is compiled like a source given as text.
        return str(path), data.decode() if str(path).endswith(_CPP_SUFFIXES) else data
    if isinstance(piece, CompileResult):
        return piece.name or f"piece {index}", piece
    if isinstance(piece, str):
        return f"piece{index}.cu" if not is_ptx(piece) else f"piece {index}", piece
    if isinstance(piece, (bytes, bytearray, memoryview)):
        return f"piece {index}", piece
    raise TypeError(
        f"piece {index} must be C++ source (str), device code (bytes), a file "
        f"(pathlib.Path), a compile result or (name, data), not "
        f"{type(piece).__name__}"
    )


def _with_ptx(result: CompileResult, ptx: bytes | None) -> CompileResult:
    return CompileResult(
        result.image,
        result.kind,
        result.arch,
        result.lowered_names,
        result.log,
        result.from_cache,
        ptx,
        result.name,
    )


def _link(pieces, arch: str, lto: bool, options: tuple[str, ...], linker: str) -> CompileResult:
    image, log = _jitlink.link(pieces, arch=arch, lto=lto, options=options, linker=linker)
    return CompileResult(
        image=image,
        kind="ptx" if is_ptx(image) else "cubin",
        arch=arch,
        lowered_names={},
        log=log,
        from_cache=False,
        name="link",
    )
