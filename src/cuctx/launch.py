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
import struct
import threading
from typing import TYPE_CHECKING, Any, Callable, NamedTuple

import numpy as np
from cuda.bindings.driver import CUlaunchAttribute, CUlaunchAttributeID, CUlaunchConfig

from .context import ACTIVE, fail
from .device import Device

if TYPE_CHECKING:
    from .library import Kernel
    from .stream import Stream

_SIGNED = {1: "b", 2: "h", 4: "i", 8: "q"}
_FLOAT = {2: "e", 4: "f", 8: "d"}
_PORTABLE_CLUSTER = 8  # blocks per cluster every cluster-capable GPU runs


class LaunchConfigError(ValueError):
    """A launch configuration the device or kernel cannot run: names the limit and value."""


class KernelArgumentError(TypeError):
    """Arguments that do not fit the kernel's parameters: names the parameter."""


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


# -- arguments ----------------------------------------------------------------------------

class Packer:
    """A kernel's parameter layout (offsets and sizes from the driver) and its packing plans,
    one per argument type signature, built on first use and shared by its launchers."""

    __slots__ = ("kernel", "params", "size", "plans", "lock")

    def __init__(self, kernel: Kernel, params: tuple):
        self.kernel = kernel
        self.params = params  # ((offset, size), ...)
        self.size = max((o + s for o, s in params), default=0)
        self.plans: dict[tuple[type, ...], _Plan] = {}
        self.lock = threading.Lock()

    def plan(self, args: tuple) -> _Plan:
        """The plan for the types of ``args``; checks their count, types and sizes."""
        key = tuple(map(type, args))
        plan = self.plans.get(key)
        if plan is None:
            with self.lock:
                plan = self.plans.get(key) or _Plan(self, args)
                self.plans[key] = plan
        return plan

    def buffers(self) -> tuple[bytearray, ctypes.Array | None]:
        """A parameter buffer and a ``void*`` array pointing into it (None without
        parameters), which the driver reads at each launch."""
        buffer = bytearray(max(self.size, 1))
        if not self.params:
            return buffer, None
        base = ctypes.addressof((ctypes.c_char * len(buffer)).from_buffer(buffer))
        pointers = (ctypes.c_void_p * len(self.params))(
            *[base + offset for offset, _ in self.params])
        return buffer, pointers

    def describe(self, index: int) -> str:
        offset, size = self.params[index]
        return (f"parameter {index} of kernel {self.kernel.name!r} (offset {offset}, "
                f"{size} bytes)")


class _Miss(Exception):
    """The arguments are not of the types a plan was made for."""


class _Plan:
    """How arguments of one type signature become parameter bytes: ``pack(buffer, stream,
    args)``, generated for the signature (a type guard, the pointer conversions, one
    ``struct.pack_into``), so the hot path runs no per-argument Python loop."""

    __slots__ = ("pack", "getters", "types", "pack_into")

    def __init__(self, packer: Packer, args: tuple):
        if len(args) != len(packer.params):
            raise KernelArgumentError(
                f"kernel {packer.kernel.name!r} takes {len(packer.params)} argument(s) "
                f"(parameter sizes {[s for _, s in packer.params]} bytes), got {len(args)}")
        fmt, pos, getters = ["<"], 0, []
        for index, ((offset, size), arg) in enumerate(zip(packer.params, args)):
            code, getter = _slot(packer, index, size, arg)
            fmt.append("x" * (offset - pos) + code)
            pos = offset + size
            getters.append(getter)
        self.getters = tuple(getters)
        self.types = tuple(map(type, args))
        self.pack_into = struct.Struct("".join(fmt)).pack_into
        self.pack = _generate_pack(self)


class _NoPlan:
    __slots__ = ()

    @staticmethod
    def pack(buffer, stream, args):
        raise _Miss


_NO_PLAN = _NoPlan()


def _argument_code(plan: _Plan, miss: str) -> tuple[str, str, dict]:
    """Source that unpacks ``args``, checks the types against the plan (running ``miss``
    when they differ), and the ``, value, ...`` list for ``pack_into``; and its scope."""
    n = len(plan.types)
    lines = [f"    if len(args) != {n}:\n        {miss}\n"]
    if n:
        lines.append(f"    {', '.join(f'a{i}' for i in range(n))}, = args\n")
        guard = " or ".join(f"type(a{i}) is not T{i}" for i in range(n))
        lines.append(f"    if {guard}:\n        {miss}\n")
    values = []
    for i, getter in enumerate(plan.getters):
        if getter is _device_array_pointer:  # inlined: the common case on the hot path
            lines.append(f"    c = a{i}._ctx\n"
                         f"    if c._state is not ACTIVE or c._device is not device:\n"
                         f"        G{i}(a{i}, stream)\n")
            values.append(f", a{i}.ptr")
        else:
            values.append(f", G{i}(a{i}, stream)" if getter else f", a{i}")
    scope = {"ACTIVE": ACTIVE, "pack_into": plan.pack_into,
             **{f"T{i}": t for i, t in enumerate(plan.types)},
             **{f"G{i}": g for i, g in enumerate(plan.getters) if g}}
    return "".join(lines), "".join(values), scope


def _compile(source: str, scope: dict, name: str, what: str) -> Callable:
    exec(compile(source, f"<cuctx {what}>", "exec"), scope)  # noqa: S102 - our own source
    return scope[name]


def _generate_pack(plan: _Plan) -> Callable:
    """``pack(buffer, stream, args)`` for one type signature; raises _Miss for others."""
    checks, values, scope = _argument_code(plan, "raise Miss")
    source = (f"def pack(buffer, stream, args):\n    device = stream._ctx._device\n{checks}"
              f"    pack_into(buffer, 0{values})\n")
    return _compile(source, {**scope, "Miss": _Miss}, "pack", f"packer {plan.types}")


def _generate_launch(plan: _Plan, launcher: Launcher, buffer: bytearray, go: Callable) -> Callable:
    """``launch(args)`` for one launcher, one type signature and the calling thread's
    buffer: every check and the driver call in one function, with everything it needs bound
    as constants. Whatever it was not made for goes to ``launcher._general``."""
    checks, values, scope = _argument_code(plan, "return general(args)")
    source = (
        "def launch(args):\n"
        "    if ctx._state is not ACTIVE or not owner._loaded or get_ident() != thread:\n"
        "        return general(args)\n"
        f"{checks}"
        "    try:\n"
        f"        pack_into(buffer, 0{values})\n"
        "    except struct_error:\n"
        "        return general(args)\n"
        "    err, = go()\n"
        "    if err:\n"
        "        fail(err)\n")
    scope.update(ctx=launcher._ctx, owner=launcher._owner, thread=threading.get_ident(),
                 get_ident=threading.get_ident, general=launcher._general, buffer=buffer,
                 go=go, fail=launcher._fail, struct_error=struct.error, device=launcher._device,
                 stream=launcher.stream)
    return _compile(source, scope, "launch", f"launcher {launcher.kernel.name} {plan.types}")


def _slot(packer: Packer, index: int, size: int, arg: Any):
    """(struct code, converter or None) for one argument of this type in this parameter."""
    kind = type(arg)
    if kind is int or kind is bool:
        if size not in _SIGNED:
            raise KernelArgumentError(f"{packer.describe(index)} cannot take a Python int; pass "
                                      "a ctypes structure or NumPy scalar of that size")
        return _SIGNED[size], None  # out of the signed range: pack_slowly takes over
    if kind is float:
        if size not in _FLOAT:
            raise KernelArgumentError(f"{packer.describe(index)} cannot take a Python float")
        return _FLOAT[size], None
    if arg is None:
        _need_pointer(packer, index, size, "None (a null pointer)")
        return "Q", _null
    if isinstance(arg, np.ndarray):
        raise KernelArgumentError(
            f"{packer.describe(index)} got a NumPy array, which is host memory; copy it to the "
            "device with cuctx.to_device(ary) and pass that")
    if isinstance(arg, np.generic):  # NumPy scalars, structured ones (np.void) included
        _same_size(packer, index, size, arg.dtype.itemsize, f"a NumPy {arg.dtype} scalar")
        return f"{size}s", _sized_bytes(packer, index, size)
    if isinstance(arg, (ctypes._SimpleCData, ctypes.Structure, ctypes.Union, ctypes.Array)):
        _same_size(packer, index, size, ctypes.sizeof(arg), f"a ctypes {kind.__name__}")
        return f"{size}s", _ctypes_bytes
    getter = _pointer_getter(arg)
    if getter is None:
        raise KernelArgumentError(
            f"{packer.describe(index)} cannot take {kind.__name__}: pass an int or float, a "
            "NumPy scalar, a ctypes structure, or device memory (DeviceArray, torch/CuPy "
            "arrays, anything with __cuda_array_interface__ or DLPack)")
    _need_pointer(packer, index, size, f"a {kind.__name__} (a device pointer)")
    return "Q", getter


def _need_pointer(packer: Packer, index: int, size: int, what: str) -> None:
    if size != 8:
        raise KernelArgumentError(f"{packer.describe(index)} is not pointer-sized; it cannot "
                                  f"take {what}")


def _same_size(packer: Packer, index: int, size: int, got: int, what: str) -> None:
    if got != size:
        raise KernelArgumentError(f"{packer.describe(index)} got {what} of {got} bytes; the "
                                  f"parameter is {size} bytes")


def _null(arg, stream) -> int:
    return 0


def _sized_bytes(packer: Packer, index: int, size: int) -> Callable:
    """The bytes of a NumPy scalar, checked at every call: one type (np.void, np.bytes_)
    covers every size, so a plan made for one size must not take another."""
    def as_bytes(arg, stream) -> bytes:
        if arg.dtype.itemsize != size:
            _same_size(packer, index, size, arg.dtype.itemsize, f"a NumPy {arg.dtype} scalar")
        return arg.tobytes()
    return as_bytes


def _ctypes_bytes(arg, stream) -> bytes:
    return bytes(arg)


def _pointer_getter(arg: Any):
    """A converter from this kind of device array to its address, checking its device, or
    None when ``arg`` is no device array."""
    from .memory import DeviceArray
    if isinstance(arg, DeviceArray):
        return _device_array_pointer
    module = type(arg).__module__.split(".", 1)[0]
    if module == "torch" and hasattr(arg, "data_ptr"):
        return _torch_pointer
    if module == "cupy" and hasattr(arg, "data"):
        return _cupy_pointer
    if hasattr(arg, "__cuda_array_interface__") or hasattr(arg, "__dlpack_device__"):
        return _foreign_pointer
    return None


def _device_array_pointer(arr, stream: Stream) -> int:
    device = stream._ctx._device
    ctx = arr._ctx
    if ctx._state is not ACTIVE:
        raise ctx._unusable("launch (a DeviceArray argument)")
    if ctx._device is not device:
        _reachable(ctx.device, device, arr)
    return arr.ptr


def _torch_pointer(tensor, stream: Stream) -> int:
    device = stream._ctx._device
    where = tensor.device
    if where.type != "cuda":
        raise KernelArgumentError(f"a torch tensor on {where} is host memory; move it to the "
                                  "GPU (tensor.cuda()) first")
    if where.index != device.ordinal:
        _reachable(Device._for_backend(device._backend, where.index), device, tensor)
    return tensor.data_ptr()


def _cupy_pointer(array, stream: Stream) -> int:
    device = stream._ctx._device
    if array.device.id != device.ordinal:
        _reachable(Device._for_backend(device._backend, array.device.id), device, array)
    return array.data.ptr


def _foreign_pointer(obj, stream: Stream) -> int:
    from .memory import asarray
    # The launch's own stream, not the current one, must wait for the producer's work.
    return _device_array_pointer(asarray(obj, stream=stream), stream)


@functools.lru_cache(maxsize=None)
def _peer(owner: Device, device: Device) -> bool:
    return device.can_access_peer(owner)


def _reachable(owner: Device, device: Device, arr) -> None:
    if not _peer(owner, device):
        raise KernelArgumentError(
            f"{type(arr).__name__} on device {owner.ordinal} passed to a launch on device "
            f"{device.ordinal}, which cannot access it (no peer access between them); copy "
            "it to the launch device first")


def pack_slowly(packer: Packer, args: tuple, stream: Stream, buffer: bytearray) -> None:
    """Pack ``args`` one by one into ``buffer``, with clear errors: the path for ints the
    fast plan's signed codes rejected (unsigned values) and for values out of range."""
    plan = packer.plan(args)
    for index, ((offset, size), arg) in enumerate(zip(packer.params, args)):
        getter = plan.getters[index]
        try:
            value = arg if getter is None else getter(arg, stream)
            if isinstance(value, bytes):
                data = value
            elif isinstance(value, float):
                data = struct.pack("<" + _FLOAT[size], value)
            else:
                data = int(value).to_bytes(size, "little", signed=int(value) < 0)
        except (OverflowError, struct.error) as exc:
            raise KernelArgumentError(f"{packer.describe(index)} cannot hold {arg!r}: {exc}") \
                from None
        buffer[offset:offset + size] = data


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
        self._plan = _NO_PLAN  # the last plan used: the next call most likely has the same types
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
        threads, other argument types, bad arguments (for their errors), unusable contexts."""
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
            except struct.error:
                pack_slowly(self._packer, args, self.stream, buffer)
        except struct.error:
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
    if stream is None:
        from .library import working_context
        from .stream import resolve_stream
        ctx = kernel._home_context() or working_context()
        stream = resolve_stream(None, ctx, f"launch of {kernel.name!r}")
    cache = kernel._launchers
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
