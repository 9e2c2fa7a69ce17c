"""Runtime compilation, backed by a persistent cache: CUDA C++ with NVRTC, NVVM IR with
libNVVM, PTX to a cubin with the linker; to a cubin, PTX or LTO-IR.

The compilers are loaded lazily so that importing this module never requires them.
See docs/compiler.md for the targets and the cache design.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Literal

from . import _jitlink, _nvvm
from ..devcode._kinds import is_ptx
from ..devcode._mangled import declared_name
from ._compile_cache import (
    CACHE_FORMAT_VERSION,
    CacheWarning,
    CompileResult,
    _load_entry,
    _store_entry,
)
from ._nvrtc import (
    CompileError,
    Request,
    nvrtc_supported_archs,
    nvrtc_version,
    run_nvrtc,
    with_declarations,
)

__all__ = [
    "CacheWarning",
    "CompileError",
    "CompileResult",
    "cache_directory",
    "compile_source",
    "declared_name",
    "nvrtc_supported_archs",
    "nvrtc_version",
    "pick_arch",
]

Target = Literal["cubin", "ptx", "ltoir"]
Language = Literal["c++", "ptx", "nvvm"]
_DEFAULT_NAMES = {"c++": "cuctx_kernel.cu", "ptx": "cuctx_kernel.ptx", "nvvm": "cuctx_kernel.ll"}

_ARCH_RE = re.compile(r"(?:sm|compute)_\d+[af]?")
# The target comes from `arch`; a second one in `options` would silently win
# (NVRTC only warns), so it is rejected instead.
_ARCH_OPTION_RE = re.compile(r"(-arch|--gpu-architecture)(=|\s|$)")

# --------------------------------------------------------------------------
# Target selection


def pick_arch(capabilities: list[tuple[int, int]], nvrtc_supported: list[int] | None = None) -> str:
    """Choose the NVRTC target for a set of devices.

    One shared compute capability that NVRTC supports gives a cubin for it
    (no JIT at load). Otherwise PTX for the newest architecture NVRTC
    supports that is not above the lowest device, which every device's
    driver can JIT forward.
    """
    if not capabilities:
        raise ValueError("pick_arch needs at least one device compute capability")
    supported = sorted(nvrtc_supported_archs() if nvrtc_supported is None else nvrtc_supported)
    ccs = {major * 10 + minor for major, minor in capabilities}
    lowest = min(ccs)
    if len(ccs) == 1 and lowest in supported:
        return f"sm_{lowest}"
    usable = [cc for cc in supported if cc <= lowest]
    if not usable:
        raise ValueError(
            f"NVRTC supports architectures {supported}, none of which can run on "
            f"compute capability {lowest // 10}.{lowest % 10}"
        )
    return f"compute_{usable[-1]}"


# --------------------------------------------------------------------------
# Input normalisation


def _target_of(arch: str, target: str | None, language: str) -> str:
    """The target asked for, or the one ``arch`` implies (sm_XY: a cubin, compute_XY: PTX);
    ValueError for a combination no compiler makes."""
    if not isinstance(arch, str) or not _ARCH_RE.fullmatch(arch):
        raise ValueError(f"arch must look like 'sm_90' (cubin) or 'compute_90' (PTX), got {arch!r}")
    if language not in _DEFAULT_NAMES:
        raise ValueError(f"language must be one of {list(_DEFAULT_NAMES)}, got {language!r}")
    if target is None:
        target = "cubin" if arch.startswith("sm_") else "ptx"
    if target not in ("cubin", "ptx", "ltoir"):
        raise ValueError(f"target must be 'cubin', 'ptx' or 'ltoir', got {target!r}")
    if target == "cubin" and not arch.startswith("sm_"):
        raise ValueError(
            f"a cubin is code for a real architecture: arch='sm_{arch[8:]}', not "
            f"{arch!r} (compute_XY gives PTX)"
        )
    if language == "ptx" and target != "cubin":
        raise ValueError(
            f"PTX compiles to a cubin only (target='cubin'), not {target!r}: load "
            "PTX as it is (Library.from_bytes) or link it (Library.link)"
        )
    return target


def _normalize_options(options: Iterable[str | bytes]) -> tuple[bytes, ...]:
    if isinstance(options, (str, bytes)):
        raise TypeError("options must be a sequence of str or bytes, not a single string")
    out = []
    for opt in options:
        if isinstance(opt, str):
            opt = opt.encode()
        elif not isinstance(opt, bytes):
            raise TypeError(f"each option must be str or bytes, got {type(opt).__name__}: {opt!r}")
        if _ARCH_OPTION_RE.match(opt.decode(errors="replace")):
            raise ValueError(f"pass the target through arch=, not options ({opt!r})")
        out.append(opt)
    return tuple(out)


def _normalize_name_expressions(exprs: Iterable[str]) -> tuple[str, ...]:
    if isinstance(exprs, (str, bytes)):
        raise TypeError("name_expressions must be a sequence of str, not a single string")
    out = tuple(exprs)
    for expr in out:
        if not isinstance(expr, str):
            raise TypeError(
                f"each name expression must be str, got {type(expr).__name__}: {expr!r}"
            )
    return out


def _normalize_headers(headers: Mapping[str, str | bytes] | None) -> tuple[tuple[str, bytes], ...]:
    if headers is None:
        return ()
    if not isinstance(headers, Mapping):
        raise TypeError(
            f"headers must be a dict of include name -> source, got {type(headers).__name__}"
        )
    out = []
    for name, text in headers.items():
        if not isinstance(name, str):
            raise TypeError(f"header names must be str, got {type(name).__name__}: {name!r}")
        if isinstance(text, str):
            text = text.encode()
        elif not isinstance(text, bytes):
            raise TypeError(f"header {name!r} must be str or bytes, got {type(text).__name__}")
        out.append((name, text))
    return tuple(sorted(out))


# --------------------------------------------------------------------------
# Compilation


def compile_source(
    src: str | bytes,
    *,
    arch: str,
    target: Target | None = None,
    language: Language = "c++",
    relocatable: bool = False,
    options: Iterable[str | bytes] = (),
    name_expressions: Iterable[str] = (),
    headers: Mapping[str, str | bytes] | None = None,
    name: str | None = None,
    cache_dir: str | os.PathLike | Literal[False] | None = None,
) -> CompileResult:
    """Compile ``src`` for ``arch`` to ``target``: "cubin" (the default for "sm_XY"), "ptx"
    (the default for "compute_XY") or "ltoir" (LTO-IR, for `Library.link(..., lto=True)`).

    ``language``: "c++" (NVRTC; ``relocatable`` keeps device functions for a link, -rdc),
    "ptx" (to a cubin, through the linker: ``options`` are the linker's) or "nvvm" (NVVM IR
    through libNVVM, an optional package; ``options`` are libNVVM's). ``name_expressions``
    (e.g. ``"axpy<float>"``, C++ only) are resolved to mangled names in ``lowered_names``.
    ``headers`` maps include names to sources. ``cache_dir``: None -> $CUCTX_CACHE_DIR or
    the user cache dir; False or "" -> no cache. Raises CompileError with the compiler's log.
    """
    target = _target_of(arch, target, language)
    if name is None:
        name = _DEFAULT_NAMES[language]
    if not isinstance(name, str):
        raise TypeError(f"name must be str, got {type(name).__name__}")
    if language == "c++":
        if not isinstance(src, str):
            raise TypeError(f"C++ source must be str, got {type(src).__name__}")
        opts = _normalize_options(options)
        if relocatable or target == "ltoir":  # LTO-IR is for linking: device functions stay
            opts = (b"--relocatable-device-code=true", *(b"-dlto",) * (target == "ltoir"), *opts)
        request = Request(
            source=with_declarations(src, name).encode(),
            arch=arch,
            options=opts,
            name_expressions=_normalize_name_expressions(name_expressions),
            headers=_normalize_headers(headers),
            name=name,
        )
        return cached(
            cache_dir,
            lambda: ["nvrtc", list(nvrtc_version()), target, *request.key_material()],
            lambda: run_nvrtc(request, target),
        )
    if tuple(name_expressions) or headers:
        raise ValueError(f"name_expressions and headers are for C++ sources, not {language}")
    if relocatable:
        raise ValueError(f"relocatable is for C++ sources; {language} links as it is")
    code = _source_bytes(src, language)
    if language == "ptx":
        linker_options = _text_options(options)
        _jitlink.check_options(linker_options)
        piece = _jitlink.Piece("ptx", name, code)
        linker = _jitlink.linker_identity(False, (piece,))
        return cached(
            cache_dir,
            lambda: ["ptx", linker, arch, name, code.decode("latin-1"), list(linker_options)],
            lambda: _ptx_to_cubin(piece, arch, linker_options, linker),
        )
    nvvm_options = _text_options(options)
    if any(_ARCH_OPTION_RE.match(o) for o in nvvm_options):
        raise ValueError("pass the target through arch=, not options")
    return cached(
        cache_dir,
        lambda: [
            "nvvm",
            list(_nvvm.nvvm_version()),
            arch,
            target,
            name,
            code.decode("latin-1"),
            list(nvvm_options),
        ],
        lambda: _compile_nvvm(code, arch, target, nvvm_options, name),
    )


def _source_bytes(src: str | bytes, language: str) -> bytes:
    if isinstance(src, str):
        src = src.encode()
    if not isinstance(src, (bytes, bytearray, memoryview)):
        raise TypeError(f"{language} source must be str or bytes, got {type(src).__name__}")
    src = bytes(src)
    if language == "ptx":
        if not is_ptx(src):
            raise ValueError("language='ptx' takes PTX text (with .version and .target)")
        return src if src.endswith(b"\0") else src + b"\0"
    return src


def _text_options(options: Iterable[str | bytes]) -> tuple[str, ...]:
    return tuple(o.decode() for o in _normalize_options(options))


def _ptx_to_cubin(
    piece: _jitlink.Piece, arch: str, options: tuple[str, ...], linker: str
) -> CompileResult:
    image, log = _jitlink.link((piece,), arch=arch, lto=False, options=options, linker=linker)
    return CompileResult(
        image=image,
        kind="cubin",
        arch=arch,
        lowered_names={},
        log=log,
        from_cache=False,
        ptx=piece.data,
        name=piece.name,
    )


def _compile_nvvm(
    ir: bytes, arch: str, target: str, options: tuple[str, ...], name: str
) -> CompileResult:
    virtual = "compute_" + arch.split("_", 1)[1]  # libNVVM targets virtual architectures
    out, log = _nvvm.run_nvvm(ir, arch=virtual, options=options, name=name, lto=target == "ltoir")
    if target == "ltoir":
        return CompileResult(
            image=out,
            kind="ltoir",
            arch=arch,
            lowered_names={},
            log=log,
            from_cache=False,
            ptx=None,
            name=name,
        )
    ptx = out if out.endswith(b"\0") else out + b"\0"
    if target == "ptx":
        return CompileResult(
            image=ptx,
            kind="ptx",
            arch=arch,
            lowered_names={},
            log=log,
            from_cache=False,
            ptx=ptx,
            name=name,
        )
    piece = _jitlink.Piece("ptx", name, ptx)
    linked = _ptx_to_cubin(piece, arch, (), _jitlink.linker_identity(False, (piece,)))
    return CompileResult(
        image=linked.image,
        kind="cubin",
        arch=arch,
        lowered_names={},
        log="\n".join(filter(None, (log, linked.log))),
        from_cache=False,
        ptx=ptx,
        name=name,
    )


def cache_key(material: list) -> str:
    """SHA-256 of the format version and ``material`` as JSON (an unambiguous encoding)."""
    return hashlib.sha256(json.dumps([CACHE_FORMAT_VERSION, *material]).encode()).hexdigest()


def cached(cache_dir, material, build) -> CompileResult:
    """``build()``'s result, from the cache when an entry for ``material()`` is there (the
    key's material is asked for only when caching is on: it names the tool's version)."""
    directory = cache_directory(cache_dir)
    if directory is None:
        return build()
    parts = material()
    key = cache_key(parts)
    path = directory / f"{parts[0]}-{key}.bin"
    found = _load_entry(path, key)
    if found is not None:
        return found
    result = build()
    _store_entry(path, key, result)
    return result


# --------------------------------------------------------------------------
# Persistent cache


def cache_directory(cache_dir: str | os.PathLike | Literal[False] | None = None) -> Path | None:
    """Resolve where compile results are cached; None means caching is off."""
    if cache_dir is False:
        return None
    if cache_dir is None:
        env = os.environ.get("CUCTX_CACHE_DIR")
        if env is not None:
            return Path(env) if env else None
        xdg = os.environ.get("XDG_CACHE_HOME")
        base = Path(xdg) if xdg else Path.home() / ".cache"
        return base / "cuctx"
    if not isinstance(cache_dir, (str, os.PathLike)):
        raise TypeError(f"cache_dir must be a path, None or False, got {type(cache_dir).__name__}")
    return Path(cache_dir) if os.fspath(cache_dir) else None
