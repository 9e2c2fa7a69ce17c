"""Kernels: a `Kernel` of a `Library` or `Module` (cuctx.kernels._library), its parameter layout and
types, launch configurations (``kernel[grid, block]``), attributes and occupancy."""

from __future__ import annotations

import ctypes
import threading
import weakref
from typing import TYPE_CHECKING, Any, Callable, Mapping, NamedTuple

import numpy as np
from cuda.bindings.driver import CUfunction, CUfunction_attribute, CUoccupancyB2DSize

from . import _access, _dtypes
from ._launch_config import LaunchConfigError, check_cluster, driver_config, make_config
from ._launcher import Launcher, make_launcher
from ._plan import Packer
from .._resource import Resource
from ..devcode import _ptx
from .._calls import fail
from ..context import Context, context_for, in_context
from ..device import Device
from ..errors import INVALID_VALUE, NOT_SUPPORTED, NotSupportedError

if TYPE_CHECKING:
    from ._library import Library
    from ._module import Module

_F = CUfunction_attribute


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
    """cuOccupancyMaxPotentialBlockSize's answer, in its order: ``min_grid, block =
    kernel.suggest_block_size()``."""

    min_grid_size: int  # blocks needed to fill the device at that occupancy
    block_size: int  # threads per block with the highest occupancy


class _Limits(NamedTuple):
    max_threads: int
    static_shared: int
    max_dynamic_shared: int


# -- kernels ------------------------------------------------------------------------------


class Kernel(Resource):
    """A kernel of a `Library` (usable in every context) or of a `Module` (only in the
    module's context). Launch it with ``kernel[grid, block, shared_mem, stream](*args)`` or
    `cuctx.launch`; inspect it with `attributes`, `occupancy`, `suggest_block_size`."""

    # The Resource fields: ``_handle`` is the CUkernel (library) or CUfunction (module),
    # ``_ctx`` its owner's (None for a library's kernel: it runs in every context).
    __slots__ = (
        "name",
        "_owner",
        "_function",
        "_params",
        "_pack",
        "_limits_cache",
        "_checked",
        "_launchers",
        "_launch_memo",
        "_lock",
        "_access",
        "_access_modes",
        "_dtypes",
        "_launched",
        "_conditions",
        "__weakref__",
    )

    def __init__(self, owner: Library | Module, handle, name: str):
        self.name = name
        self._owner = owner
        self._backend = owner._backend
        self._ctx = owner._ctx
        self._handle = handle
        self._key = int(handle)
        # cuLaunchKernel takes a CUkernel where a CUfunction goes (the driver's documented cast).
        self._function = CUfunction(self._key)
        self._params: tuple | None = None
        self._pack = None
        self._limits_cache: dict[Device, _Limits] = {}
        self._checked: set = set()  # (Config, Device) pairs already validated
        self._launchers: dict = {}  # kernel[...] and launch() configurations -> Launcher
        # The compiled kernel[...]'s memo of the configuration asked for last:
        # (grid, block, shared_mem, stream, launcher), or None (cuctx/csrc/methods.c).
        self._launch_memo: tuple | None = None
        self._lock = threading.Lock()
        self._access: dict[int, str] | None = None  # set_access: parameter index -> mode
        self._access_modes: tuple[str, ...] | None = None  # cuctx.kernels._access.modes, once
        self._conditions: tuple | None = None  # cuctx.kernels._access.condition_params, once
        self._dtypes: dict[int, tuple[str, ...] | None] | None = None  # set_dtypes: index -> names
        # Every launcher made (cached or not): set_dtypes takes their fast paths back.
        self._launched: weakref.WeakSet[Launcher] = weakref.WeakSet()

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
            self._check(operation)
            query = self._owner._param_info
            params = []
            # The driver asks for a current context (INVALID_CONTEXT without one).
            home = self._ctx or context_for()
            with in_context(home, operation):
                while True:
                    err, offset, size = query(self._handle, len(params))
                    if err:
                        if int(err) == INVALID_VALUE:  # past the last parameter
                            break
                        fail(self._backend, err, self._owner._param_info_name)
                    params.append((int(offset), int(size)))
            self._params = tuple(params)
        return self._params

    def _packer(self) -> Packer:
        if self._pack is None:
            with self._lock:
                if self._pack is None:
                    types = _ptx.matching(self._owner._types.get(self.name), self.param_layout)
                    self._pack = Packer(self, self.param_layout, types)
        return self._pack

    # -- the arrays its pointer parameters take ---------------------------------------------

    def set_dtypes(self, by_index: Mapping[int, Any] | None = None, /, **by_name: Any) -> None:
        """Say which arrays a pointer parameter takes, over what its C type says: a dtype
        (``set_dtypes(x=np.int32)``), several (``x=(np.int32, np.uint32)``) or None (any
        array: the kernel reads whatever bytes it gets), by name (the names of the source
        cuctx compiled) or by index (``set_dtypes({1: np.int32})``). Other parameters keep
        theirs. For one launch, pass a view instead: ``arr.view(np.float32)``."""
        given = _dtypes.resolve(self, {**(by_index or {}), **by_name})
        with self._lock:
            self._dtypes = {**(self._dtypes or {}), **given}
            if self._pack is not None:
                self._pack.retype()
        for launcher in list(self._launched):  # their fast paths let the old dtypes through
            launcher._retyped()

    @property
    def dtypes(self) -> tuple[tuple[str, ...] | None, ...]:
        """The dtype names each parameter's arrays must have (`set_dtypes`, else the C type
        its source declares: ``float*`` -> ("float32",)); None: any array, or not a pointer."""
        return tuple(None if e is None else e.accepts for e in self._packer().expected())

    # -- how it uses its pointer parameters (for the race checker) --------------------------

    def set_access(self, by_index: Mapping[int, str] | None = None, /, **by_name: str) -> None:
        """Say how the kernel uses its pointer parameters: "r" (only reads), "w" (only
        writes) or "rw", by name (``set_access(x="r", y="w")``, the names of the source cuctx
        compiled) or by index (``set_access({0: "r", 1: "w"})``). Unnamed parameters keep
        what ``const`` in the source says, else "rw". `cuctx.racecheck` reads it."""
        given = _access.resolve(self, {**(by_index or {}), **by_name})
        self._access = {**(self._access or {}), **given}
        self._access_modes = None

    @property
    def access(self) -> tuple[str, ...]:
        """The mode of each parameter as the race checker sees it: the annotation
        (`set_access`), else ``const`` in the compiled source, else "rw"."""
        return _access.modes(self)

    # -- launching ------------------------------------------------------------------------

    def __getitem__(self, config) -> Launcher:
        """``kernel[grid, block]``, ``kernel[grid, block, shared_mem]`` or
        ``kernel[grid, block, shared_mem, stream]``, as CUDA C's ``<<<Dg, Db, Ns, S>>>``."""
        if not isinstance(config, tuple) or not 2 <= len(config) <= 4:
            raise TypeError(
                "use kernel[grid, block], kernel[grid, block, shared_mem] or "
                f"kernel[grid, block, shared_mem, stream], got kernel[{config!r}]"
            )
        return make_launcher(self, *config)

    def __call__(self, *args: Any, **kwargs: Any):
        name = self._owner._user_name(self.name)
        raise TypeError(
            f"a Kernel is launched with a configuration: lib[{name!r}][grid, block](*args) "
            f"(CUDA C's <<<grid, block>>>) or cuctx.launch(kernel, grid, block, *args); "
            f"kernel {name!r} was called without one"
        )

    def _check(self, operation: str) -> None:
        """The owner's check: it refuses an unloaded library or module (and, for a module,
        an unusable context)."""
        self._owner._check(operation)

    def _check_launchable(self, ctx: Context) -> None:
        self._check(f"launch of {self.name!r}")
        self._owner._check_context(ctx, self.name)
        sim = self._backend.sim
        if sim is not None:
            err, twin = sim.kernel_twin(self._handle)
            if not err and twin is None:
                raise NotSupportedError(
                    NOT_SUPPORTED,
                    f"launch of {self.name!r}",
                    "",
                    f"the sim cannot run kernel {self.name!r}: it has no Python twin. Register "
                    f"one when loading: sim_kernels={{{self._owner._user_name(self.name)!r}: "
                    "fn}, where fn(grid, block, *args) does what the kernel does",
                )

    # -- introspection --------------------------------------------------------------------

    def attributes(self, device: Device | int | None = None) -> KernelAttributes:
        """Registers, memory sizes, thread limit and versions of this kernel on ``device``
        (default: the current device; a Module's kernel: its context's device)."""
        device = self._device(device)
        get = self._owner._attribute
        values = {
            name: get(self._handle, getattr(_F, f"CU_FUNC_ATTRIBUTE_{name.upper()}"), device)
            for name in KernelAttributes._fields
        }
        return KernelAttributes(**values)

    def _device(self, device) -> Device:
        home = self._ctx
        if home is None:
            return context_for().device if device is None else Device(device)
        if device is not None and Device(device) is not home.device:
            raise ValueError(
                f"kernel {self.name!r} of {self._owner!r} exists only on "
                f"{home.device!r} (a module is loaded into one context), not on "
                f"{Device(device)!r}"
            )
        return home.device

    def _limits(self, device: Device) -> _Limits:
        limits = self._limits_cache.get(device)
        if limits is None:
            get = self._owner._attribute
            limits = self._limits_cache[device] = _Limits(
                get(self._handle, _F.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, device),
                get(self._handle, _F.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, device),
                get(self._handle, _F.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, device),
            )
        return limits

    def _raise_dynamic_shared(self, device: Device, nbytes: int) -> None:
        self._owner._set_attribute(
            self._handle, _F.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, nbytes, device
        )
        self._limits_cache[device] = self._limits(device)._replace(max_dynamic_shared=nbytes)

    def occupancy(self, block: int, shared_mem: int = 0, device: Device | int | None = None) -> int:
        """Blocks of ``block`` threads (with ``shared_mem`` bytes of dynamic shared memory)
        that one multiprocessor of ``device`` holds at once. A block size the kernel cannot
        run (0, or above its limit) raises `LaunchConfigError`."""
        device = self._device(device)
        block = _count(block, "block")
        shared_mem = _count(shared_mem, "shared_mem")
        if block < 1:
            raise LaunchConfigError(f"block size must be positive (threads per block), got {block}")
        most = self._limits(device).max_threads
        if block > most:
            raise LaunchConfigError(
                f"kernel {self.name!r} can run at most {most} threads per "
                f"block on {device!r}; a block of {block} never runs"
            )
        with self._owner._context_on(device, "Kernel.occupancy") as ctx:
            err, blocks = self._backend.driver.cuOccupancyMaxActiveBlocksPerMultiprocessor(
                self._function, block, shared_mem
            )
        if err:
            fail(self._backend, err, "cuOccupancyMaxActiveBlocksPerMultiprocessor", ctx)
        return int(blocks)

    def suggest_block_size(
        self,
        shared_mem: int | Callable[[int], int] = 0,
        device: Device | int | None = None,
        limit: int = 0,
    ) -> BlockSizeSuggestion:
        """The grid size that fills ``device`` and the block size with the highest
        occupancy (at most ``limit`` threads when given; 0: no limit), in the driver's order:
        ``min_grid_size, block_size``. ``shared_mem``: the bytes of dynamic shared memory a
        block takes, or a function of the block size that says (``lambda block: 4 *
        block``), which the driver calls for each size it tries (cuOccupancyMaxPotential-
        BlockSize's blockSizeToDynamicSMemSize)."""
        device = self._device(device)
        limit = _count(limit, "limit")
        callback = None
        if callable(shared_mem):
            callback = _SharedMemFor(shared_mem)
            shared_mem = 0
        shared_mem = _count(shared_mem, "shared_mem")
        with self._owner._context_on(device, "Kernel.suggest_block_size") as ctx:
            err, min_grid, block = self._backend.driver.cuOccupancyMaxPotentialBlockSize(
                self._function, callback and callback.pointer, shared_mem, limit
            )
        if callback is not None:
            callback.raise_failure()
        if err:
            fail(self._backend, err, "cuOccupancyMaxPotentialBlockSize", ctx)
        return BlockSizeSuggestion(int(min_grid), int(block))

    def available_dynamic_shared_memory(
        self, blocks_per_sm: int, block: int, device: Device | int | None = None
    ) -> int:
        """The most dynamic shared memory (bytes) each block of ``block`` threads may take
        while ``blocks_per_sm`` of them stay resident on one multiprocessor
        (cuOccupancyAvailableDynamicSMemPerBlock). More blocks than fit even without shared
        memory is a `LaunchConfigError`."""
        device = self._device(device)
        blocks_per_sm = _count(blocks_per_sm, "blocks_per_sm")
        fit = self.occupancy(block, 0, device)  # checks the block size too
        if not 1 <= blocks_per_sm <= fit:
            raise LaunchConfigError(
                f"{blocks_per_sm} blocks of {block} threads per multiprocessor: kernel "
                f"{self.name!r} fits 1 to {fit} of them on {device!r}"
            )
        with self._owner._context_on(device, "Kernel.available_dynamic_shared_memory") as ctx:
            err, nbytes = self._backend.driver.cuOccupancyAvailableDynamicSMemPerBlock(
                self._function, blocks_per_sm, block
            )
        if err:
            fail(self._backend, err, "cuOccupancyAvailableDynamicSMemPerBlock", ctx)
        return int(nbytes)

    def max_cluster_size(
        self, block: Any, shared_mem: int = 0, device: Device | int | None = None
    ) -> int:
        """The largest thread block cluster of this kernel (blocks of ``block`` threads,
        ``shared_mem`` bytes of dynamic shared memory each) that ``device`` can run: one
        whose blocks fit its GPCs at once (cuOccupancyMaxPotentialClusterSize)."""
        return self._cluster_query(
            "cuOccupancyMaxPotentialClusterSize", block, shared_mem, None, device
        )

    def max_active_clusters(
        self, cluster: Any, block: Any, shared_mem: int = 0, device: Device | int | None = None
    ) -> int:
        """How many clusters of ``cluster`` blocks (an int or 1-3 tuple) of ``block``
        threads are resident on ``device`` at once (cuOccupancyMaxActiveClusters)."""
        return self._cluster_query(
            "cuOccupancyMaxActiveClusters", block, shared_mem, cluster, device
        )

    def _cluster_query(self, call: str, block: Any, shared_mem: int, cluster: Any, device) -> int:
        device = self._device(device)
        # The answer does not depend on the grid, but the driver checks that it is made of
        # whole clusters: one cluster, or (the size to be found) a grid any size up to 16
        # blocks divides.
        config = make_config(
            _ANY_CLUSTER_GRID if cluster is None else cluster,
            block,
            _count(shared_mem, "shared_mem"),
            cluster,
            False,
        )
        threads = config.block[0] * config.block[1] * config.block[2]
        self.occupancy(threads, 0, device)  # a block size the kernel runs
        if cluster is not None:
            check_cluster(device, config.grid, config.cluster)
        elif not device.properties.cluster_launch:
            raise LaunchConfigError(
                f"{device!r} cannot launch thread block clusters "
                "(cluster_launch is 0; clusters need compute capability "
                "9.0)"
            )
        with self._owner._context_on(device, f"Kernel.{call}") as ctx:
            err, value = getattr(self._backend.driver, call)(
                self._function, driver_config(config, None)
            )
        if err:
            fail(self._backend, err, call, ctx)
        return int(value)

    def __repr__(self) -> str:
        return f"<Kernel {self.name!r} {int(self._handle):#x} of {self._owner!r}>"


_ANY_CLUSTER_GRID = 720720  # the least common multiple of 1..16


class _SharedMemFor:
    """A Python function of the block size as the C callback cuOccupancyMaxPotentialBlockSize
    calls (``size_t fn(int)``). An exception cannot cross the driver: the first one is kept,
    0 answered, and `raise_failure` raises it once the driver returned."""

    _TYPE = ctypes.CFUNCTYPE(ctypes.c_size_t, ctypes.c_int)

    def __init__(self, fn: Callable[[int], int]):
        self.failure: BaseException | None = None

        def call(block: int) -> int:
            if self.failure is not None:
                return 0
            try:
                nbytes = fn(block)
                return _count(nbytes, f"shared_mem({block})")
            except BaseException as exc:  # noqa: BLE001 - raised after the driver returns
                self.failure = exc
                return 0

        self._thunk = self._TYPE(call)  # kept alive as long as the driver may call it
        self.pointer = CUoccupancyB2DSize(ctypes.cast(self._thunk, ctypes.c_void_p).value)

    def raise_failure(self) -> None:
        if self.failure is not None:
            raise self.failure


def _count(value: Any, what: str) -> int:
    """A non-negative int argument (bools and floats are refused, not truncated)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{what} must be an int, got {value!r}")
    if value < 0:
        raise LaunchConfigError(f"{what} must be >= 0, got {value}")
    return int(value)
