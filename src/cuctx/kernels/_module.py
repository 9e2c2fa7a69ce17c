"""`Module`: device code loaded into one context (cuModuleLoadData), the pre-12.0 way;
`Library` (cuctx.kernels._library) is the context-independent one."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, Callable, Mapping

import numpy as np

from ._library import _Code, _image_from
from ._variables import _variable_view
from .._lifetimes import finalize
from .._calls import fail
from ..context import ACTIVE, Context, context_for, in_context
from ..device import Device
from ..errors import NOT_SUPPORTED, NotSupportedError


class Module(_Code):
    """Device code loaded into one context (cuModuleLoadData): the current context when it
    is made (device 0's primary context when none is). Its kernels run only in that
    context. Prefer `Library`, which works in every context; `Module` exists for code that
    needs per-context modules."""

    _param_info_name = "cuFuncGetParamInfo"
    _get_kernel_name = "cuModuleGetFunction"

    def __init__(
        self,
        data: bytes,
        *,
        names: Mapping[str, str] | None = None,
        sim_kernels: Mapping[str, Callable] | None = None,
        _ptx: bytes | None = None,
    ) -> None:
        image = _image_from(data)
        ctx = context_for()
        backend = ctx._backend
        with in_context(ctx, "Module"):
            err, handle = backend.driver.cuModuleLoadData(image)
        if err:
            fail(backend, err, "cuModuleLoadData", ctx)
        self._setup(backend, ctx, handle, names or {}, image, _ptx)
        self._finalizer = finalize(self, _unload_module, backend.driver, handle, ctx)
        self._install_twins(sim_kernels)

    @property
    def context(self) -> Context:
        return self._ctx

    @property
    def kernel_names(self) -> list[str]:
        raise NotSupportedError(
            NOT_SUPPORTED,
            "Module.kernel_names",
            "",
            "the driver lists kernels of libraries only; use a Library",
        )

    def _listed_kernels(self) -> list[str] | None:
        return sorted(self._types) or None  # the PTX's, when it came with the code

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
        (err,) = self._backend.driver.cuFuncSetAttribute(handle, attribute, value)
        if err:
            fail(self._backend, err, "cuFuncSetAttribute", self._ctx)

    def _check_context(self, ctx: Context, kernel: str) -> None:
        if ctx is not self._ctx:
            raise ValueError(
                f"kernel {kernel!r} of {self!r} runs only in {self._ctx!r} (a module is "
                f"loaded into one context), but the launch's stream is in {ctx!r}; load the "
                "code as a cuctx.Library to launch it in every context"
            )

    def _used_in(self, ctx: Context) -> None:
        return None  # its one context is synchronized before unloading

    def _context_on(self, device: Device, operation: str) -> AbstractContextManager[Context]:
        return in_context(self._ctx, operation)

    def get_global(
        self, name: str, dtype: Any = np.uint8, shape: int | tuple[int, ...] | None = None
    ):
        """A `DeviceArray` view of the variable ``name`` in the module's context."""
        ctx, ptr, nbytes = self._variable(
            "Module.get_global", "cuModuleGetGlobal", "variable", name
        )
        return _variable_view(ctx, ptr, nbytes, dtype, shape, self, name)

    def __repr__(self) -> str:
        state = "" if self._loaded else " unloaded"
        return f"<Module {int(self._handle):#x} in {self._ctx!r}{state}>"


def _unload_module(drv, handle, ctx: Context) -> None:
    if ctx._state is not ACTIVE:
        return  # the driver unloaded it with the context; it must not see the handle
    with in_context(ctx, "Module.unload"):
        ctx._backend.driver.cuCtxSynchronize()
        drv.cuModuleUnload(handle)
