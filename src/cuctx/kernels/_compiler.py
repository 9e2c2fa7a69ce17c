"""Runtime compilation of CUDA C++ with NVRTC, backed by a persistent cache.

NVRTC is loaded lazily so that importing this module never requires it.
See docs/compiler.md for the cache design.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ._compile_cache import (CACHE_FORMAT_VERSION, CacheWarning, CompileResult, _load_entry,
                             _store_entry)

__all__ = [
    "CacheWarning",
    "CompileError",
    "CompileResult",
    "cache_directory",
    "compile_source",
    "nvrtc_supported_archs",
    "nvrtc_version",
    "pick_arch",
]

_ENTRY_PREFIX = "nvrtc-"
_ENTRY_SUFFIX = ".bin"

_ARCH_RE = re.compile(r"(?:sm|compute)_\d+[af]?")
# The target comes from `arch`; a second one in `options` would silently win
# (NVRTC only warns), so it is rejected instead.
_ARCH_OPTION_RE = re.compile(r"(-arch|--gpu-architecture)(=|\s|$)")

# A kernel that sets a graph's condition calls cudaGraphSetConditional, a device-runtime
# builtin whose declaration comes with the runtime's headers, which NVRTC programs do not
# include; declared as below (as cuda.core's tests do), the driver resolves the call when it
# loads the code, with no nvcc nor device runtime to link. Sources that declare it themselves
# are left alone.
_SETS_CONDITION_RE = re.compile(r"\bcudaGraphSetConditional\b")
_DECLARES_SET_CONDITIONAL_RE = re.compile(r"\bvoid\s+(?:CUDARTAPI\s+)?cudaGraphSetConditional\s*\(")
_SET_CONDITIONAL_DECLARATION = (
    "typedef __device_builtin__ unsigned long long cudaGraphConditionalHandle;\n"
    'extern "C" __device__ __cudart_builtin__ void CUDARTAPI cudaGraphSetConditional('
    "cudaGraphConditionalHandle, unsigned int);\n")


class CompileError(Exception):
    """NVRTC failed; ``log`` holds NVRTC's full program log."""

    def __init__(self, message: str, *, log: str, options: tuple[str, ...], name: str):
        self.log = log
        self.options = options
        self.name = name
        super().__init__(f"{message}\nNVRTC options: {list(options)}\n{log}")


# --------------------------------------------------------------------------
# NVRTC access


def _nvrtc():
    try:
        from cuda.bindings import nvrtc
    except ImportError as exc:
        raise RuntimeError(
            f"NVRTC is unavailable: cuda.bindings cannot be imported ({exc})"
        ) from exc
    return nvrtc


def nvrtc_version() -> tuple[int, int]:
    """(major, minor) of the loaded NVRTC; RuntimeError if it cannot be loaded."""
    nvrtc = _nvrtc()
    try:
        err, major, minor = nvrtc.nvrtcVersion()
    except (RuntimeError, OSError) as exc:
        # cuda.bindings dlopens libnvrtc on first call, not on import.
        raise RuntimeError(f"NVRTC is unavailable: {exc}") from exc
    _check(err, "nvrtcVersion")
    return major, minor


def nvrtc_supported_archs() -> list[int]:
    """Compute capabilities NVRTC can target, as ints (sm_90 -> 90)."""
    nvrtc_version()
    err, archs = _nvrtc().nvrtcGetSupportedArchs()
    _check(err, "nvrtcGetSupportedArchs")
    return sorted(archs)


def _check(err, what: str) -> None:
    if err != _nvrtc().nvrtcResult.NVRTC_SUCCESS:
        raise RuntimeError(f"{what} failed: {_err_name(err)}")


def _err_name(err) -> str:
    _, text = _nvrtc().nvrtcGetErrorString(err)
    return text.decode()


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


def _kind_of(arch: str) -> Literal["cubin", "ptx"]:
    if not isinstance(arch, str) or not _ARCH_RE.fullmatch(arch):
        raise ValueError(f"arch must look like 'sm_90' (cubin) or 'compute_90' (PTX), got {arch!r}")
    return "cubin" if arch.startswith("sm_") else "ptx"


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


_NAME_LENGTH = re.compile(r"[1-9][0-9]*")  # of a name in a mangled name


def declared_name(mangled: str) -> tuple[str, bool] | None:
    """The name a mangled C++ kernel was declared with, and whether it is a template
    instance: ``_Z8cpp_namePf`` -> ("cpp_name", False), ``_ZN2ns4tmplIfEEvPT_`` ->
    ("ns::tmpl", True). None for other names (extern "C" ones)."""
    if not mangled.startswith("_Z"):
        return None
    nested = mangled.startswith("_ZN")
    parts, i = [], 3 if nested else 2
    while (length := _NAME_LENGTH.match(mangled, i)) is not None:
        i = length.end() + int(length.group())
        parts.append(mangled[length.end():i])
        if not nested:
            break
    return ("::".join(parts), mangled[i:i + 1] == "I") if parts else None


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


@dataclass(frozen=True)
class _Request:
    source: bytes
    arch: str
    options: tuple[bytes, ...]
    name_expressions: tuple[str, ...]
    headers: tuple[tuple[str, bytes], ...]
    name: str

    def nvrtc_options(self) -> list[bytes]:
        return [f"--gpu-architecture={self.arch}".encode(), *self.options]

    def cache_key(self, version: tuple[int, int]) -> str:
        # JSON of nested lists is an unambiguous encoding; latin-1 maps bytes
        # 1:1 onto code points so arbitrary bytes survive it.
        material = json.dumps(
            [
                CACHE_FORMAT_VERSION,
                list(version),
                self.arch,
                self.name,
                self.source.decode("latin-1"),
                [[n, t.decode("latin-1")] for n, t in self.headers],
                [o.decode("latin-1") for o in self.options],
                list(self.name_expressions),
            ]
        )
        return hashlib.sha256(material.encode()).hexdigest()


def compile_source(
    src: str,
    *,
    arch: str,
    options: Iterable[str | bytes] = (),
    name_expressions: Iterable[str] = (),
    headers: Mapping[str, str | bytes] | None = None,
    name: str = "cuctx_kernel.cu",
    cache_dir: str | os.PathLike | Literal[False] | None = None,
) -> CompileResult:
    """Compile CUDA C++ ``src`` for ``arch`` ("sm_XY" -> cubin, "compute_XY" -> PTX).

    ``name_expressions`` (e.g. ``"axpy<float>"``) are resolved to mangled
    names in ``lowered_names``. ``headers`` maps include names to sources.
    ``cache_dir``: None -> $CUCTX_CACHE_DIR or the user cache dir; False or
    "" -> no cache. Raises CompileError when NVRTC fails.
    """
    if not isinstance(src, str):
        raise TypeError(f"src must be str, got {type(src).__name__}")
    if not isinstance(name, str):
        raise TypeError(f"name must be str, got {type(name).__name__}")
    kind = _kind_of(arch)
    request = _Request(
        source=_with_declarations(src, name).encode(),
        arch=arch,
        options=_normalize_options(options),
        name_expressions=_normalize_name_expressions(name_expressions),
        headers=_normalize_headers(headers),
        name=name,
    )
    directory = cache_directory(cache_dir)
    if directory is None:
        return _run_nvrtc(request, kind)
    key = request.cache_key(nvrtc_version())
    path = directory / f"{_ENTRY_PREFIX}{key}{_ENTRY_SUFFIX}"
    cached = _load_entry(path, key)
    if cached is not None:
        return cached
    result = _run_nvrtc(request, kind)
    _store_entry(path, key, result)
    return result


def _with_declarations(src: str, name: str) -> str:
    """``src`` with the declarations NVRTC lacks for what it calls (see
    `_SET_CONDITIONAL_DECLARATION`); a #line directive keeps NVRTC's messages on the user's
    own lines."""
    if not _SETS_CONDITION_RE.search(src) or _DECLARES_SET_CONDITIONAL_RE.search(src):
        return src
    quoted = name.replace("\\", "\\\\").replace('"', '\\"')
    return f'{_SET_CONDITIONAL_DECLARATION}#line 1 "{quoted}"\n{src}'


def _run_nvrtc(request: _Request, kind: Literal["cubin", "ptx"]) -> CompileResult:
    nvrtc = _nvrtc()
    nvrtc_version()  # turns a missing libnvrtc into a clear RuntimeError up front
    err, prog = nvrtc.nvrtcCreateProgram(
        request.source,
        request.name.encode(),
        len(request.headers),
        [text for _, text in request.headers],
        [n.encode() for n, _ in request.headers],
    )
    _check(err, "nvrtcCreateProgram")
    try:
        return _compile_program(nvrtc, prog, request, kind)
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def _compile_program(
    nvrtc, prog, request: _Request, kind: Literal["cubin", "ptx"]
) -> CompileResult:
    shown_options = tuple(o.decode(errors="replace") for o in request.nvrtc_options())

    def fail(message: str) -> CompileError:
        return CompileError(
            message, log=_program_log(nvrtc, prog), options=shown_options, name=request.name
        )

    for expr in request.name_expressions:
        (err,) = nvrtc.nvrtcAddNameExpression(prog, expr.encode())
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise fail(f"NVRTC rejected name expression {expr!r}: {_err_name(err)}")
    opts = request.nvrtc_options()
    (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise fail(f"NVRTC failed to compile {request.name!r} for {request.arch}: {_err_name(err)}")
    lowered = {}
    for expr in request.name_expressions:
        err, mangled = nvrtc.nvrtcGetLoweredName(prog, expr.encode())
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise fail(f"NVRTC could not lower name expression {expr!r}: {_err_name(err)}")
        lowered[expr] = mangled.decode()
    ptx = _ptx_of(nvrtc, prog)
    if kind == "cubin":
        image = _read_buffer(nvrtc.nvrtcGetCUBINSize, nvrtc.nvrtcGetCUBIN, prog)
    elif ptx is None:
        raise fail(f"NVRTC produced no PTX for {request.arch}")
    else:
        image = ptx
    return CompileResult(
        image=image,
        kind=kind,
        arch=request.arch,
        lowered_names=lowered,
        log=_program_log(nvrtc, prog),
        from_cache=False,
        ptx=ptx,
    )


def _ptx_of(nvrtc, prog) -> bytes | None:
    """The program's PTX, which NVRTC keeps beside a cubin too; None when it has none
    (with -dlto it holds LTO IR instead)."""
    try:
        ptx = _read_buffer(nvrtc.nvrtcGetPTXSize, nvrtc.nvrtcGetPTX, prog)
    except RuntimeError:
        return None
    return ptx if ptx.rstrip(b"\0") else None


def _read_buffer(get_size, get_data, prog) -> bytes:
    err, size = get_size(prog)
    _check(err, get_size.__name__)
    # A fresh bytearray, never `b" " * size`: for size 1 that expression is
    # CPython's shared one-byte b" " object, and NVRTC writing into it would
    # corrupt every b" " in the interpreter.
    buf = bytearray(size)
    (err,) = get_data(prog, buf)
    _check(err, get_data.__name__)
    return bytes(buf)


def _program_log(nvrtc, prog) -> str:
    text = _read_buffer(nvrtc.nvrtcGetProgramLogSize, nvrtc.nvrtcGetProgramLog, prog)
    return text.rstrip(b"\0").decode(errors="replace")


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
