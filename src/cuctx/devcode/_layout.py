"""What a parsed image holds: its kernels with their parameter layouts and resources, and its
variables (`cuctx.devcode._image.read_image` makes one)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Param:
    index: int
    offset: int
    size: int


@dataclass(frozen=True)
class KernelInfo:
    name: str
    params: tuple[Param, ...]
    param_size: int


@dataclass
class KernelImage:
    """One kernel as its image describes it (PTX gives the layout only)."""

    info: KernelInfo
    regs: int = 0
    shared: int = 0  # static shared memory, bytes
    local: int = 0  # local memory per thread, bytes
    max_threads: int = 1024  # from __launch_bounds__


@dataclass
class Image:
    """A parsed cubin or PTX image."""

    kind: str  # "cubin" or "ptx"
    arch: int  # e.g. 90
    ptx_version: int
    kernels: dict[str, KernelImage]
    variables: dict[str, bytes]  # __device__ / __constant__: name -> initial bytes
    managed: dict[str, bytes]  # __managed__: name -> initial bytes
    const_size: int = 0  # bytes of __constant__ variables
