"""The one reader of loadable images: `read_image` parses a cubin or PTX into an `Image`
(the sim loads images from it), `kernel_layouts` gives the parameter layouts alone."""

from __future__ import annotations

from ._elf import read_cubin
from ._kinds import is_cubin, is_fatbin, is_ptx
from ._layout import Image, KernelInfo
from ._ptx import read_ptx


def read_image(data: bytes | str) -> Image:
    """The parsed image; ValueError for a malformed one, a fatbin or anything else."""
    if isinstance(data, str):
        return read_ptx(data)
    if is_cubin(data):
        return read_cubin(data)
    if is_fatbin(data):
        raise ValueError("fatbin images are not parsed for kernel layouts; pass a cubin or PTX")
    if is_ptx(data):
        return read_ptx(data)
    raise ValueError("unrecognised image: neither a cubin, a fatbin nor PTX")


def kernel_layouts(image: bytes | str) -> dict[str, KernelInfo]:
    """Layouts from a cubin or PTX image; ValueError for anything else (fatbins included)."""
    return {name: kernel.info for name, kernel in read_image(image).kernels.items()}
