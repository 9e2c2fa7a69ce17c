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
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping

import numpy as np

from .. import _driver
from ._kernel import BlockSizeSuggestion, Kernel, KernelAttributes
from .._lifetimes import finalize
from .._resource import Resource
from ..devcode import _kinds
from ..devcode._ptx import param_types
from ..devcode._twin_check import check_twin
from ._compiler import CompileError, Language, compile_source, declared_name, pick_arch
from ._link import link_pieces
from ..context import ACTIVE, Context, context_for, in_context
from .._calls import fail
from ..device import Device, devices
from ..errors import NOT_FOUND, NOT_SUPPORTED
from ._variables import _HostView, _variable_view, _view_shape

if TYPE_CHECKING:
    from typing import Self


# -- what Library and Module share --------------------------------------------------------


def _image_from(data: bytes | bytearray | memoryview) -> bytes:
    """The bytes to hand the driver: a cubin, a fatbin or NUL-terminated PTX."""
    if isinstance(data, str):
        data = data.encode()
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(
            f"device code must be bytes (a cubin, fatbin or PTX), not {type(data).__name__}"
        )
    data = bytes(data)
    kind = _kinds.kind_of(data)
    if kind in ("cubin", "fatbin"):
        return data
    if kind == "ptx":
        return data if data.endswith(b"\0") else data + b"\0"
    if kind is not None:  # LTO-IR, NVVM IR, host objects and libraries are linked first
        raise ValueError(
            f"this is {_UNLOADED[kind]}, which the driver does not load: link it "
            "into a Library with cuctx.Library.link([...]) (docs/kernels.md)"
        )
    raise ValueError(
        "not device code: the data is neither a cubin (ELF for CUDA), a fatbin "
        "nor PTX text (with .version and .target)"
    )


_UNLOADED = {
    "ltoir": "LTO-IR",
    "nvvm": "NVVM IR",
    "object": "a host object file",
    "library": "a library of host objects",
}


def _arch_of_devices() -> str:
    """The target for the devices present: their exact architecture when they share one,
    else the newest virtual one every device JITs forward (`pick_arch`)."""
    capabilities = [tuple(d.compute_capability) for d in devices()]
    return pick_arch(capabilities or [(9, 0)])


class _Code(Resource):
    """State and behaviour common to `Library` and `Module`. The Resource fields:
    ``_handle`` is the CUlibrary / CUmodule, ``_ctx`` the Module's context and None for a
    Library (loaded for every context); ``_check`` also refuses an unloaded one."""

    # `_loaded` a slot: the compiled launch reads it at every launch (cuctx/csrc/native.h,
    # code_loaded); the rest in the instance's dict.
    __slots__ = ("_loaded", "__dict__", "__weakref__")
    _names: dict[str, str]

    def _setup(
        self,
        backend,
        ctx: Context | None,
        handle,
        names: Mapping[str, str],
        image: bytes,
        ptx: bytes | None,
    ) -> None:
        self._backend = backend
        self._ctx = ctx
        self._handle = handle
        self._key = int(handle)
        self._names = dict(names)  # user's name (e.g. "axpy<float>") -> mangled name
        # Parameter types by mangled kernel name, from the program's PTX (none for a cubin
        # that came without it: its kernels' arguments are checked by size only).
        if ptx is None and _kinds.is_ptx(image):
            ptx = image
        self._types = param_types(ptx) if ptx is not None else {}
        self._kernels: dict[str, Kernel] = {}
        self._lock = threading.Lock()
        self._loaded = True

    @classmethod
    def from_source(
        cls,
        src: str | bytes,
        options=(),
        name_expressions=(),
        headers: Mapping[str, str | bytes] | None = None,
        *,
        language: Language = "c++",
        sim_kernels: Mapping[str, Callable] | None = None,
        cache_dir: str | os.PathLike | bool | None = None,
    ) -> Self:
        """Compile for the devices present (cached; see docs/compiler.md) and load it: a
        `Library` for every context, a `Module` into the current one only. ``language``:
        "c++" (NVRTC), "ptx" (to a cubin, through the linker) or "nvvm" (NVVM IR, through
        libNVVM). Template kernels: list them in ``name_expressions`` (``["axpy<float>"]``)
        and get them by that name. Raises `CompileError` with the compiler's log when it
        does not compile."""
        arch = _arch_of_devices()
        if language == "ptx" and not arch.startswith("sm_"):
            arch = "sm_" + arch.split("_")[1]  # a cubin for the lowest device: PTX -> cubin
        result = compile_source(
            src,
            arch=arch,
            language=language,
            options=options,
            name_expressions=name_expressions,
            headers=headers,
            cache_dir=cache_dir,
        )
        code = cls(
            result.image, names=result.lowered_names, sim_kernels=sim_kernels, _ptx=result.ptx
        )
        if language == "c++":  # `const` of pointer parameters, for the trace (`_access`)
            code._source = src
        return code

    @classmethod
    def from_file(
        cls, path: str | os.PathLike, *, sim_kernels: Mapping[str, Callable] | None = None
    ) -> Self:
        """Load a cubin, fatbin or PTX file (recognised by its content)."""
        with open(path, "rb") as f:
            return cls(f.read(), sim_kernels=sim_kernels)

    @classmethod
    def from_bytes(cls, data: bytes, *, sim_kernels: Mapping[str, Callable] | None = None) -> Self:
        """Load a cubin, fatbin or PTX image held in memory (recognised by its content)."""
        return cls(data, sim_kernels=sim_kernels)

    def _check(self, operation: str) -> None:
        if not self._loaded:
            raise self._gone(operation)

    def _gone(self, operation: str) -> RuntimeError:
        return RuntimeError(
            f"{operation}: {self!r} was unloaded; its kernels and variables cannot be used any more"
        )

    def unload(self) -> None:
        """Unload the code once the work queued in every context that used it (a Module's:
        its context) is done. Its kernels, launchers and variable views must not be used
        afterwards. Unloading twice does nothing; garbage collection unloads the same way."""
        if self._loaded:
            self._loaded = False
            self._finalizer()

    def _user_name(self, mangled: str) -> str:
        return next((user for user, m in self._names.items() if m == mangled), mangled)

    def kernel(self, name: str) -> Kernel:
        """The kernel called ``name``: its C name (``extern "C"``), its mangled name, or a
        name expression given to `from_source` (``"axpy<float>"``)."""
        self._check("kernel")
        _need_name(name, "kernel")
        mangled = self._names.get(name, name)
        with self._lock:
            found = self._kernels.get(mangled)
            if found is None:
                err, handle = self._get_kernel(mangled.encode())
                if err:
                    if int(err) == NOT_FOUND:
                        raise self._not_found(name) from None
                    fail(self._backend, err, self._get_kernel_name)
                found = self._kernels[mangled] = Kernel(self, handle, mangled)
        return found

    def __getitem__(self, name: str) -> Kernel:
        return self.kernel(name)

    def _not_found(self, name: str) -> KeyError:
        """The error for a kernel the code lacks. Where C++ kernels (names mangled, as
        without extern "C") have that name, it names them and says how to reach them."""
        names = self._listed_kernels()
        base = name.split("<")[0].strip()
        cpp = {
            m: c
            for m in names or ()
            if (c := declared_name(m)) and base in (c[0], c[0].rpartition("::")[2])
        }
        if not cpp:
            listed = names if names is not None else "kernels a Module cannot list"
            return KeyError(f"no kernel {name!r} in {self!r}; it has {listed}")
        qualified, template = next(iter(cpp.values()))
        compiled = " or ".join(user for user, m in self._names.items() if m in cpp)
        # Double quotes only: KeyError prints its message as a repr.
        if compiled and "<" not in name:
            how = f"ask for it by the name expression it was compiled with: {compiled}"
        else:
            how = (
                f'list each instance in name_expressions=["{qualified}'
                f'{name[len(base) :].strip() or "<...>"}"]'
                if template
                else f'declare it extern "C" to keep the name "{qualified.rpartition("::")[2]}", '
                f'or list it in name_expressions=["{qualified}"]'
            )
            how += f" when calling {type(self).__name__}.from_source and ask for that name" + (
                f" (it was compiled with {compiled})" if compiled else ""
            )
        return KeyError(
            f'no kernel "{name}" in {self!r}: it has the C++ kernel {" and ".join(cpp)}; {how}'
        )

    def _listed_kernels(self) -> list[str] | None:
        """The (mangled) names of the kernels, where they can be listed."""
        return self.kernel_names

    def _variable(
        self, operation: str, lookup: str, what: str, name: str
    ) -> tuple[Context, int, int]:
        """The context, address and size of the variable ``name``, found with the driver
        call ``lookup`` in the code's context (a Library's: the current one, where each
        context has its own copy)."""
        self._check(operation)
        _need_name(name, operation)
        ctx = self._ctx or context_for()
        with in_context(ctx, operation):
            err, ptr, nbytes = getattr(self._backend.driver, lookup)(self._handle, name.encode())
        if err:
            fail(
                self._backend,
                err,
                lookup,
                ctx,
                hint=f"no {what} {name!r} in {self!r}" if int(err) == NOT_FOUND else "",
            )
        return ctx, int(ptr), int(nbytes)

    def _install_twins(self, twins: Mapping[str, Callable] | None) -> None:
        """Check sim twins against their kernels on every backend (so code that loads on
        the sim loads on a GPU), and register them on the sim; the cuda backend runs the
        real code."""
        if twins is None:
            return
        if not isinstance(twins, Mapping):
            raise TypeError(
                "sim_kernels must be a dict of kernel name -> fn(grid, block, "
                f"*args), not {type(twins).__name__}"
            )
        for name, fn in twins.items():
            kernel = self.kernel(name)
            types = kernel._packer().types
            check_twin(name, fn, kernel.name, len(kernel.param_layout), types)
            sim = self._backend.sim
            if sim is not None:
                kinds = tuple(t.kind for t in types) if types else None
                (err,) = sim.set_kernel_twin(kernel._handle, fn, kinds)
                if err:
                    fail(self._backend, err, "set_kernel_twin")


# -- libraries ----------------------------------------------------------------------------


class Library(_Code):
    """Device code loaded for every context (cuLibraryLoadData). Make one with
    `from_source`, `from_file` or `from_bytes`; get kernels with ``lib.kernel(name)`` or
    ``lib[name]``. ``sim_kernels`` maps kernel names to Python twins, which the sim runs
    (``fn(grid, block, *args)``, see docs/kernels.md); the cuda backend ignores them."""

    _param_info_name = "cuKernelGetParamInfo"
    _get_kernel_name = "cuLibraryGetKernel"

    def __init__(
        self,
        data: bytes,
        *,
        names: Mapping[str, str] | None = None,
        sim_kernels: Mapping[str, Callable] | None = None,
        _ptx: bytes | None = None,
    ) -> None:
        image = _image_from(data)
        backend = _driver.active()
        drv = backend.driver
        err, handle = drv.cuLibraryLoadData(image, None, None, 0, None, None, 0)
        if err:
            fail(
                backend,
                err,
                "cuLibraryLoadData",
                hint="the sim reads cubins and PTX, not fatbins"
                if backend.sim is not None and int(err) == NOT_SUPPORTED
                else "",
            )
        self._setup(backend, None, handle, names or {}, image, _ptx)
        self._used: weakref.WeakSet[Context] = weakref.WeakSet()
        self._finalizer = finalize(self, _unload_library, drv, handle, self._used)
        self._install_twins(sim_kernels)

    @classmethod
    def link(
        cls,
        pieces: Iterable[Any],
        *,
        lto: bool = False,
        options: Iterable[str] = (),
        compile_options: Iterable[str | bytes] = (),
        headers: Mapping[str, str | bytes] | None = None,
        arch: str | None = None,
        sim_kernels: Mapping[str, Callable] | None = None,
        cache_dir: str | os.PathLike | bool | None = None,
    ) -> Library:
        """Link ``pieces`` into one Library: C++ sources (str; compiled with NVRTC as
        relocatable device code, to LTO-IR with ``lto``, with ``compile_options`` and
        ``headers``), PTX, cubins, LTO-IR, fatbins, host objects and libraries (bytes,
        recognised by content), NVVM IR (through libNVVM), files (`pathlib.Path`: ``.cu``
        files are sources), `compile_source` results, or ``(name, data)`` to name a piece
        in the errors. ``options`` are nvJitLink's (``-O3``, ``-maxrregcount=32``, ...).
        ``arch``: the devices' (default). Links with nvJitLink, or the driver's linker where
        nvJitLink is not installed (no LTO there); cached by every input and option. Raises
        `LinkError` with the linker's log, naming the pieces."""
        if arch is None:
            arch = _arch_of_devices()
            if not arch.startswith("sm_") and not lto:
                raise ValueError(
                    f"the devices present differ in architecture; pass arch= (the "
                    f"'sm_XY' the Library will run on) or lto=True (the link is "
                    f"then PTX for {arch}, which every device JITs)"
                )
        linked = link_pieces(
            pieces,
            arch=arch,
            lto=lto,
            options=options,
            compile_options=compile_options,
            headers=headers,
            cache_dir=cache_dir,
        )
        library = cls(linked.image, names=linked.names, sim_kernels=sim_kernels, _ptx=linked.ptx)
        if linked.source is not None:
            library._source = linked.source
        return library

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
        (err,) = self._backend.driver.cuKernelSetAttribute(attribute, value, handle, device._handle)
        if err:
            fail(self._backend, err, "cuKernelSetAttribute")

    def _check_context(self, ctx: Context, kernel: str) -> None:
        return None

    def _used_in(self, ctx: Context) -> None:
        self._used.add(ctx)

    def _context_on(self, device: Device, operation: str) -> AbstractContextManager[Context]:
        """The current context when it is on ``device``, else the device's primary one."""
        return in_context(context_for(device), operation)

    # -- variables ------------------------------------------------------------------------

    def get_global(
        self, name: str, dtype: Any = np.uint8, shape: int | tuple[int, ...] | None = None
    ):
        """A `DeviceArray` view of the ``__device__`` (or ``__constant__``) variable
        ``name`` in the current context (each context has its own copy). ``dtype`` and
        ``shape`` say how to see its bytes (default: all of them as uint8)."""
        ctx, ptr, nbytes = self._variable(
            "Library.get_global", "cuLibraryGetGlobal", "__device__ variable", name
        )
        self._used_in(ctx)
        return _variable_view(ctx, ptr, nbytes, dtype, shape, self, name)

    def get_managed(
        self, name: str, dtype: Any = np.uint8, shape: int | tuple[int, ...] | None = None
    ) -> np.ndarray:
        """A NumPy view of the ``__managed__`` variable ``name``: one copy for every context
        and device (cuLibraryGetManaged). Synchronize before reading what kernels wrote."""
        # Managed variables exist once the library is loaded into a context: ask in one.
        _, ptr, nbytes = self._variable(
            "Library.get_managed", "cuLibraryGetManaged", "__managed__ variable", name
        )
        dtype, shape = _view_shape(nbytes, dtype, shape, name)
        return np.asarray(_HostView(ptr, shape, dtype, self))

    def __repr__(self) -> str:
        state = "" if self._loaded else " unloaded"
        return f"<Library {int(self._handle):#x} ({self._backend.name}){state}>"


def _unload_library(drv, handle, used: weakref.WeakSet) -> None:
    _synchronize_all(list(used))
    drv.cuLibraryUnload(handle)


def _synchronize_all(contexts: list[Context]) -> None:
    """Wait for the work of each context still alive; faults there are the users' of that
    work to see (the next call in the context raises them), not unload's."""
    for ctx in contexts:
        if ctx._state is ACTIVE:
            with in_context(ctx, "unload"):
                ctx._backend.driver.cuCtxSynchronize()


def _need_name(name: Any, operation: str) -> None:
    if not isinstance(name, str):
        raise TypeError(f"{operation} takes a name (str), not {type(name).__name__}: {name!r}")


__all__ = ["BlockSizeSuggestion", "CompileError", "Kernel", "KernelAttributes", "Library"]
