"""Kernel launches: the launch configuration, checked against the device before the driver
sees it, and the arguments, packed against the kernel's real parameter layout.

``launch(kernel, grid, block, *args, shared_mem=0, stream=None, cluster=None,
cooperative=False)`` and ``kernel[grid, block, shared_mem, stream](*args)`` (CUDA C's
``<<<Dg, Db, Ns, S>>>``) both go through a `Launcher`: the validated configuration and the
stream, bound to the driver call with everything but the parameter bytes fixed.

A launcher's first launch generates its fast path: Python source specialised to the
launcher, the calling thread and the argument types, doing the context and library checks,
a type guard, one ``struct.pack_into`` into the thread's parameter buffer, and the driver
call, which receives the address of a ``void*`` array pointing into that buffer
(cuda.bindings passes an int ``kernelParams`` straight through as ``void**``). The driver
copies the parameters at the call, so the buffer is free again when it returns. Everything
else (other threads, other types, bad arguments) takes the checked general path.
"""

from __future__ import annotations

import ctypes
import functools
import threading
from typing import TYPE_CHECKING, Any, Callable, NamedTuple

import numpy as np
from cuda.bindings.driver import CUlaunchAttribute, CUlaunchAttributeID, CUlaunchConfig

from ._args import (NO_PLAN, PACK_ERRORS, KernelArgumentError, _Miss, _Plan, argument_code,
                    compile_function, pack_slowly)
from ._driver import in_host_function
from .context import ACTIVE, fail, refuse_in_host_function
from .device import Device

if TYPE_CHECKING:
    from ._kernel import Kernel
    from .stream import Stream

_PORTABLE_CLUSTER = 8  # blocks per cluster every cluster-capable GPU runs


class LaunchConfigError(ValueError):
    """A launch configuration the device or kernel cannot run: names the limit and value."""


Dim3 = tuple[int, int, int]


def dim3(value: Any, what: str) -> Dim3:
    """(x, y, z) from an int or a sequence of 1 to 3 ints, each at least 1."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        dims = (int(value),)
    elif isinstance(value, (tuple, list)) and 1 <= len(value) <= 3 and all(
            isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in value):
        dims = tuple(int(v) for v in value)
    else:
        raise LaunchConfigError(f"{what} must be an int or a tuple of 1 to 3 ints, got {value!r}")
    dims = dims + (1,) * (3 - len(dims))
    for axis, n in zip("xyz", dims):
        if n < 1:
            raise LaunchConfigError(f"{what}.{axis} is {n}; every dimension must be at least 1")
    return dims


# -- the launch configuration -------------------------------------------------------------

class Config(NamedTuple):
    grid: Dim3
    block: Dim3
    shared_mem: int
    cluster: Dim3 | None
    cooperative: bool


def validate(kernel: Kernel, device: Device, config: Config) -> None:
    """Check ``config`` against the device's and the kernel's limits; raise
    `LaunchConfigError` naming the first one exceeded. Raises the kernel's dynamic shared
    memory limit (the attribute) when more than 48 KiB is asked for and the device allows it."""
    p = device.properties
    grid, block, shared = config.grid, config.block, config.shared_mem
    for axis, n, limit in zip("xyz", grid, (p.max_grid_dim_x, p.max_grid_dim_y, p.max_grid_dim_z)):
        if n > limit:
            raise LaunchConfigError(f"grid.{axis} = {n} exceeds the device's limit of {limit} "
                                    f"(max_grid_dim_{axis} of {device!r})")
    for axis, n, limit in zip("xyz", block,
                              (p.max_block_dim_x, p.max_block_dim_y, p.max_block_dim_z)):
        if n > limit:
            raise LaunchConfigError(f"block.{axis} = {n} exceeds the device's limit of {limit} "
                                    f"(max_block_dim_{axis} of {device!r})")
    threads = block[0] * block[1] * block[2]
    if threads > p.max_threads_per_block:
        raise LaunchConfigError(f"a block of {block} is {threads} threads; the device runs at "
                                f"most {p.max_threads_per_block} threads per block")
    limits = kernel._limits(device)
    if threads > limits.max_threads:
        raise LaunchConfigError(
            f"kernel {kernel.name!r} can run at most {limits.max_threads} threads per block on "
            f"{device!r} (its registers or __launch_bounds__); the block {block} has {threads}")
    if not isinstance(shared, (int, np.integer)) or isinstance(shared, bool) or shared < 0:
        raise LaunchConfigError(f"shared_mem must be a number of bytes >= 0, got {shared!r}")
    _check_shared(kernel, device, int(shared), limits)
    if config.cluster is not None:
        _check_cluster(device, grid, config.cluster)
    if config.cooperative:
        _check_cooperative(kernel, device, grid, threads, int(shared))


def _check_shared(kernel: Kernel, device: Device, shared: int, limits) -> None:
    if shared <= limits.max_dynamic_shared:
        return
    optin = device.properties.max_shared_memory_per_block_optin - limits.static_shared
    if shared > optin:
        raise LaunchConfigError(
            f"shared_mem = {shared} bytes exceeds what {device!r} allows kernel "
            f"{kernel.name!r}: {optin} bytes of dynamic shared memory per block "
            f"(max_shared_memory_per_block_optin {optin + limits.static_shared} less "
            f"{limits.static_shared} bytes of static shared memory)")
    kernel._raise_dynamic_shared(device, shared)  # what CUDA C code does by hand above 48 KiB


def _check_cluster(device: Device, grid: Dim3, cluster: Dim3) -> None:
    if not device.properties.cluster_launch:
        raise LaunchConfigError(f"{device!r} cannot launch thread block clusters "
                                "(cluster_launch is 0; clusters need compute capability 9.0)")
    for axis, g, c in zip("xyz", grid, cluster):
        if g % c:
            raise LaunchConfigError(f"grid.{axis} = {g} is not a multiple of cluster.{axis} = "
                                    f"{c}; the grid must be made of whole clusters")
    size = cluster[0] * cluster[1] * cluster[2]
    if size > _PORTABLE_CLUSTER:
        raise LaunchConfigError(f"a cluster of {cluster} is {size} blocks; the portable limit "
                                f"is {_PORTABLE_CLUSTER} blocks per cluster")


def _check_cooperative(kernel: Kernel, device: Device, grid: Dim3, threads: int,
                       shared: int) -> None:
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
            f"{device.properties.multiprocessor_count})")


# -- the generated fast path -------------------------------------------------------------

def _generate_launch(plan: _Plan, launcher: Launcher, buffer: bytearray, go: Callable) -> Callable:
    """``launch(args)`` for one launcher, one type signature and the calling thread's
    buffer: every check and the driver call in one function, with everything it needs bound
    as constants. Whatever it was not made for goes to ``launcher._general``."""
    checks, values, scope = argument_code(plan, "return general(args)")
    source = (
        "def launch(args):\n"
        "    if ctx._state is not ACTIVE or not owner._loaded or get_ident() != thread or hostfn:\n"
        "        return general(args)\n"
        f"{checks}"
        "    try:\n"
        f"        pack_into(buffer, 0{values})\n"
        "    except pack_errors:\n"
        "        return general(args)\n"
        "    err, = go()\n"
        "    if err:\n"
        "        fail(err)\n")
    scope.update(ctx=launcher._ctx, owner=launcher._owner, thread=threading.get_ident(),
                 get_ident=threading.get_ident, general=launcher._general, buffer=buffer,
                 go=go, fail=launcher._fail, pack_errors=PACK_ERRORS, device=launcher._device,
                 hostfn=in_host_function,
                 stream=launcher.stream)
    return compile_function(source, scope, "launch",
                            f"launcher {launcher.kernel.name} {plan.types}")


# -- launchers ----------------------------------------------------------------------------

class Launcher:
    """A kernel bound to a checked launch configuration and a stream; call it with the
    kernel's arguments to launch. Made by ``kernel[grid, block, shared_mem, stream]``."""

    __slots__ = ("kernel", "config", "stream", "_ctx", "_device", "_packer", "_go_at",
                 "_owner", "_backend", "_plan", "_local", "_fast", "__weakref__")

    def __init__(self, kernel: Kernel, config: Config, stream: Stream):
        ctx = stream._ctx
        if ctx._state is not ACTIVE:
            raise ctx._unusable(f"launch of {kernel.name!r}")
        device = ctx.device
        kernel._check_launchable(ctx)
        if (config, device) not in kernel._checked:
            validate(kernel, device, config)
            kernel._checked.add((config, device))
        self.kernel = kernel
        self.config = config
        self.stream = stream
        self._ctx = ctx
        self._device = device
        self._owner = kernel._owner
        self._backend = ctx._backend
        self._packer = kernel._packer()
        self._plan = NO_PLAN  # the last plan used: the next call most likely has the same types
        self._local = threading.local()  # per thread: (parameter buffer, bound driver call)
        # The first launch generates the fast path for its thread and argument types.
        self._fast: Callable | None = None
        self._owner._used_in(ctx)
        drv = ctx._backend.driver
        function, handle = kernel._function, stream._handle
        # stream._bind: a default stream's handle means "the current context's", so for one
        # the call runs with the stream's context current.
        if config.cluster is None and not config.cooperative:
            self._go_at = functools.partial(
                stream._bind(drv.cuLaunchKernel), function, *config.grid, *config.block,
                config.shared_mem, handle)
        else:
            self._go_at = functools.partial(stream._bind(drv.cuLaunchKernelEx),
                                            _launch_config(config, stream), function)

    def _thread_state(self) -> tuple[bytearray, Callable, ctypes.Array | None]:
        buffer, pointers = self._packer.buffers()
        address = ctypes.addressof(pointers) if pointers is not None else 0
        state = self._local.state = (buffer, functools.partial(self._go_at, address, 0), pointers)
        return state

    def __call__(self, *args: Any) -> None:
        (self._fast or self._general)(args)

    def _general(self, args: tuple) -> None:
        """Every launch the generated fast path was not made for: the first one, other
        threads, other argument types, bad arguments (for their errors), unusable contexts,
        calls from inside a host function (the set is empty unless one runs)."""
        if in_host_function:
            refuse_in_host_function(f"launch of {self.kernel.name!r}")
        ctx = self._ctx
        if ctx._state is not ACTIVE:
            raise ctx._unusable(f"launch of {self.kernel.name!r}")
        if not self._owner._loaded:
            raise self._owner._gone(f"launch of {self.kernel.name!r}")
        try:
            buffer, go, _ = self._local.state
        except AttributeError:  # this thread's first launch with this launcher
            buffer, go, _ = self._thread_state()
        try:
            self._plan.pack(buffer, self.stream, args)
        except _Miss:  # other types than last time (or the first call)
            plan = self._plan = self._packer.plan(args)
            try:
                plan.pack(buffer, self.stream, args)
            except PACK_ERRORS:
                pack_slowly(self._packer, args, self.stream, buffer)
        except PACK_ERRORS:
            pack_slowly(self._packer, args, self.stream, buffer)
        err, = go()
        if err:
            self._fail(err)
        if self._fast is None:
            self._fast = _generate_launch(self._plan, self, buffer, go)

    def _fail(self, err) -> None:
        c = self.config
        fail(self._backend, err, "cuLaunchKernel", self._ctx,
             hint=f"kernel {self.kernel.name!r}, grid {c.grid}, block {c.block}, "
                  f"shared_mem {c.shared_mem}")

    def __repr__(self) -> str:
        c = self.config
        return (f"<Launcher {self.kernel.name!r} grid={c.grid} block={c.block} "
                f"shared_mem={c.shared_mem} on {self.stream!r}>")


def _launch_config(config: Config, stream: Stream) -> CUlaunchConfig:
    cfg = CUlaunchConfig()
    cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = config.grid
    cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = config.block
    cfg.sharedMemBytes = config.shared_mem
    cfg.hStream = stream._handle
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


_LAUNCHER_CACHE_SIZE = 64


def make_launcher(kernel: Kernel, grid: Any, block: Any, shared_mem: int = 0,
                  stream: Any = None, cluster: Any = None, cooperative: bool = False) -> Launcher:
    """The launcher for this configuration; the same one each time it is asked for again, so
    ``kernel[...](...)`` and `launch` check and bind a configuration only once."""
    cache = getattr(kernel, "_launchers", None)
    if cache is None:
        raise TypeError(f"the kernel argument of cuctx.launch must be a cuctx.Kernel "
                        f"(lib['name']), not {type(kernel).__name__}: {kernel!r}")
    if stream is None:
        from ._kernel import working_context
        from .stream import resolve_stream
        ctx = kernel._home_context() or working_context()
        stream = resolve_stream(None, ctx, f"launch of {kernel.name!r}")
    # Types too: 1.0 == 1 and True == 1, but only the int passes the checks.
    key = (grid, block, shared_mem, stream, cluster, cooperative,
           type(grid), type(block), type(shared_mem))
    try:
        return cache[key]
    except KeyError:
        pass
    except TypeError:  # an unhashable configuration (lists): not cached
        key = None
    from .stream import Stream
    if isinstance(shared_mem, bool) or not isinstance(shared_mem, (int, np.integer)):
        raise LaunchConfigError(f"shared_mem must be an int (bytes of dynamic shared memory), "
                                f"got {shared_mem!r}")
    config = Config(dim3(grid, "grid"), dim3(block, "block"), int(shared_mem),
                    None if cluster is None else dim3(cluster, "cluster"), bool(cooperative))
    launcher = Launcher(kernel, config, Stream.wrap(stream))
    if key is not None:
        if len(cache) >= _LAUNCHER_CACHE_SIZE:  # many configurations: start over, stay small
            cache.clear()
        cache[key] = launcher
    return launcher


def launch(kernel: Kernel, grid: Any, block: Any, *args: Any, shared_mem: int = 0,
           stream: Any = None, cluster: Any = None, cooperative: bool = False) -> None:
    """Launch ``kernel`` on a ``grid`` of ``block``-sized blocks (ints or 1-3 tuples) with
    ``args``, on ``stream`` (default: the current stream of the current context), with
    ``shared_mem`` bytes of dynamic shared memory per block, optionally as thread block
    ``cluster``s or as a ``cooperative`` launch. The configuration is checked against the
    device first: a violation raises `LaunchConfigError` naming the limit."""
    make_launcher(kernel, grid, block, shared_mem, stream, cluster, cooperative)(*args)


__all__ = ["Config", "KernelArgumentError", "LaunchConfigError", "Launcher", "launch"]
