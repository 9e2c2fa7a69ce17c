"""NVRTC: CUDA C++ to a cubin, PTX or LTO-IR (cuda.bindings.nvrtc, loaded on first use, so
importing cuctx never needs it). `cuctx.kernels._compiler.compile_source` is the entry that
caches; this module runs one compilation."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ._compile_cache import CompileResult


class CompileError(Exception):
    """A compiler (NVRTC, libNVVM) failed; ``log`` holds its full program log."""

    def __init__(
        self, message: str, *, log: str, options: tuple[str, ...], name: str, tool: str = "NVRTC"
    ):
        self.log = log
        self.options = options
        self.name = name
        super().__init__(f"{message}\n{tool} options: {list(options)}\n{log}")


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
    "cudaGraphConditionalHandle, unsigned int);\n"
)


# -- NVRTC access -------------------------------------------------------------------------


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


# -- one compilation ----------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    """One NVRTC compilation, normalised (`compile_source` builds it)."""

    source: bytes
    arch: str
    options: tuple[bytes, ...]
    name_expressions: tuple[str, ...]
    headers: tuple[tuple[str, bytes], ...]
    name: str

    def nvrtc_options(self) -> list[bytes]:
        return [f"--gpu-architecture={self.arch}".encode(), *self.options]

    def key_material(self) -> list:
        """What the cache key covers of the request (latin-1 maps bytes 1:1 onto code
        points, so arbitrary bytes survive JSON)."""
        return [
            self.arch,
            self.name,
            self.source.decode("latin-1"),
            [[n, t.decode("latin-1")] for n, t in self.headers],
            [o.decode("latin-1") for o in self.options],
            list(self.name_expressions),
        ]


def with_declarations(src: str, name: str) -> str:
    """``src`` with the declarations NVRTC lacks for what it calls (see
    `_SET_CONDITIONAL_DECLARATION`); a #line directive keeps NVRTC's messages on the user's
    own lines."""
    if not _SETS_CONDITION_RE.search(src) or _DECLARES_SET_CONDITIONAL_RE.search(src):
        return src
    quoted = name.replace("\\", "\\\\").replace('"', '\\"')
    return f'{_SET_CONDITIONAL_DECLARATION}#line 1 "{quoted}"\n{src}'


def run_nvrtc(request: Request, kind: str) -> CompileResult:
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


def _compile_program(nvrtc, prog, request: Request, kind: str) -> CompileResult:
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
    elif kind == "ltoir":
        image = _read_buffer(nvrtc.nvrtcGetLTOIRSize, nvrtc.nvrtcGetLTOIR, prog)
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
        name=request.name,
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
