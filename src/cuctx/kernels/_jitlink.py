"""The linkers: nvJitLink (cuda.bindings.nvjitlink; its library comes with the
`nvidia-nvjitlink` wheel, or a CUDA toolkit) or, where it is missing and the link needs no
link-time optimisation, the driver's own (cuLinkCreate, cuLinkAddData, cuLinkComplete).

One `link` call turns `Piece`s (device code of a known kind, with a name) into a cubin (or,
with LTO, PTX). `cuctx.kernels._link` decides what the pieces are and caches the result;
`compile_source` uses it for PTX -> cubin."""

from __future__ import annotations

import ctypes
import re
from dataclasses import dataclass
from functools import lru_cache

from .. import _driver
from .._calls import fail
from ..context import context_for, in_context
from ..devcode._mangled import declared_name

# How to get nvJitLink, in every message that needs it.
INSTALL = (
    'pip install "nvidia-nvjitlink>=13,<14" (or cuctx[link]); a CUDA toolkit\'s '
    "libnvJitLink is found too"
)

_ARCH_OPTION_RE = re.compile(r"-+(arch|gpu-architecture)\b")
_UNRESOLVED_RE = re.compile(r"(?:Undefined reference to|[Uu]nresolved extern function) '([^']+)'")
_LOG_BYTES = 1 << 16  # the driver linker's log buffers


@dataclass(frozen=True)
class Piece:
    """Device code to link: its kind (`cuctx.devcode._kinds.KINDS`), the name its errors use,
    its bytes, and the C++ it was compiled from where cuctx compiled it (an error names the
    pieces that use a missing symbol; LTO-IR does not spell the names it uses)."""

    kind: str
    name: str
    data: bytes
    source: str = ""

    def uses(self, symbol: str) -> bool:
        declared = declared_name(symbol)
        plain = declared[0].rpartition("::")[2] if declared else symbol
        return symbol.encode() in self.data or bool(
            self.source and re.search(rf"\b{re.escape(plain)}\s*\(", self.source)
        )

    def describe(self) -> str:
        return f"{self.name!r} ({_KIND_WORDS[self.kind]}, {len(self.data)} bytes)"


_KIND_WORDS = {
    "cubin": "cubin",
    "fatbin": "fatbin",
    "ptx": "PTX",
    "ltoir": "LTO-IR",
    "object": "host object",
    "library": "library",
    "nvvm": "NVVM IR",
}


class LinkError(RuntimeError):
    """The linker refused the pieces: ``log`` is its error log, ``pieces`` the names of what
    was linked, ``linker`` "nvJitLink" or "driver"."""

    def __init__(self, message: str, *, log: str, pieces: tuple[str, ...], linker: str):
        self.log = log
        self.pieces = pieces
        self.linker = linker
        super().__init__(f"{message}\n{linker} log:\n{log}" if log else message)


@lru_cache(maxsize=1)
def _nvjitlink():
    """cuda.bindings.nvjitlink with its library loaded, or the reason it cannot be."""
    try:
        from cuda.bindings import nvjitlink

        nvjitlink.version()  # loads libnvJitLink (cuda.pathfinder finds wheels and toolkits)
    except Exception as exc:  # noqa: BLE001 - ImportError, or the library's loader's error
        return None, f"{type(exc).__name__}: {exc}"
    return nvjitlink, None


def nvjitlink_version() -> tuple[int, int] | None:
    """(major, minor) of the nvJitLink cuctx links with; None where it cannot be loaded."""
    module, _ = _nvjitlink()
    return None if module is None else tuple(module.version())


def linker_identity(lto: bool, pieces: tuple[Piece, ...]) -> str:
    """Which linker a link of ``pieces`` uses, with its version ("nvJitLink 13.5" or
    "driver 13000": part of the cache key): nvJitLink where it loads; else the driver's,
    which takes no LTO-IR (from CUDA 12 on) and does no link-time optimisation, so such a
    link names the package to install."""
    version = nvjitlink_version()
    if version is not None:
        return f"nvJitLink {version[0]}.{version[1]}"
    needs = (
        "link-time optimisation (lto=True)"
        if lto
        else next((f"the LTO-IR piece {p.name!r}" for p in pieces if p.kind == "ltoir"), None)
    )
    if needs is not None:
        raise RuntimeError(
            f"{needs} needs nvJitLink, which cannot be loaded ({_nvjitlink()[1]}); {INSTALL}"
        )
    backend = _driver.active()
    err, version = backend.driver.cuDriverGetVersion()
    if err:
        fail(backend, err, "cuDriverGetVersion")
    return f"driver {version}"


def check_options(options: tuple[str, ...]) -> None:
    for option in options:
        if not isinstance(option, str):
            raise TypeError(
                f"each linker option must be str, got {type(option).__name__}: {option!r}"
            )
        if _ARCH_OPTION_RE.match(option):
            raise ValueError(f"pass the target through arch=, not options ({option!r})")
        if option in ("-lto", "-ptx"):
            raise ValueError(
                f"{option!r}: ask for link-time optimisation with lto=True (PTX "
                "comes out of an LTO link for a compute_XY arch)"
            )


def link(
    pieces: tuple[Piece, ...], *, arch: str, lto: bool, options: tuple[str, ...], linker: str
) -> tuple[bytes, str]:
    """With ``linker`` as `linker_identity` named it: the linked image (a cubin; PTX for an
    LTO link to a ``compute_XY`` arch) and the linker's info log. Raises `LinkError` with
    the linker's log and the pieces named."""
    if linker.startswith("driver"):
        return _link_with_driver(pieces, arch, options)
    return _link_with_nvjitlink(pieces, arch, lto, options)


def _failure(what: str, pieces: tuple[Piece, ...], log: str, linker: str) -> LinkError:
    """The error of a refused link: what failed, each unresolved symbol with the pieces that
    refer to it (their bytes name it; none defines it), and the pieces linked."""
    lines = [what]
    for symbol in dict.fromkeys(_UNRESOLVED_RE.findall(log)):
        users = " and ".join(repr(p.name) for p in pieces if p.uses(symbol))
        declared = declared_name(symbol)
        lines.append(
            f"{symbol}{f' ({declared[0]})' if declared else ''} is used "
            f"{f'by {users} ' if users else ''}and defined by no piece: add the piece "
            "that defines it (a source compiled as relocatable device code keeps its "
            "device functions)"
        )
    lines.append("pieces: " + ", ".join(p.describe() for p in pieces))
    return LinkError("\n".join(lines), log=log, pieces=tuple(p.name for p in pieces), linker=linker)


def _link_with_nvjitlink(pieces, arch, lto, options) -> tuple[bytes, str]:
    nvjitlink, _ = _nvjitlink()
    ptx_out = lto and arch.startswith("compute_")
    flags = [
        f"-arch={'sm_' + arch[8:] if ptx_out else arch}",
        *(["-lto"] if lto else []),
        *(["-ptx"] if ptx_out else []),
        *options,
    ]
    try:
        handle = nvjitlink.create(len(flags), flags)
    except nvjitlink.nvJitLinkError as exc:
        raise LinkError(
            f"nvJitLink refused the options {flags}: {exc}",
            log="",
            pieces=tuple(p.name for p in pieces),
            linker="nvJitLink",
        ) from None
    types = nvjitlink.InputType
    kinds = {
        "cubin": types.CUBIN,
        "ptx": types.PTX,
        "ltoir": types.LTOIR,
        "fatbin": types.FATBIN,
        "object": types.OBJECT,
        "library": types.LIBRARY,
    }

    def log_of(get_size, get) -> str:
        buf = bytearray(get_size(handle))
        get(handle, buf)
        return buf.rstrip(b"\0").decode(errors="replace")

    try:
        piece = None
        try:
            for piece in pieces:
                nvjitlink.add_data(
                    handle, kinds[piece.kind], piece.data, len(piece.data), piece.name
                )
            piece = None
            nvjitlink.complete(handle)
        except nvjitlink.nvJitLinkError as exc:
            log = log_of(nvjitlink.get_error_log_size, nvjitlink.get_error_log)
            what = (
                f"nvJitLink refused the piece {piece.describe()}: {exc}"
                if piece
                else f"nvJitLink could not link the pieces for {arch}: {exc}"
            )
            raise _failure(what, pieces, log, "nvJitLink") from None
        get_size, get = (
            (nvjitlink.get_linked_ptx_size, nvjitlink.get_linked_ptx)
            if ptx_out
            else (nvjitlink.get_linked_cubin_size, nvjitlink.get_linked_cubin)
        )
        image = bytearray(get_size(handle))
        get(handle, image)
        return bytes(image), log_of(nvjitlink.get_info_log_size, nvjitlink.get_info_log)
    finally:
        nvjitlink.destroy(handle)


# The options the driver's linker takes, as nvJitLink spells them: -O<n>, -maxrregcount=<n>,
# -g, -lineinfo, -verbose.
_DRIVER_OPTION_RE = re.compile(r"-O(\d)|-maxrregcount=(\d+)|(-g)|(-lineinfo)|(-verbose)")


def _driver_options(arch: str, options: tuple[str, ...]):
    """(options, values, info log, error log) for cuLinkCreate."""
    from cuda.bindings.driver import CUjit_option as O, CUjit_target

    info, errors = bytearray(_LOG_BYTES), bytearray(_LOG_BYTES)
    keys = [
        O.CU_JIT_INFO_LOG_BUFFER,
        O.CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
        O.CU_JIT_ERROR_LOG_BUFFER,
        O.CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
    ]
    values: list = [info, _LOG_BYTES, errors, _LOG_BYTES]
    target = getattr(CUjit_target, f"CU_TARGET_COMPUTE_{arch.split('_')[1].upper()}", None)
    if target is None:
        raise ValueError(f"the driver's linker has no target for arch={arch!r}")
    keys.append(O.CU_JIT_TARGET)
    values.append(target)
    for option in options:
        found = _DRIVER_OPTION_RE.fullmatch(option)
        if found is None:
            raise ValueError(
                f"the driver's linker (used because nvJitLink cannot be loaded) "
                f"takes -O<n>, -maxrregcount=<n>, -g, -lineinfo and -verbose, "
                f"not {option!r}; for it, {INSTALL}"
            )
        level, registers, debug, lines, verbose = found.groups()
        key, value = (
            (O.CU_JIT_OPTIMIZATION_LEVEL, int(level))
            if level
            else (O.CU_JIT_MAX_REGISTERS, int(registers))
            if registers
            else (O.CU_JIT_GENERATE_DEBUG_INFO, 1)
            if debug
            else (O.CU_JIT_GENERATE_LINE_INFO, 1)
            if lines
            else (O.CU_JIT_LOG_VERBOSE, 1)
        )
        keys.append(key)
        values.append(value)
    return keys, values, info, errors


def _link_with_driver(pieces, arch, options) -> tuple[bytes, str]:
    from cuda.bindings.driver import CUjitInputType as T

    kinds = {
        "cubin": T.CU_JIT_INPUT_CUBIN,
        "ptx": T.CU_JIT_INPUT_PTX,
        "fatbin": T.CU_JIT_INPUT_FATBINARY,
        "object": T.CU_JIT_INPUT_OBJECT,
        "library": T.CU_JIT_INPUT_LIBRARY,
    }
    keys, values, info, errors = _driver_options(arch, options)
    backend = _driver.active()
    drv = backend.driver
    ctx = context_for()  # the driver links in a context (INVALID_CONTEXT without one)

    def text(buf: bytearray) -> str:
        return bytes(buf).split(b"\0", 1)[0].decode(errors="replace")

    with in_context(ctx, "Library.link"):
        err, state = drv.cuLinkCreate(len(keys), keys, values)
        if err:
            fail(
                backend,
                err,
                "cuLinkCreate",
                ctx,
                hint=f"the driver's linker is unavailable; nvJitLink links without it: {INSTALL}",
            )
        try:
            for piece in pieces:
                (err,) = drv.cuLinkAddData(
                    state,
                    kinds[piece.kind],
                    piece.data,
                    len(piece.data),
                    piece.name.encode(),
                    0,
                    None,
                    None,
                )
                if err:
                    raise _failure(
                        f"the driver's linker refused the piece {piece.describe()}: {err.name}",
                        pieces,
                        text(errors),
                        "driver",
                    )
            err, address, size = drv.cuLinkComplete(state)
            if err:
                raise _failure(
                    f"the driver's linker could not link the pieces for {arch}: {err.name}",
                    pieces,
                    text(errors),
                    "driver",
                )
            image = ctypes.string_at(int(address), int(size))  # the state owns it: copy now
        finally:
            drv.cuLinkDestroy(state)
    return image, text(info)
