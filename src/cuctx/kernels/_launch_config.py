"""Launch configurations: grid, block, dynamic shared memory, clusters and cooperative
launches as a `Config`, checked against the device's and the kernel's limits before the
driver sees them (`validate`), and the driver's `CUlaunchConfig` for the launches that need
`cuLaunchKernelEx`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
from cuda.bindings.driver import CUlaunchAttribute, CUlaunchAttributeID, CUlaunchConfig, CUstream

if TYPE_CHECKING:
    from ._kernel import Kernel, _Limits
    from ..device import Device
    from ..stream import Stream

PORTABLE_CLUSTER = 8  # blocks per cluster every cluster-capable GPU runs


class LaunchConfigError(ValueError):
    """A launch configuration the device or kernel cannot run: names the limit and value."""


Dim3 = tuple[int, int, int]


def dim3(value: Any, what: str) -> Dim3:
    """(x, y, z) from an int or a sequence of 1 to 3 ints, each at least 1."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        dims = (int(value),)
    elif (
        isinstance(value, (tuple, list))
        and 1 <= len(value) <= 3
        and all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in value)
    ):
        dims = tuple(int(v) for v in value)
    else:
        raise LaunchConfigError(f"{what} must be an int or a tuple of 1 to 3 ints, got {value!r}")
    dims = dims + (1,) * (3 - len(dims))
    for axis, n in zip("xyz", dims):
        if n < 1:
            raise LaunchConfigError(f"{what}.{axis} is {n}; every dimension must be at least 1")
    return dims


class Config(NamedTuple):
    grid: Dim3
    block: Dim3
    shared_mem: int
    cluster: Dim3 | None
    cooperative: bool


def make_config(grid: Any, block: Any, shared_mem: Any, cluster: Any, cooperative: bool) -> Config:
    """A `Config` from what the user wrote; malformed values raise `LaunchConfigError`."""
    if isinstance(shared_mem, bool) or not isinstance(shared_mem, (int, np.integer)):
        raise LaunchConfigError(
            f"shared_mem must be an int (bytes of dynamic shared memory), got {shared_mem!r}"
        )
    return Config(
        dim3(grid, "grid"),
        dim3(block, "block"),
        int(shared_mem),
        None if cluster is None else dim3(cluster, "cluster"),
        bool(cooperative),
    )


def validate(kernel: Kernel, device: Device, config: Config) -> None:
    """Check ``config`` against the device's and the kernel's limits; raise
    `LaunchConfigError` naming the first one exceeded. Raises the kernel's dynamic shared
    memory limit (the attribute) when more than 48 KiB is asked for and the device allows it."""
    p = device.properties
    grid, block, shared = config.grid, config.block, config.shared_mem
    for axis, n, limit in zip("xyz", grid, (p.max_grid_dim_x, p.max_grid_dim_y, p.max_grid_dim_z)):
        if n > limit:
            raise LaunchConfigError(
                f"grid.{axis} = {n} exceeds the device's limit of {limit} "
                f"(max_grid_dim_{axis} of {device!r})"
            )
    for axis, n, limit in zip(
        "xyz", block, (p.max_block_dim_x, p.max_block_dim_y, p.max_block_dim_z)
    ):
        if n > limit:
            raise LaunchConfigError(
                f"block.{axis} = {n} exceeds the device's limit of {limit} "
                f"(max_block_dim_{axis} of {device!r})"
            )
    threads = block[0] * block[1] * block[2]
    if threads > p.max_threads_per_block:
        raise LaunchConfigError(
            f"a block of {block} is {threads} threads; the device runs at "
            f"most {p.max_threads_per_block} threads per block"
        )
    limits = kernel._limits(device)
    if threads > limits.max_threads:
        raise LaunchConfigError(
            f"kernel {kernel.name!r} can run at most {limits.max_threads} threads per block on "
            f"{device!r} (its registers or __launch_bounds__); the block {block} has {threads}"
        )
    if not isinstance(shared, (int, np.integer)) or isinstance(shared, bool) or shared < 0:
        raise LaunchConfigError(f"shared_mem must be a number of bytes >= 0, got {shared!r}")
    _check_shared(kernel, device, int(shared), limits)
    if config.cluster is not None:
        check_cluster(device, grid, config.cluster)
    if config.cooperative:
        _check_cooperative(kernel, device, grid, threads, int(shared))


def _check_shared(kernel: Kernel, device: Device, shared: int, limits: _Limits) -> None:
    if shared <= limits.max_dynamic_shared:
        return
    optin = device.properties.max_shared_memory_per_block_optin - limits.static_shared
    if shared > optin:
        raise LaunchConfigError(
            f"shared_mem = {shared} bytes exceeds what {device!r} allows kernel "
            f"{kernel.name!r}: {optin} bytes of dynamic shared memory per block "
            f"(max_shared_memory_per_block_optin {optin + limits.static_shared} less "
            f"{limits.static_shared} bytes of static shared memory)"
        )
    kernel._raise_dynamic_shared(device, shared)  # what CUDA C code does by hand above 48 KiB


def check_cluster(device: Device, grid: Dim3, cluster: Dim3) -> None:
    if not device.properties.cluster_launch:
        raise LaunchConfigError(
            f"{device!r} cannot launch thread block clusters "
            "(cluster_launch is 0; clusters need compute capability 9.0)"
        )
    for axis, g, c in zip("xyz", grid, cluster):
        if g % c:
            raise LaunchConfigError(
                f"grid.{axis} = {g} is not a multiple of cluster.{axis} = "
                f"{c}; the grid must be made of whole clusters"
            )
    size = cluster[0] * cluster[1] * cluster[2]
    if size > PORTABLE_CLUSTER:
        raise LaunchConfigError(
            f"a cluster of {cluster} is {size} blocks; the portable limit "
            f"is {PORTABLE_CLUSTER} blocks per cluster"
        )


def _check_cooperative(
    kernel: Kernel, device: Device, grid: Dim3, threads: int, shared: int
) -> None:
    if not device.properties.cooperative_launch:
        raise LaunchConfigError(f"{device!r} does not support cooperative launches")
    per_sm = kernel.occupancy(threads, shared, device)
    most = per_sm * device.properties.multiprocessor_count
    blocks = grid[0] * grid[1] * grid[2]
    if blocks > most:
        raise LaunchConfigError(
            f"a cooperative grid must be resident at once: {grid} is {blocks} blocks, but "
            f"{device!r} holds at most {most} blocks of {threads} threads with {shared} bytes "
            f"of shared memory ({per_sm} per multiprocessor x "
            f"{device.properties.multiprocessor_count})"
        )


def driver_config(config: Config, stream: Stream | None) -> CUlaunchConfig:
    """The `CUlaunchConfig` of a cluster or cooperative launch (cuLaunchKernelEx), or of an
    occupancy question (no stream: the current context's)."""
    cfg = CUlaunchConfig()
    cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = config.grid
    cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = config.block
    cfg.sharedMemBytes = config.shared_mem
    cfg.hStream = stream._handle if stream is not None else CUstream(0)
    attrs = []
    if config.cluster is not None:
        attr = CUlaunchAttribute()
        attr.id = CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        dim = attr.value.clusterDim
        dim.x, dim.y, dim.z = config.cluster
        attrs.append(attr)
    if config.cooperative:
        attr = CUlaunchAttribute()
        attr.id = CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_COOPERATIVE
        attr.value.cooperative = 1
        attrs.append(attr)
    cfg.attrs = attrs
    cfg.numAttrs = len(attrs)
    return cfg
