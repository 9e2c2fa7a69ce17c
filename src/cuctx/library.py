"""Device code: context-independent libraries (`Library`), context-bound modules
(`Module`), and their kernels (`Kernel`).

A `Library` is loaded once for the process (cuLibraryLoadData, CUDA 12.0's
context-independent loading): the driver loads it into every context that uses it, those
created later included, and unloads it from each with the context. Its `Kernel` handles
(CUkernel) launch in whatever context the launch's stream belongs to. A `Module`
(cuModuleLoadData) is the older way: loaded into the current context only, its kernels
(CUfunction) run only there. docs/kernels.md shows the two side by side.

Unloading waits for the work that uses the code: every context a kernel of it was launched
in (or a variable of it was viewed in) is synchronized first, whether `unload` is called or
the object is garbage-collected.
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import TYPE_CHECKING, Any, Callable, Mapping, NamedTuple

import numpy as np
from cuda.bindings.driver import CUfunction, CUfunction_attribute

from . import _cubin
from . import _driver
from .compiler import CompileError, compile_source, pick_arch
from .context import ACTIVE, Context, _MadeCurrent, current_context, fail
from .device import Device, devices
from .errors import NotSupportedError
from .launch import Launcher, make_launcher

if TYPE_CHECKING:
    from typing import Self

_F = CUfunction_attribute
_INVALID_VALUE = 1
_NOT_FOUND = 500


class KernelAttributes(NamedTuple):
    """What the driver reports about a kernel on one device (cuKernelGetAttribute)."""
    num_regs: int
    shared_size_bytes: int  # static shared memory per block
    const_size_bytes: int
    local_size_bytes: int  # per thread
    max_threads_per_block: int  # for this kernel: registers and __launch_bounds__ count
    max_dynamic_shared_size_bytes: int
    ptx_version: int  # e.g. 90 for compute_90
    binary_version: int  # e.g. 90 for sm_90


class BlockSizeSuggestion(NamedTuple):
    block_size: int  # threads per block with the highest occupancy
    min_grid_size: int  # blocks needed to fill the device at that occupancy


class _Limits(NamedTuple):
    max_threads: int
    static_shared: int
    max_dynamic_shared: int


# -- kernels ------------------------------------------------------------------------------

class Kernel:
    """A kernel of a `Library` (usable in every context) or of a `Module` (only in the
    module's context). Launch it with ``kernel[grid, block, shared_mem, stream](*args)`` or
    `cuctx.launch`; inspect it with `attributes`, `occupancy`, `suggest_block_size`."""

    __slots__ = ("name", "_owner", "_handle", "_function", "_backend", "_params", "_pack",
                 "_limits_cache", "_checked", "_launchers", "_lock", "__weakref__")

    def __init__(self, owner: Library | Module, handle, name: str):
        self.name = name
        self._owner = owner
        self._handle = handle  # CUkernel (library) or CUfunction (module)
        # cuLaunchKernel takes a CUkernel where a CUfunction goes (the driver's documented cast).
        self._function = CUfunction(int(handle))
        self._backend = owner._backend
        self._params: tuple | None = None
        self._pack = None
        self._limits_cache: dict[Device, _Limits] = {}
        self._checked: set = set()  # (Config, Device) pairs already validated
        self._launchers: dict = {}  # kernel[...] and launch() configurations -> Launcher
        self._lock = threading.Lock()

    @property
    def handle(self) -> int:
        """The CUkernel (or, for a Module, CUfunction) as an integer, for other libraries."""
        return int(self._handle)

    @property
    def library(self) -> Library | Module:
        return self._owner

    # -- the parameter layout -------------------------------------------------------------

    @property
    def param_layout(self) -> tuple[tuple[int, int], ...]:
        """(offset, size) in bytes of each parameter, from the driver (cuKernelGetParamInfo)."""
        if self._params is None:
            operation = f"{self.name}.param_layout"
            self._owner._check(operation)
            query = self._owner._param_info
            params = []
            # The driver asks for a current context (INVALID_CONTEXT without one).
            home = getattr(self._owner, "_ctx", None) or working_context()
            with home._current(operation):
                while True:
                    err, offset, size = query(self._handle, len(params))
                    if err:
                        if int(err) == _INVALID_VALUE:  # past the last parameter
                            break
                        fail(self._backend, err, self._owner._param_info_name)
                    params.append((int(offset), int(size)))
            self._params = tuple(params)
        return self._params

    def _packer(self):
        if self._pack is None:
            from .launch import Packer
            with self._lock:
                if self._pack is None:
                    self._pack = Packer(self, self.param_layout)
        return self._pack

    # -- launching ------------------------------------------------------------------------

    def __getitem__(self, config) -> Launcher:
        """``kernel[grid, block]``, ``kernel[grid, block, shared_mem]`` or
        ``kernel[grid, block, shared_mem, stream]``, as CUDA C's ``<<<Dg, Db, Ns, S>>>``."""
        if not isinstance(config, tuple) or not 2 <= len(config) <= 4:
            raise TypeError("use kernel[grid, block], kernel[grid, block, shared_mem] or "
                            f"kernel[grid, block, shared_mem, stream], got kernel[{config!r}]")
        return make_launcher(self, *config)

    def _home_context(self) -> Context | None:
        return self._owner._home_context()

    def _check_launchable(self, ctx: Context) -> None:
        self._owner._check(f"launch of {self.name!r}")
        self._owner._check_context(ctx, self.name)
        if self._backend.name == "sim":
            err, twin = self._backend.driver.simGetKernelTwin(self._handle)
            if not err and twin is None:
                raise NotSupportedError(
                    801, f"launch of {self.name!r}", "",
                    f"the sim cannot run kernel {self.name!r}: it has no Python twin. Register "
                    f"one when loading: sim_kernels={{{self._owner._user_name(self.name)!r}: "
                    "fn}, where fn(grid, block, *args) does what the kernel does")

    # -- introspection --------------------------------------------------------------------

    def attributes(self, device: Device | int | None = None) -> KernelAttributes:
        """Registers, memory sizes, thread limit and versions of this kernel on ``device``
        (default: the current device; a Module's kernel: its context's device)."""
        device = self._device(device)
        get = self._owner._attribute
        values = {name: get(self._handle, getattr(_F, f"CU_FUNC_ATTRIBUTE_{name.upper()}"),
                            device)
                  for name in KernelAttributes._fields}
        return KernelAttributes(**values)

    def _device(self, device) -> Device:
        home = self._home_context()
        if home is not None:
            return home.device
        return working_context().device if device is None else Device(device)

    def _limits(self, device: Device) -> _Limits:
        limits = self._limits_cache.get(device)
        if limits is None:
            get = self._owner._attribute
            limits = self._limits_cache[device] = _Limits(
                get(self._handle, _F.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, device),
                get(self._handle, _F.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, device),
                get(self._handle, _F.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, device))
        return limits

    def _raise_dynamic_shared(self, device: Device, nbytes: int) -> None:
        self._owner._set_attribute(self._handle, _F.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                   nbytes, device)
        self._limits_cache[device] = self._limits(device)._replace(max_dynamic_shared=nbytes)

    def occupancy(self, block: int, shared_mem: int = 0,
                  device: Device | int | None = None) -> int:
        """Blocks of ``block`` threads (with ``shared_mem`` bytes of dynamic shared memory)
        that one multiprocessor of ``device`` holds at once."""
        device = self._device(device)
        with self._owner._context_on(device, "Kernel.occupancy") as ctx:
            err, blocks = self._backend.driver.cuOccupancyMaxActiveBlocksPerMultiprocessor(
                self._function, int(block), int(shared_mem))
        if err:
            fail(self._backend, err, "cuOccupancyMaxActiveBlocksPerMultiprocessor", ctx)
        return int(blocks)

    def suggest_block_size(self, shared_mem: int = 0, device: Device | int | None = None,
                           limit: int = 0) -> BlockSizeSuggestion:
        """The block size with the highest occupancy on ``device`` (at most ``limit``
        threads when given) and the grid size that fills the device with it."""
        device = self._device(device)
        with self._owner._context_on(device, "Kernel.suggest_block_size") as ctx:
            err, min_grid, block = self._backend.driver.cuOccupancyMaxPotentialBlockSize(
                self._function, None, int(shared_mem), int(limit))
        if err:
            fail(self._backend, err, "cuOccupancyMaxPotentialBlockSize", ctx)
        return BlockSizeSuggestion(int(block), int(min_grid))

    def __repr__(self) -> str:
        return f"<Kernel {self.name!r} of {self._owner!r}>"


# -- what Library and Module share --------------------------------------------------------

def _image_from(data: bytes | bytearray | memoryview) -> bytes:
    """The bytes to hand the driver: a cubin, a fatbin or NUL-terminated PTX."""
    if isinstance(data, str):
        data = data.encode()
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"device code must be bytes (a cubin, fatbin or PTX), not "
                        f"{type(data).__name__}")
    data = bytes(data)
    if _cubin.is_cubin(data) or _cubin.is_fatbin(data):
        return data
    if _cubin.is_ptx(data):
        return data if data.endswith(b"\0") else data + b"\0"
    raise ValueError("not device code: the data is neither a cubin (ELF for CUDA), a fatbin "
                     "nor PTX text (with .version and .target)")


def _compile(src: str, options, name_expressions, headers, cache_dir) -> tuple[bytes, dict]:
    """NVRTC for the devices present: a cubin for their exact architecture when they share
    one, else PTX."""
    capabilities = [tuple(d.compute_capability) for d in devices()]
    result = compile_source(src, arch=pick_arch(capabilities or [(9, 0)]), options=options,
                            name_expressions=name_expressions, headers=headers,
                            cache_dir=cache_dir)
    return result.image, result.lowered_names


class _Code:
    """State and behaviour common to `Library` and `Module`."""

    _backend: _driver.Backend
    _names: dict[str, str]

    def _setup(self, backend, names: Mapping[str, str]) -> None:
        self._backend = backend
        self._names = dict(names)  # user's name (e.g. "axpy<float>") -> mangled name
        self._kernels: dict[str, Kernel] = {}
        self._lock = threading.Lock()
        self._loaded = True

    @classmethod
    def from_source(cls, src: str, options=(), name_expressions=(),
                    headers: Mapping[str, str | bytes] | None = None, *,
                    sim_kernels: Mapping[str, Callable] | None = None,
                    cache_dir: str | os.PathLike | bool | None = None) -> Self:
        """Compile CUDA C++ with NVRTC (cached; see docs/compiler.md) for the devices present
        and load it: a `Library` for every context, a `Module` into the current one only.
        Template kernels: list them in ``name_expressions`` (``["axpy<float>"]``) and get
        them by that name. Raises `CompileError` with NVRTC's log when it does not compile."""
        image, lowered = _compile(src, options, name_expressions, headers, cache_dir)
        return cls(image, names=lowered, sim_kernels=sim_kernels)

    @classmethod
    def from_file(cls, path: str | os.PathLike, *,
                  sim_kernels: Mapping[str, Callable] | None = None) -> Self:
        """Load a cubin, fatbin or PTX file (recognised by its content)."""
        with open(path, "rb") as f:
            return cls(f.read(), sim_kernels=sim_kernels)

    @classmethod
    def from_bytes(cls, data: bytes, *,
                   sim_kernels: Mapping[str, Callable] | None = None) -> Self:
        """Load a cubin, fatbin or PTX image held in memory (recognised by its content)."""
        return cls(data, sim_kernels=sim_kernels)

    def _check(self, operation: str) -> None:
        if not self._loaded:
            raise self._gone(operation)

    def _gone(self, operation: str) -> RuntimeError:
        return RuntimeError(f"{operation}: {self!r} was unloaded; its kernels and variables "
                            "cannot be used any more")

    def _user_name(self, mangled: str) -> str:
        return next((user for user, m in self._names.items() if m == mangled), mangled)

    def kernel(self, name: str) -> Kernel:
        """The kernel called ``name``: its C name (``extern "C"``), its mangled name, or a
        name expression given to `from_source` (``"axpy<float>"``)."""
        self._check("kernel")
        mangled = self._names.get(name, name)
        with self._lock:
            found = self._kernels.get(mangled)
            if found is None:
                err, handle = self._get_kernel(mangled.encode())
                if err:
                    if int(err) == _NOT_FOUND:
                        raise KeyError(f"no kernel {name!r} in {self!r}; it has "
                                       f"{self.kernel_names}") from None
                    fail(self._backend, err, self._get_kernel_name)
                found = self._kernels[mangled] = Kernel(self, handle, mangled)
        return found

    def __getitem__(self, name: str) -> Kernel:
        return self.kernel(name)

    def _install_twins(self, twins: Mapping[str, Callable] | None) -> None:
        """Register sim twins (ignored by the cuda backend, where the real code runs)."""
        if not twins or self._backend.name != "sim":
            return
        for name, fn in twins.items():
            if not callable(fn):
                raise TypeError(f"sim_kernels[{name!r}] must be a function "
                                f"fn(grid, block, *args), not {type(fn).__name__}")
            err, = self._backend.driver.simSetKernelTwin(self.kernel(name)._handle, fn)
            if err:
                fail(self._backend, err, "simSetKernelTwin")


# -- libraries ----------------------------------------------------------------------------

class Library(_Code):
    """Device code loaded for every context (cuLibraryLoadData). Make one with
    `from_source`, `from_file` or `from_bytes`; get kernels with ``lib.kernel(name)`` or
    ``lib[name]``. ``sim_kernels`` maps kernel names to Python twins, which the sim runs
    (``fn(grid, block, *args)``, see docs/kernels.md); the cuda backend ignores them."""

    _param_info_name = "cuKernelGetParamInfo"
    _get_kernel_name = "cuLibraryGetKernel"

    def __init__(self, data: bytes, *, names: Mapping[str, str] | None = None,
                 sim_kernels: Mapping[str, Callable] | None = None) -> None:
        image = _image_from(data)
        backend = _driver.active()
        drv = backend.driver
        err, handle = drv.cuLibraryLoadData(image, None, None, 0, None, None, 0)
        if err:
            fail(backend, err, "cuLibraryLoadData",
                 hint="the sim reads cubins and PTX, not fatbins" if backend.name == "sim"
                 and int(err) == 801 else "")
        self._setup(backend, names or {})
        self._handle = handle
        self._used: weakref.WeakSet[Context] = weakref.WeakSet()
        self._finalizer = weakref.finalize(self, _unload_library, drv, handle, self._used)
        self._finalizer.atexit = False
        self._install_twins(sim_kernels)

    @property
    def handle(self) -> int:
        """The CUlibrary as an integer."""
        return int(self._handle)

    @property
    def kernel_names(self) -> list[str]:
        """The (mangled) names of every kernel in the library."""
        self._check("Library.kernel_names")
        drv = self._backend.driver
        err, count = drv.cuLibraryGetKernelCount(self._handle)
        if err:
            fail(self._backend, err, "cuLibraryGetKernelCount")
        err, handles = drv.cuLibraryEnumerateKernels(count, self._handle)
        if err:
            fail(self._backend, err, "cuLibraryEnumerateKernels")
        names = []
        for handle in handles:
            err, name = drv.cuKernelGetName(handle)
            if err:
                fail(self._backend, err, "cuKernelGetName")
            names.append(name.decode() if isinstance(name, bytes) else str(name))
        return sorted(names)

    # -- what Kernel asks of its owner ----------------------------------------------------

    def _get_kernel(self, name: bytes):
        return self._backend.driver.cuLibraryGetKernel(self._handle, name)

    def _param_info(self, handle, index: int):
        return self._backend.driver.cuKernelGetParamInfo(handle, index)

    def _attribute(self, handle, attribute, device: Device) -> int:
        err, value = self._backend.driver.cuKernelGetAttribute(attribute, handle, device._handle)
        if err:
            fail(self._backend, err, "cuKernelGetAttribute")
        return int(value)

    def _set_attribute(self, handle, attribute, value: int, device: Device) -> None:
        err, = self._backend.driver.cuKernelSetAttribute(attribute, value, handle,
                                                         device._handle)
        if err:
            fail(self._backend, err, "cuKernelSetAttribute")

    def _home_context(self) -> None:
        return None  # launches go wherever their stream is

    def _check_context(self, ctx: Context, kernel: str) -> None:
        return None

    def _used_in(self, ctx: Context) -> None:
        self._used.add(ctx)

    def _context_on(self, device: Device, operation: str) -> _MadeCurrent:
        """The current context when it is on ``device``, else the device's primary one."""
        return device._current_or_primary()._current(operation)

    # -- variables ------------------------------------------------------------------------

    def get_global(self, name: str, dtype: Any = np.uint8,
                   shape: int | tuple[int, ...] | None = None):
        """A `DeviceArray` view of the ``__device__`` (or ``__constant__``) variable
        ``name`` in the current context (each context has its own copy). ``dtype`` and
        ``shape`` say how to see its bytes (default: all of them as uint8)."""
        self._check("Library.get_global")
        ctx = working_context()
        with ctx._current("Library.get_global"):
            err, ptr, nbytes = self._backend.driver.cuLibraryGetGlobal(self._handle,
                                                                     name.encode())
        if err:
            fail(self._backend, err, "cuLibraryGetGlobal", ctx,
                 hint=f"no __device__ variable {name!r} in {self!r}" if int(err) == _NOT_FOUND
                 else "")
        self._used_in(ctx)
        return _variable_view(ctx, int(ptr), int(nbytes), dtype, shape, self, name)

    def get_managed(self, name: str, dtype: Any = np.uint8,
                    shape: int | tuple[int, ...] | None = None) -> np.ndarray:
        """A NumPy view of the ``__managed__`` variable ``name``: one copy for every context
        and device (cuLibraryGetManaged). Synchronize before reading what kernels wrote."""
        self._check("Library.get_managed")
        # Managed variables exist once the library is loaded into a context: ask in one.
        ctx = working_context()
        with ctx._current("Library.get_managed"):
            err, ptr, nbytes = self._backend.driver.cuLibraryGetManaged(self._handle,
                                                                      name.encode())
        if err:
            fail(self._backend, err, "cuLibraryGetManaged", ctx,
                 hint=f"no __managed__ variable {name!r} in {self!r}" if int(err) == _NOT_FOUND
                 else "")
        dtype, shape = _view_shape(int(nbytes), dtype, shape, name)
        return np.asarray(_HostView(int(ptr), shape, dtype, self))

    # -- unloading ------------------------------------------------------------------------

    def unload(self) -> None:
        """Unload the library once the work queued in every context that used it is done.
        Its kernels, launchers and variable views must not be used afterwards. Unloading
        twice does nothing; garbage collection unloads the same way."""
        if self._loaded:
            self._loaded = False
            self._finalizer()

    def __repr__(self) -> str:
        state = "" if self._loaded else " unloaded"
        return f"<Library {int(self._handle):#x} ({self._backend.name}){state}>"


def working_context() -> Context:
    """The current context, or (with none current) device 0's primary context, used without
    being made current: nothing here changes the caller's context stack."""
    return current_context() or Device(0).primary_context


def _unload_library(drv, handle, used: weakref.WeakSet) -> None:
    _synchronize_all(list(used))
    drv.cuLibraryUnload(handle)


def _synchronize_all(contexts: list[Context]) -> None:
    """Wait for the work of each context still alive; faults there are the users' of that
    work to see (the next call in the context raises them), not unload's."""
    for ctx in contexts:
        if ctx._state is ACTIVE:
            with ctx._activated("unload"):
                ctx._backend.driver.cuCtxSynchronize()


def _view_shape(nbytes: int, dtype: Any, shape, name: str):
    dtype = np.dtype(dtype)
    if shape is None:
        if nbytes % dtype.itemsize:
            raise ValueError(f"variable {name!r} is {nbytes} bytes, not a whole number of "
                             f"{dtype} ({dtype.itemsize} bytes); pass shape=")
        shape = (nbytes // dtype.itemsize,)
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    need = int(np.prod(shape)) * dtype.itemsize
    if need > nbytes:
        raise ValueError(f"variable {name!r} is {nbytes} bytes; a {shape} view of {dtype} "
                         f"needs {need}")
    return dtype, shape


def _variable_view(ctx: Context, ptr: int, nbytes: int, dtype, shape, owner, name: str):
    from .memory import DeviceArray
    dtype, shape = _view_shape(nbytes, dtype, shape, name)
    return DeviceArray._make(ctx, ptr, shape, dtype, None, None, owner)


class _HostView:
    """The base of a NumPy view of managed memory: keeps the library loaded while it lives."""

    __slots__ = ("__array_interface__", "library")

    def __init__(self, ptr: int, shape, dtype: np.dtype, library: Library):
        self.__array_interface__ = {"data": (ptr, False), "shape": shape,
                                    "typestr": dtype.str, "version": 3}
        self.library = library


# -- modules (context-bound, the pre-12.0 way) --------------------------------------------

class Module(_Code):
    """Device code loaded into one context (cuModuleLoadData): the current context when it
    is made (device 0's primary context when none is). Its kernels run only in that
    context. Prefer `Library`, which works in every context; `Module` exists for code that
    needs per-context modules."""

    _param_info_name = "cuFuncGetParamInfo"
    _get_kernel_name = "cuModuleGetFunction"

    def __init__(self, data: bytes, *, names: Mapping[str, str] | None = None,
                 sim_kernels: Mapping[str, Callable] | None = None) -> None:
        image = _image_from(data)
        ctx = working_context()
        backend = ctx._backend
        with ctx._current("Module"):
            err, handle = backend.driver.cuModuleLoadData(image)
        if err:
            fail(backend, err, "cuModuleLoadData", ctx)
        self._setup(backend, names or {})
        self._ctx = ctx
        self._handle = handle
        self._finalizer = weakref.finalize(self, _unload_module, backend.driver, handle, ctx)
        self._finalizer.atexit = False
        self._install_twins(sim_kernels)

    @property
    def context(self) -> Context:
        return self._ctx

    @property
    def kernel_names(self) -> list[str]:
        raise NotSupportedError(801, "Module.kernel_names", "",
                                "the driver lists kernels of libraries only; use a Library")

    def _check(self, operation: str) -> None:
        super()._check(operation)
        self._ctx._check(operation)

    def _get_kernel(self, name: bytes):
        return self._backend.driver.cuModuleGetFunction(self._handle, name)

    def _param_info(self, handle, index: int):
        return self._backend.driver.cuFuncGetParamInfo(handle, index)

    def _attribute(self, handle, attribute, device: Device) -> int:
        err, value = self._backend.driver.cuFuncGetAttribute(attribute, handle)
        if err:
            fail(self._backend, err, "cuFuncGetAttribute", self._ctx)
        return int(value)

    def _set_attribute(self, handle, attribute, value: int, device: Device) -> None:
        err, = self._backend.driver.cuFuncSetAttribute(handle, attribute, value)
        if err:
            fail(self._backend, err, "cuFuncSetAttribute", self._ctx)

    def _home_context(self) -> Context:
        return self._ctx

    def _check_context(self, ctx: Context, kernel: str) -> None:
        if ctx is not self._ctx:
            raise ValueError(
                f"kernel {kernel!r} of {self!r} runs only in {self._ctx!r} (a module is "
                f"loaded into one context), but the launch's stream is in {ctx!r}; load the "
                "code as a cuctx.Library to launch it in every context")

    def _used_in(self, ctx: Context) -> None:
        return None  # its one context is synchronized before unloading

    def _context_on(self, device: Device, operation: str) -> _MadeCurrent:
        return self._ctx._current(operation)

    def get_global(self, name: str, dtype: Any = np.uint8,
                   shape: int | tuple[int, ...] | None = None):
        """A `DeviceArray` view of the variable ``name`` in the module's context."""
        self._check("Module.get_global")
        err, ptr, nbytes = self._backend.driver.cuModuleGetGlobal(self._handle, name.encode())
        if err:
            fail(self._backend, err, "cuModuleGetGlobal", self._ctx,
                 hint=f"no variable {name!r} in {self!r}" if int(err) == _NOT_FOUND else "")
        return _variable_view(self._ctx, int(ptr), int(nbytes), dtype, shape, self, name)

    def unload(self) -> None:
        """Unload once the module's context has finished its queued work."""
        if self._loaded:
            self._loaded = False
            self._finalizer()

    def __repr__(self) -> str:
        state = "" if self._loaded else " unloaded"
        return f"<Module {int(self._handle):#x} in {self._ctx!r}{state}>"


def _unload_module(drv, handle, ctx: Context) -> None:
    if ctx._state is not ACTIVE:
        return  # the driver unloaded it with the context; it must not see the handle
    with ctx._activated("Module.unload"):
        ctx._backend.driver.cuCtxSynchronize()
        drv.cuModuleUnload(handle)


__all__ = ["BlockSizeSuggestion", "CompileError", "Kernel", "KernelAttributes", "Library",
           "Module"]
