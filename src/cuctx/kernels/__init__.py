"""Everything from source text to a launch: the compiler and its cache (NVRTC), the readers
of CUDA images (cubin, PTX), libraries and modules and their kernels, the checking and
packing of arguments by a launch plan, launch configurations, and the launchers with their
generated fast paths. See docs/kernels.md and docs/compiler.md."""

from __future__ import annotations

from ._args import KernelArgumentError
from ._compiler import CompileError
from ._launch_config import LaunchConfigError
from ._launcher import Launcher
from ._library import BlockSizeSuggestion, Kernel, KernelAttributes, Library, Module

__all__ = ["BlockSizeSuggestion", "CompileError", "Kernel", "KernelArgumentError",
           "KernelAttributes", "LaunchConfigError", "Launcher", "Library", "Module"]
