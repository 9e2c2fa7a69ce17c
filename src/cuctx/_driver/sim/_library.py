"""Libraries, modules and kernels of the sim.

Images are read, never run: `cuctx.devcode._image.read_image` gives kernel names, parameter layouts,
resources and variables from a cubin or PTX (fatbins are not unpacked: loading one answers
CUDA_ERROR_NOT_SUPPORTED). Behaviour comes from a kernel's *twin* (`_twins`, registered
through ``backend.sim.set_kernel_twin``); launches are in `_launches`, occupancy in
`_occupancy`.

Variables: a library's ``__device__`` and ``__constant__`` variables get their own copy in
each context, allocated from the memory model on first use in that context (as lazy
loading does) and freed with the context or by unload. ``__managed__`` variables have one
copy for the whole process, in host memory the sim owns, so the host reads them at the
pointer the driver hands out, as it does with managed memory on a GPU.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np
from cuda.bindings.driver import (
    CUdevice_attribute,
    CUdeviceptr,
    CUfunction,
    CUfunction_attribute,
    CUkernel,
    CUlibrary,
    CUmodule,
    CUresult,
)

from ...devcode._image import read_image
from ...devcode._kinds import is_fatbin, is_ptx
from ...devcode._layout import Image, KernelImage
from ._common import (
    ILLEGAL_ADDRESS,
    INVALID_DEVICE,
    INVALID_HANDLE,
    INVALID_IMAGE,
    INVALID_PTX,
    INVALID_VALUE,
    JIT_COMPILER_NOT_FOUND,
    NOT_FOUND,
    NOT_INITIALIZED,
    NOT_SUPPORTED,
    OK,
    OUT_OF_MEMORY,
)
from ._occupancy import dynamic_limit, max_threads

A = CUdevice_attribute
F = CUfunction_attribute


# -- the objects behind the handles -------------------------------------------------------


@dataclass(eq=False)
class SimLibrary:
    handle: int
    image: Image
    kernels: dict = field(default_factory=dict)  # name -> SimKernel
    copies: dict = field(default_factory=dict)  # context handle -> {name: Block}
    managed: dict = field(default_factory=dict)  # name -> ndarray (host memory)
    unloaded: bool = False


@dataclass(eq=False)
class SimModule:
    handle: int
    image: Image
    ctx: object
    functions: dict = field(default_factory=dict)  # name -> SimKernel
    blocks: dict = field(default_factory=dict)  # name -> Block
    managed: dict = field(default_factory=dict)
    unloaded: bool = False


@dataclass(eq=False)
class SimKernel:
    """A CUkernel (owner is a SimLibrary) or a CUfunction (owner is a SimModule)."""

    handle: int
    name: str
    owner: object
    image: KernelImage
    twin: object = None
    kinds: list = field(default_factory=list)
    max_dynamic_shared: dict = field(default_factory=dict)  # device -> bytes (set by the user)

    @property
    def gone(self) -> bool:
        return self.owner.unloaded


class LibraryModel:
    """cuLibrary*, cuKernel*, cuModule*, cuFunc* (attributes and parameters)."""

    def _init_libraries(self):
        self._library_handles = itertools.count(0x11B0_0000_0100, 0x100)
        self._libraries: dict[int, SimLibrary] = {}
        self._modules: dict[int, SimModule] = {}
        self._kernels: dict[int, SimKernel] = {}  # CUkernel and CUfunction handles
        self._managed_ranges: list[tuple[int, int, np.ndarray]] = []
        self._twin_ctx = None  # the context of the twin running now (`_twins.run_twin`)

    # -- memory a twin may touch ----------------------------------------------------------

    def _managed_at(self, ptr: int):
        for start, end, data in self._managed_ranges:
            if start <= ptr < end:
                return start, end, data
        return None

    def _kernel_view(self, ptr: int, nbytes: int):
        """(CUresult, uint8 ndarray) of [ptr, ptr + nbytes) for the twin running now:
        managed memory anywhere; device memory within a live allocation, and of another
        device only with access (`_reach`), else an illegal address (and then, in place of
        the view, None or why in words)."""
        found = self._managed_at(ptr)
        if found is None:
            block = self._block_at(ptr)
            ctx = self._twin_ctx
            reach = "rw" if block is None or ctx is None else self._reach(ctx, block)
            if reach is None and block.pool is not None and not block.pool.default:
                return ILLEGAL_ADDRESS, (
                    f"memory of {self._owner_of(block)} from device {ctx.device} without "
                    f"access to its pool (pool.set_access(cuctx.Device({ctx.device}), 'rw') "
                    "grants it)"
                )
            if reach is None:
                return ILLEGAL_ADDRESS, (
                    f"memory of device {block.device} from device {ctx.device} without peer "
                    f"access (cuctx.Device({ctx.device}).enable_peer_access("
                    f"cuctx.Device({block.device})) grants it)"
                )
            return self._device_view(ptr, nbytes)
        start, end, data = found
        if ptr + nbytes > end:
            return ILLEGAL_ADDRESS, None
        return OK, data[ptr - start : ptr - start + nbytes]

    @staticmethod
    def _owner_of(block) -> str:
        return (
            "a host memory pool"
            if block.pool is not None and block.pool.location == "host"
            else f"device {block.device}"
        )

    def _extent(self, ptr: int) -> int:
        """Bytes from ``ptr`` to the end of its allocation (0 outside every one)."""
        found = self._managed_at(ptr)
        if found is not None:
            return found[1] - ptr
        # Work queued for a bigger allocation may still run after its block was reused for
        # a smaller one: what any not yet freed allocation covers is in reach.
        block = self._block_at(ptr)
        return max(block.base + block.reach() - ptr, 0) if block is not None else 0

    def _allocate_variables(self, ctx, initial: dict[str, bytes]):
        """A block per variable in ``ctx``, holding its initial bytes; None when out of
        memory."""
        blocks = {}
        for name, data in initial.items():
            block = self._new_block(max(len(data), 1), ctx.device, ctx)
            if block is None:
                for made in blocks.values():
                    self._drop_block(made)
                return None
            block.allocate(len(data), ctx)
            block.data[: len(data)] = np.frombuffer(data, np.uint8)
            blocks[name] = block
        return blocks

    def _make_managed(self, initial: dict[str, bytes]) -> dict:
        arrays = {}
        for name, data in initial.items():
            array = np.frombuffer(bytearray(data.ljust(max(len(data), 1), b"\0")), np.uint8)
            start = array.__array_interface__["data"][0]
            self._managed_ranges.append((start, start + len(data), array))
            arrays[name] = array
        return arrays

    def _drop_managed(self, arrays: dict) -> None:
        kept = {id(a) for a in arrays.values()}
        self._managed_ranges = [r for r in self._managed_ranges if id(r[2]) not in kept]

    def _release_context_resources(self, ctx):
        super()._release_context_resources(ctx)  # streams drained, then memory freed below us
        with self._lock:
            for library in self._libraries.values():
                library.copies.pop(ctx.handle, None)  # the memory model frees the blocks
            for module in [m for m in self._modules.values() if m.ctx is ctx]:
                self._unload_module(module, free_blocks=False)

    # -- loading --------------------------------------------------------------------------

    def _load(self, code) -> tuple[CUresult, Image | None]:
        """The parsed image, or the driver's error for it (fatbins are not unpacked)."""
        if not self._initialized:
            return NOT_INITIALIZED, None
        if not isinstance(code, (bytes, bytearray, memoryview)):
            return INVALID_VALUE, None  # cuctx hands over the bytes; the sim reads nothing else
        data = bytes(code)
        try:
            return OK, read_image(data)
        except ValueError:
            if is_fatbin(data):
                return NOT_SUPPORTED, None
            return (INVALID_PTX if is_ptx(data) else INVALID_IMAGE), None

    def cuLibraryLoadData(
        self,
        code,
        jitOptions,
        jitOptionsValues,
        numJitOptions,
        libraryOptions,
        libraryOptionValues,
        numLibraryOptions,
    ):
        err, image = self._load(code)
        if err:
            return (err, None)
        with self._lock:
            library = SimLibrary(next(self._library_handles), image)
            library.managed = self._make_managed(image.managed)
            for name, kernel in image.kernels.items():
                library.kernels[name] = self._new_kernel(name, library, kernel)
            self._libraries[library.handle] = library
        return (OK, CUlibrary(library.handle))

    def cuLinkCreate(self, numOptions, options, optionValues):
        """The sim has no linker of its own: cuctx links with nvJitLink, which runs on the
        CPU, and loads the cubin it makes. Asked for the driver's (nvJitLink is not
        installed), the sim answers as a driver without its PTX JIT compiler library."""
        err, _ = self._work_context()
        return (err or JIT_COMPILER_NOT_FOUND, None)

    def _new_kernel(self, name: str, owner, kernel: KernelImage) -> SimKernel:
        sim_kernel = SimKernel(next(self._library_handles), name, owner, kernel)
        self._kernels[sim_kernel.handle] = sim_kernel
        return sim_kernel

    def _library(self, library) -> SimLibrary | None:
        found = self._libraries.get(int(library or 0))
        return None if found is None or found.unloaded else found

    def cuLibraryUnload(self, library):
        with self._lock:
            found = self._library(library)
            if found is None:
                return (INVALID_HANDLE,)
            found.unloaded = True
            del self._libraries[found.handle]
            for copies in found.copies.values():
                for block in copies.values():
                    if block.base in self._blocks:
                        self._drop_block(block)
            found.copies.clear()
            self._drop_managed(found.managed)
            for kernel in found.kernels.values():
                self._kernels.pop(kernel.handle, None)
        return (OK,)

    def cuLibraryGetKernel(self, library, name):
        found = self._library(library)
        if found is None:
            return (INVALID_HANDLE, None)
        kernel = found.kernels.get(_text(name))
        return (OK, CUkernel(kernel.handle)) if kernel else (NOT_FOUND, None)

    def cuLibraryGetKernelCount(self, lib):
        found = self._library(lib)
        return (OK, len(found.kernels)) if found else (INVALID_HANDLE, None)

    def cuLibraryEnumerateKernels(self, numKernels, lib):
        found = self._library(lib)
        if found is None:
            return (INVALID_HANDLE, None)
        handles = [CUkernel(k.handle) for k in found.kernels.values()][: int(numKernels)]
        return (OK, handles)

    def cuLibraryGetGlobal(self, library, name):
        found = self._library(library)
        if found is None:
            return (INVALID_HANDLE, None, None)
        key = _text(name)
        if key not in found.image.variables:
            return (NOT_FOUND, None, None)
        err, ctx = self._work_context()
        if err:
            return (err, None, None)
        with self._lock:
            copies = found.copies.get(ctx.handle)
            if copies is None:  # loaded into this context on first use, as lazy loading does
                copies = self._allocate_variables(ctx, found.image.variables)
                if copies is None:
                    return (OUT_OF_MEMORY, None, None)
                found.copies[ctx.handle] = copies
        block = copies[key]
        return (OK, CUdeviceptr(block.base), block.length)

    def cuLibraryGetManaged(self, library, name):
        found = self._library(library)
        if found is None:
            return (INVALID_HANDLE, None, None)
        array = found.managed.get(_text(name))
        if array is None:
            return (NOT_FOUND, None, None)
        return (
            OK,
            CUdeviceptr(array.__array_interface__["data"][0]),
            len(found.image.managed[_text(name)]),
        )

    # -- kernels --------------------------------------------------------------------------

    def _kernel(self, handle) -> SimKernel | None:
        kernel = self._kernels.get(int(handle or 0))
        return None if kernel is None or kernel.gone else kernel

    def cuKernelGetName(self, hfunc):
        kernel = self._kernel(hfunc)
        return (OK, kernel.name.encode()) if kernel else (INVALID_HANDLE, None)

    def cuKernelGetParamInfo(self, kernel, paramIndex):
        # The real driver answers INVALID_CONTEXT with no context current (seen on driver 580).
        err, _ = self._work_context()
        if err:
            return (err, None, None)
        return self._param_info(kernel, paramIndex)

    def cuFuncGetParamInfo(self, func, paramIndex):
        return self._param_info(func, paramIndex)

    def _param_info(self, handle, index):
        kernel = self._kernel(handle)
        if kernel is None:
            return (INVALID_HANDLE, None, None)
        params = kernel.image.info.params
        if not 0 <= int(index) < len(params):
            return (INVALID_VALUE, None, None)
        param = params[int(index)]
        return (OK, param.offset, param.size)

    def _attribute(self, kernel: SimKernel, attrib, device: int):
        image = kernel.image
        owner = kernel.owner.image
        spec = self._devices[device].attributes
        values = {
            F.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: max_threads(image, spec),
            F.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES: image.shared,
            F.CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES: owner.const_size,
            F.CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES: image.local,
            F.CU_FUNC_ATTRIBUTE_NUM_REGS: image.regs,
            F.CU_FUNC_ATTRIBUTE_PTX_VERSION: owner.ptx_version,
            F.CU_FUNC_ATTRIBUTE_BINARY_VERSION: owner.arch,
            F.CU_FUNC_ATTRIBUTE_CACHE_MODE_CA: 0,
            F.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: dynamic_limit(kernel, device, spec),
            F.CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT: -1,
            F.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED: 0,
        }
        value = values.get(attrib)
        return (OK, value) if value is not None else (INVALID_VALUE, None)

    def cuKernelGetAttribute(self, attrib, kernel, dev):
        found = self._kernel(kernel)
        if found is None:
            return (INVALID_HANDLE, None)
        if self._device(dev) is None:
            return (INVALID_DEVICE, None)
        return self._attribute(found, attrib, int(dev))

    def cuFuncGetAttribute(self, attrib, hfunc):
        found = self._kernel(hfunc)
        if found is None or not isinstance(found.owner, SimModule):
            return (INVALID_HANDLE, None)
        return self._attribute(found, attrib, found.owner.ctx.device)

    def _set_attribute(self, kernel: SimKernel, attrib, value: int, device: int):
        if attrib != F.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES:
            return (NOT_SUPPORTED,)  # the one attribute cuctx sets
        spec = self._devices[device].attributes
        if (
            not 0
            <= value
            <= spec[A.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN] - kernel.image.shared
        ):
            return (INVALID_VALUE,)
        kernel.max_dynamic_shared[device] = value
        return (OK,)

    def cuKernelSetAttribute(self, attrib, val, kernel, dev):
        found = self._kernel(kernel)
        if found is None:
            return (INVALID_HANDLE,)
        if self._device(dev) is None:
            return (INVALID_DEVICE,)
        return self._set_attribute(found, attrib, int(val), int(dev))

    def cuFuncSetAttribute(self, hfunc, attrib, value):
        found = self._kernel(hfunc)
        if found is None or not isinstance(found.owner, SimModule):
            return (INVALID_HANDLE,)
        return self._set_attribute(found, attrib, int(value), found.owner.ctx.device)

    # -- modules (context-bound) ----------------------------------------------------------

    def cuModuleLoadData(self, image):
        err, loaded = self._load(image)
        if err:
            return (err, None)
        err, ctx = self._work_context()
        if err:
            return (err, None)
        with self._lock:
            module = SimModule(next(self._library_handles), loaded, ctx)
            blocks = self._allocate_variables(ctx, loaded.variables)
            if blocks is None:
                return (OUT_OF_MEMORY, None)
            module.blocks = blocks
            module.managed = self._make_managed(loaded.managed)
            for name, kernel in loaded.kernels.items():
                module.functions[name] = self._new_kernel(name, module, kernel)
            self._modules[module.handle] = module
        return (OK, CUmodule(module.handle))

    def _module(self, hmod) -> SimModule | None:
        return self._modules.get(int(hmod or 0))

    def _unload_module(self, module: SimModule, free_blocks: bool) -> None:
        module.unloaded = True
        del self._modules[module.handle]
        if free_blocks:
            for block in module.blocks.values():
                if block.base in self._blocks:
                    self._drop_block(block)
        self._drop_managed(module.managed)
        for function in module.functions.values():
            self._kernels.pop(function.handle, None)

    def cuModuleUnload(self, hmod):
        with self._lock:
            module = self._module(hmod)
            if module is None:
                return (INVALID_HANDLE,)
            self._unload_module(module, free_blocks=True)
        return (OK,)

    def cuModuleGetFunction(self, hmod, name):
        module = self._module(hmod)
        if module is None:
            return (INVALID_HANDLE, None)
        function = module.functions.get(_text(name))
        return (OK, CUfunction(function.handle)) if function else (NOT_FOUND, None)

    def cuModuleGetGlobal(self, hmod, name):
        module = self._module(hmod)
        if module is None:
            return (INVALID_HANDLE, None, None)
        block = module.blocks.get(_text(name))
        if block is None:
            array = module.managed.get(_text(name))
            if array is None:
                return (NOT_FOUND, None, None)
            return (OK, CUdeviceptr(array.__array_interface__["data"][0]), array.size)
        return (OK, CUdeviceptr(block.base), block.length)


def _text(name) -> str:
    return name.decode() if isinstance(name, (bytes, bytearray)) else str(name)
