"""Everything from source text to a launch: the compilers and their cache (NVRTC, libNVVM),
the linkers (nvJitLink, the driver's), libraries and modules and their kernels, the checking
and packing of arguments by a launch plan, launch configurations, and the launchers with
their generated fast paths. See docs/kernels.md and docs/compiler.md."""

from __future__ import annotations

from ._args import KernelArgumentError
from ._compiler import CompileError, CompileResult, compile_source
from ._launch_config import LaunchConfigError
from ._launcher import Launcher
from ._jitlink import LinkError
from ._library import BlockSizeSuggestion, Kernel, KernelAttributes, Library
from ._module import Module

__all__ = [
    "BlockSizeSuggestion",
    "CompileError",
    "CompileResult",
    "Kernel",
    "KernelArgumentError",
    "KernelAttributes",
    "LaunchConfigError",
    "Launcher",
    "Library",
    "LinkError",
    "Module",
    "compile_source",
]
