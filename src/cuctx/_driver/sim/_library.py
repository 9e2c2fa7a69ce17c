"""Libraries, modules and kernel launches of the sim.

Images are read, never run: kernel names and parameter layouts come from the cubin's ELF
(`cuctx._cubin`, the same reader the cuda backend's tests check against the driver) or from
PTX ``.entry`` declarations; ``__device__``/``__constant__``/``__managed__`` variables and
per-kernel resources (registers, static shared memory, ``__launch_bounds__``) from the
cubin's symbol table, sections and ``.nv.info`` records. Fatbins are not unpacked: loading
one answers CUDA_ERROR_NOT_SUPPORTED.

Behaviour comes from a *twin*: a Python function registered for a kernel with the sim-only
`simSetKernelTwin`. A launch copies the parameter bytes (as the driver does, at call time)
and queues an operation on the stream (`_enqueue`) that calls
``twin(grid, block, *args)`` when the stream runs (`_twins`: decoding, `SimPointer`, faults).
Twins reach memory only through `SimPointer`, which checks every access against the live
allocations: outside them is the sticky CUDA_ERROR_ILLEGAL_ADDRESS, a misaligned typed view
CUDA_ERROR_MISALIGNED_ADDRESS. A twin that raises anything else fails the launch with the
sticky CUDA_ERROR_LAUNCH_FAILED (as a trapped kernel does) and a `SimTwinWarning` carrying
its traceback; `simGetFaultCause` gives the exception and the twin's file and line.

Variables: a library's ``__device__`` and ``__constant__`` variables get their own copy in
each context, allocated from the memory model on first use in that context (as lazy
loading does) and freed with the context or by unload. ``__managed__`` variables have one
copy for the whole process, in host memory the sim owns, so the host reads them at the
pointer the driver hands out, as it does with managed memory on a GPU.
"""

from __future__ import annotations

import ctypes
import itertools
import re
import struct
from dataclasses import dataclass, field

import numpy as np
from cuda.bindings.driver import (CUdevice_attribute, CUdeviceptr, CUfunction,
                                  CUfunction_attribute, CUkernel, CUlaunchAttributeID,
                                  CUlibrary, CUmodule, CUresult)

from ... import _cubin
from ._common import (ILLEGAL_ADDRESS, INVALID_DEVICE, INVALID_VALUE, NOT_INITIALIZED,
                      NOT_SUPPORTED, OK)
from ._twins import run_twin

INVALID_IMAGE = CUresult.CUDA_ERROR_INVALID_IMAGE
INVALID_PTX = CUresult.CUDA_ERROR_INVALID_PTX
INVALID_HANDLE = CUresult.CUDA_ERROR_INVALID_HANDLE
NOT_FOUND = CUresult.CUDA_ERROR_NOT_FOUND
OUT_OF_RESOURCES = CUresult.CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES
COOPERATIVE_TOO_LARGE = CUresult.CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE
OUT_OF_MEMORY = CUresult.CUDA_ERROR_OUT_OF_MEMORY

A = CUdevice_attribute
F = CUfunction_attribute
LAUNCH_COST_NS = 2000  # what one launch costs on the virtual clock
_STO_CUDA_MANAGED = 0x04  # st_other bit of a __managed__ variable's symbol
_STT_OBJECT = 1
_EIATTR_REGCOUNT = 0x2F
_EIATTR_FRAME_SIZE = 0x11
_EIATTR_MAX_THREADS = 0x05
_RESERVED_SHARED = 1024
_VARIABLE_SECTIONS = (".nv.global", ".nv.global.init", ".nv.constant3")
_PTX_GLOBAL_RE = re.compile(
    r"^\s*(?:\.visible\s+|\.extern\s+)?\.(global|const)\s+(?:\.align\s+(\d+)\s+)?\.(\w+)\s+"
    r"([A-Za-z_$%][\w$%]*)\s*(?:\[(\d+)\])?", re.MULTILINE)
_PTX_VERSION_RE = re.compile(r"^\s*\.version\s+(\d+)\.(\d+)", re.MULTILINE)
_PTX_TARGET_RE = re.compile(r"^\s*\.target\s+sm_(\d+)", re.MULTILINE)


# -- what an image holds ------------------------------------------------------------------

@dataclass
class KernelImage:
    info: _cubin.KernelInfo
    regs: int = 0
    shared: int = 0  # static shared memory, bytes
    local: int = 0  # local memory per thread, bytes
    max_threads: int = 1024  # from __launch_bounds__


@dataclass
class Image:
    kind: str  # "cubin" or "ptx"
    arch: int  # e.g. 90
    ptx_version: int
    kernels: dict[str, KernelImage]
    variables: dict[str, bytes]  # __device__ / __constant__: name -> initial bytes
    managed: dict[str, bytes]  # __managed__: name -> initial bytes
    const_size: int = 0


def read_image(data: bytes) -> tuple[CUresult, Image | None]:
    """What the sim needs from a cubin or PTX image, or the driver's error for it."""
    if _cubin.is_cubin(data):
        try:
            return OK, _read_cubin(data)
        except ValueError:
            return INVALID_IMAGE, None
    if _cubin.is_fatbin(data):
        return NOT_SUPPORTED, None
    if _cubin.is_ptx(data):
        try:
            return OK, _read_ptx(data)
        except ValueError:
            return INVALID_PTX, None
    return INVALID_IMAGE, None


def _read_cubin(data: bytes) -> Image:
    layouts = _cubin.read_kernels(data)
    ehdr = _cubin._EHDR.unpack_from(data, 0)
    flags, shoff, shnum, shstrndx = ehdr[7], ehdr[6], ehdr[12], ehdr[13]
    # Newer cubins keep the SM version in bits 8-15 of e_flags, older ones in bits 0-7.
    arch = flags & 0xFF if flags & 0xFF >= 0x14 else (flags >> 8) & 0xFF
    sections = [_cubin._SHDR.unpack_from(data, shoff + i * _cubin._SHDR.size)
                for i in range(shnum)]
    names_table = _cubin._section_data(data, sections[shstrndx], "section names")
    names = [_cubin._cstr(names_table, sh[0], "section name") for sh in sections]
    by_name = dict(zip(names, sections))
    kernels = {name: KernelImage(info) for name, info in layouts.items()}
    variables, managed = {}, {}
    symbols = list(_symbols(data, sections))
    for index, (name, info, other, shndx, value, size) in enumerate(symbols):
        if info & 0xF == _STT_OBJECT and 0 < shndx < len(sections) \
                and names[shndx] in _VARIABLE_SECTIONS:
            if value + size > sections[shndx][5]:  # sh_size: a variable lies inside its section
                raise ValueError(f"malformed cubin: variable {name!r} ends past its section")
            body = _cubin._section_data(data, sections[shndx], names[shndx])
            initial = body[value:value + size] if body else b""
            initial = initial.ljust(size, b"\0")
            (managed if other & _STO_CUDA_MANAGED else variables)[name] = initial
    for attr, payload in _records(data, by_name.get(".nv.info")):
        if attr in (_EIATTR_REGCOUNT, _EIATTR_FRAME_SIZE) and len(payload) == 8:
            sym, value = struct.unpack("<II", payload)
            kernel = kernels.get(symbols[sym][0]) if sym < len(symbols) else None
            if kernel is not None:
                setattr(kernel, "regs" if attr == _EIATTR_REGCOUNT else "local", value)
    # On sm_80 and later a kernel's shared section starts with 1 KiB the system reserves,
    # which the driver does not count as the kernel's static shared memory.
    reserved = _RESERVED_SHARED if ".nv.shared.reserved.0" in by_name else 0
    for name, kernel in kernels.items():
        shared = by_name.get(f".nv.shared.{name}")
        kernel.shared = max(shared[5] - reserved, 0) if shared else 0
        for attr, payload in _records(data, by_name.get(f".nv.info.{name}")):
            if attr == _EIATTR_MAX_THREADS and len(payload) == 12:
                x, y, z = struct.unpack("<III", payload)
                kernel.max_threads = x * y * z
    const = by_name.get(".nv.constant3")
    return Image("cubin", arch, arch, kernels, variables, managed, const[5] if const else 0)


def _symbols(data: bytes, sections: list[tuple]):
    for sh in sections:
        if sh[1] != _cubin._SHT_SYMTAB:
            continue
        strtab = _cubin._section_data(data, sections[sh[6]], "symbol names")
        table = _cubin._section_data(data, sh, "symbol table")
        for off in range(0, len(table) - _cubin._SYM.size + 1, _cubin._SYM.size):
            st_name, info, other, shndx, value, size = _cubin._SYM.unpack_from(table, off)
            yield _cubin._cstr(strtab, st_name, "symbol"), info, other, shndx, value, size


def _records(data: bytes, section):
    if section is None:
        return ()
    body = _cubin._section_data(data, section, ".nv.info")
    return _cubin._nv_info_records(".nv.info", body)


def _read_ptx(data: bytes) -> Image:
    text = _cubin._ptx_text(data)
    layouts = _cubin.ptx_layouts(text)
    version = _PTX_VERSION_RE.search(text)
    target = _PTX_TARGET_RE.search(text)
    arch = int(target.group(1)) if target else 0
    variables = {}
    for match in _PTX_GLOBAL_RE.finditer(_cubin._PTX_COMMENT_RE.sub("", text)):
        elem = _cubin._PTX_TYPE_SIZES.get(match.group(3), 1)
        count = int(match.group(5)) if match.group(5) else 1
        variables[match.group(4)] = bytes(elem * count)  # initializers are not parsed
    kernels = {name: KernelImage(info) for name, info in layouts.items()}
    ptx = int(version.group(1)) * 10 + int(version.group(2)) if version else 0
    return Image("ptx", arch, ptx, kernels, variables, {})


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
    """cuLibrary*, cuKernel*, cuModule*, cuFunc*, cuLaunchKernel(Ex), cuOccupancy*."""

    def _init_libraries(self):
        self._library_handles = itertools.count(0x11B0_0000_0100, 0x100)
        self._libraries: dict[int, SimLibrary] = {}
        self._modules: dict[int, SimModule] = {}
        self._kernels: dict[int, SimKernel] = {}  # CUkernel and CUfunction handles
        self._managed_ranges: list[tuple[int, int, np.ndarray]] = []

    # -- memory a twin may touch ----------------------------------------------------------

    def _managed_at(self, ptr: int):
        for start, end, data in self._managed_ranges:
            if start <= ptr < end:
                return start, end, data
        return None

    def _kernel_view(self, ptr: int, nbytes: int):
        found = self._managed_at(ptr)
        if found is None:
            return self._device_view(ptr, nbytes)
        start, end, data = found
        if ptr + nbytes > end:
            return ILLEGAL_ADDRESS, None
        return OK, data[ptr - start:ptr - start + nbytes]

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
            block.data[:len(data)] = np.frombuffer(data, np.uint8)
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
        if not self._initialized:
            return NOT_INITIALIZED, None
        if not isinstance(code, (bytes, bytearray, memoryview)):
            return INVALID_VALUE, None  # cuctx hands over the bytes; the sim reads nothing else
        return read_image(bytes(code))

    def cuLibraryLoadData(self, code, jitOptions, jitOptionsValues, numJitOptions,
                          libraryOptions, libraryOptionValues, numLibraryOptions):
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
        handles = [CUkernel(k.handle) for k in found.kernels.values()][:int(numKernels)]
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
        return (OK, CUdeviceptr(array.__array_interface__["data"][0]),
                len(found.image.managed[_text(name)]))

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
            F.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: _max_threads(image, spec),
            F.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES: image.shared,
            F.CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES: owner.const_size,
            F.CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES: image.local,
            F.CU_FUNC_ATTRIBUTE_NUM_REGS: image.regs,
            F.CU_FUNC_ATTRIBUTE_PTX_VERSION: owner.ptx_version,
            F.CU_FUNC_ATTRIBUTE_BINARY_VERSION: owner.arch,
            F.CU_FUNC_ATTRIBUTE_CACHE_MODE_CA: 0,
            F.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: _dynamic_limit(kernel, device, spec),
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
        if not 0 <= value <= spec[A.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN] \
                - kernel.image.shared:
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

    # -- launches -------------------------------------------------------------------------

    def cuLaunchKernel(self, f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ,
                       sharedMemBytes, hStream, kernelParams, extra):
        grid = (int(gridDimX), int(gridDimY), int(gridDimZ))
        block = (int(blockDimX), int(blockDimY), int(blockDimZ))
        return (self._launch(f, grid, block, int(sharedMemBytes), hStream, kernelParams,
                             extra, None, False),)

    def cuLaunchCooperativeKernel(self, f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY,
                                  blockDimZ, sharedMemBytes, hStream, kernelParams):
        grid = (int(gridDimX), int(gridDimY), int(gridDimZ))
        block = (int(blockDimX), int(blockDimY), int(blockDimZ))
        return (self._launch(f, grid, block, int(sharedMemBytes), hStream, kernelParams,
                             None, None, True),)

    def cuLaunchKernelEx(self, config, f, kernelParams, extra):
        cluster, cooperative = None, False
        for attr in list(config.attrs)[:int(config.numAttrs)]:
            if attr.id == CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION:
                dim = attr.value.clusterDim
                cluster = (int(dim.x), int(dim.y), int(dim.z))
            elif attr.id == CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_COOPERATIVE:
                cooperative = bool(attr.value.cooperative)
            else:
                return (NOT_SUPPORTED,)
        grid = (int(config.gridDimX), int(config.gridDimY), int(config.gridDimZ))
        block = (int(config.blockDimX), int(config.blockDimY), int(config.blockDimZ))
        return (self._launch(f, grid, block, int(config.sharedMemBytes), config.hStream,
                             kernelParams, extra, cluster, cooperative),)

    def _launch(self, f, grid, block, shared, hStream, kernelParams, extra, cluster,
                cooperative) -> CUresult:
        if not self._initialized:
            return NOT_INITIALIZED
        kernel = self._kernel(f)
        if kernel is None:
            return INVALID_HANDLE
        err, ctx = self._stream_context(hStream)
        if err:
            return err
        if isinstance(kernel.owner, SimModule) and kernel.owner.ctx is not ctx:
            return INVALID_HANDLE  # a CUfunction works only in its module's context
        err = self._check_config(kernel, ctx.device, grid, block, shared, cluster, cooperative)
        if err:
            return err
        if extra not in (None, 0):
            return NOT_SUPPORTED  # cuctx passes parameters through kernelParams only
        err, raw = _read_params(kernel.image.info.params, kernelParams)
        if err:
            return err
        if kernel.twin is None:
            return NOT_SUPPORTED  # the sim has nothing to run (cuctx says so before this)
        if isinstance(kernel.owner, SimLibrary) and ctx.handle not in kernel.owner.copies \
                and kernel.owner.image.variables:
            with self._lock:  # the library's variables come to this context with its first use
                copies = self._allocate_variables(ctx, kernel.owner.image.variables)
                if copies is None:
                    return OUT_OF_MEMORY
                kernel.owner.copies[ctx.handle] = copies
        twin, kinds, name = kernel.twin, kernel.kinds, kernel.name

        def run():
            return run_twin(self, ctx, name, twin, grid, block, kinds, raw)
        return self._enqueue(hStream, run, cost_ns=LAUNCH_COST_NS, label=f"kernel {name}")

    def _check_config(self, kernel: SimKernel, device: int, grid, block, shared, cluster,
                      cooperative) -> CUresult:
        """The driver's own checks of a launch (cuctx makes them first, with clear errors)."""
        spec = self._devices[device].attributes
        limits_grid = (spec[A.CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X],
                       spec[A.CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y],
                       spec[A.CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z])
        limits_block = (spec[A.CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X],
                        spec[A.CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y],
                        spec[A.CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z])
        if any(not 1 <= g <= m for g, m in zip(grid, limits_grid)) \
                or any(not 1 <= b <= m for b, m in zip(block, limits_block)):
            return INVALID_VALUE
        threads = block[0] * block[1] * block[2]
        if threads > spec[A.CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK]:
            return INVALID_VALUE
        if threads > _max_threads(kernel.image, spec):
            return OUT_OF_RESOURCES
        if shared > _dynamic_limit(kernel, device, spec):
            return INVALID_VALUE
        if cluster is not None:
            if not spec.get(A.CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH) \
                    or any(c < 1 or g % c for c, g in zip(cluster, grid)) \
                    or cluster[0] * cluster[1] * cluster[2] > 8:
                return INVALID_VALUE
        if cooperative:
            per_sm = occupancy(kernel, threads, shared, spec)
            most = per_sm * spec[A.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT]
            if grid[0] * grid[1] * grid[2] > most:
                return COOPERATIVE_TOO_LARGE
        return OK

    # -- occupancy ------------------------------------------------------------------------

    def _occupancy_kernel(self, func):
        err, ctx = self._work_context()
        if err:
            return err, None, None
        kernel = self._kernel(func)
        if kernel is None:
            return INVALID_HANDLE, None, None
        return OK, kernel, self._devices[ctx.device].attributes

    def cuOccupancyMaxActiveBlocksPerMultiprocessor(self, func, blockSize, dynamicSMemSize):
        err, kernel, spec = self._occupancy_kernel(func)
        if err:
            return (err, None)
        return (OK, occupancy(kernel, int(blockSize), int(dynamicSMemSize), spec))

    def cuOccupancyMaxPotentialBlockSize(self, func, blockSizeToDynamicSMemSize,
                                         dynamicSMemSize, blockSizeLimit):
        err, kernel, spec = self._occupancy_kernel(func)
        if err:
            return (err, None, None)
        if blockSizeToDynamicSMemSize not in (None, 0):
            return (NOT_SUPPORTED, None, None)
        limit = _max_threads(kernel.image, spec)
        if int(blockSizeLimit) > 0:
            limit = min(limit, int(blockSizeLimit))
        best_size, best_warps = 0, -1
        for size in range(limit - limit % 32 or limit, 0, -32):
            warps = occupancy(kernel, size, int(dynamicSMemSize), spec) * (-(-size // 32))
            if warps > best_warps:
                best_size, best_warps = size, warps
        blocks = occupancy(kernel, best_size, int(dynamicSMemSize), spec)
        return (OK, blocks * spec[A.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT], best_size)


# -- the arithmetic of limits -------------------------------------------------------------

def _max_threads(image: KernelImage, spec: dict) -> int:
    """Threads per block the kernel can run with: its launch bounds, the device's limit and
    what its registers allow (allocated per warp in units of 256)."""
    limit = min(image.max_threads, spec[A.CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK])
    if image.regs:
        per_warp = -(-image.regs * 32 // 256) * 256
        limit = min(limit, spec[A.CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK] // per_warp * 32)
    return limit


def _dynamic_limit(kernel: SimKernel, device: int, spec: dict) -> int:
    """Dynamic shared memory a launch may ask for: 48 KiB less the static part, unless the
    user raised CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES."""
    default = spec[A.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK] - kernel.image.shared
    return kernel.max_dynamic_shared.get(device, max(default, 0))


def occupancy(kernel: SimKernel, threads: int, dynamic_shared: int, spec: dict) -> int:
    """Resident blocks per multiprocessor, limited by warps, blocks, registers and shared
    memory (the CUDA occupancy calculator's rules for sm_90)."""
    if threads <= 0 or threads > _max_threads(kernel.image, spec):
        return 0
    warps = -(-threads // 32)
    limits = [spec[A.CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR] // 32 // warps,
              spec[A.CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR]]
    if kernel.image.regs:
        per_warp = -(-kernel.image.regs * 32 // 256) * 256
        limits.append(spec[A.CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR]
                      // per_warp // warps)
    shared = kernel.image.shared + dynamic_shared
    if shared:
        per_block = -(-(shared + spec[A.CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK])
                      // 128) * 128
        limits.append(spec[A.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR] // per_block)
    return max(min(limits), 0)


def _read_params(params, kernelParams) -> tuple[CUresult, list[bytes] | None]:
    """Copy each parameter's bytes from the ``void**`` array at ``kernelParams`` (an int
    address, as cuctx passes it), as the driver does at launch time."""
    if not params:
        return OK, []
    if not isinstance(kernelParams, int) or kernelParams == 0:
        return INVALID_VALUE, None
    pointers = (ctypes.c_void_p * len(params)).from_address(kernelParams)
    if any(p is None for p in pointers):
        return INVALID_VALUE, None
    return OK, [ctypes.string_at(pointers[i], p.size) for i, p in enumerate(params)]


def _text(name) -> str:
    return name.decode() if isinstance(name, (bytes, bytearray)) else str(name)

