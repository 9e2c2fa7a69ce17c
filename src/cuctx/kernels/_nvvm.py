"""libNVVM: NVVM IR (LLVM bitcode or its text, as Numba and other compilers write it) to PTX
or LTO-IR, through cuda.bindings.nvvm. libNVVM is optional: it comes with the `nvidia-nvvm`
wheel (or a CUDA toolkit's nvvm/lib64), found by cuda.pathfinder on first use."""

from __future__ import annotations

from functools import lru_cache

from ._nvrtc import CompileError

INSTALL = (
    'pip install "nvidia-nvvm>=13,<14" (or cuctx[link]); a CUDA toolkit\'s libnvvm is found too'
)


@lru_cache(maxsize=1)
def _nvvm():
    """cuda.bindings.nvvm with libNVVM loaded, or the reason it cannot be."""
    try:
        from cuda.bindings import nvvm

        nvvm.version()  # loads libnvvm
    except Exception as exc:  # noqa: BLE001 - ImportError, or the library's loader's error
        return None, f"{type(exc).__name__}: {exc}"
    return nvvm, None


def nvvm_version() -> tuple[int, int]:
    """(major, minor) of libNVVM; RuntimeError naming the package where it cannot load."""
    nvvm, why = _nvvm()
    if nvvm is None:
        raise RuntimeError(f"NVVM IR needs libNVVM, which cannot be loaded ({why}); {INSTALL}")
    return tuple(nvvm.version())


def run_nvvm(
    ir: bytes, *, arch: str, options: tuple[str, ...], name: str, lto: bool
) -> tuple[bytes, str]:
    """(PTX, or LTO-IR with ``lto``; the program log) of one NVVM IR module for ``arch``
    (``compute_XY``: libNVVM targets virtual architectures)."""
    nvvm_version()
    nvvm, _ = _nvvm()
    flags = [f"-arch={arch}", *(["-gen-lto"] if lto else []), *options]
    program = nvvm.create_program()

    def log() -> str:
        buf = bytearray(nvvm.get_program_log_size(program))
        nvvm.get_program_log(program, buf)
        return buf.rstrip(b"\0").decode(errors="replace")

    try:
        try:
            nvvm.add_module_to_program(program, ir, len(ir), name)
            nvvm.compile_program(program, len(flags), flags)
        except nvvm.nvvmError as exc:
            raise CompileError(
                f"libNVVM failed to compile {name!r} for {arch}: {exc}",
                log=log(),
                options=tuple(flags),
                name=name,
                tool="libNVVM",
            ) from None
        out = bytearray(nvvm.get_compiled_result_size(program))
        nvvm.get_compiled_result(program, out)
        return bytes(out), log()
    finally:
        nvvm.destroy_program(program)
