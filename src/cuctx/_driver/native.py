"""The compiled fast path's side of the seam: what fills a backend's ``native`` slot.

The extension ``cuctx._native`` (src/cuctx/_native*.c) calls a few driver functions itself.
On the cuda backend it gets their addresses from the driver (``cuGetProcAddress`` through
cuda.bindings), so it builds without the CUDA toolkit; on the sim it gets the SimDriver's
own functions, so the compiled guards and packing run in CI and only the final call differs.

``CUCTX_NATIVE=0`` in the environment turns the compiled path off (read once, at import):
every call takes the checked Python paths (with their generated fast paths).
"""

from __future__ import annotations

import os
import sys
from types import ModuleType

# What the compiled paths call, by cuda.bindings' names.
FUNCTIONS = (
    "cuLaunchKernel",
    "cuLaunchKernelEx",
    "cuEventRecord",
    "cuStreamWaitEvent",
    "cuCtxPushCurrent",
    "cuCtxPopCurrent",
    "cuCtxGetCurrent",
    "cuGraphExecKernelNodeSetParams",
    "cuGraphLaunch",
    "cuGraphAddKernelNode",
    "cuMemAllocAsync",
    "cuMemFreeAsync",
)
# The ABI of the function types csrc/native.h declares: CUDA 12.0's (cuLaunchKernelEx is 12.0's,
# and so is the CUDA_KERNEL_NODE_PARAMS with `kern` and `ctx` that cuda.bindings' struct holds,
# which cuGraphExecKernelNodeSetParams takes at that version: its _v2).
ABI_VERSION = 12000

ENABLED: bool = os.environ.get("CUCTX_NATIVE", "1") != "0"


def extension() -> tuple[ModuleType | None, str]:
    """(cuctx._native, "") when the compiled path can run; (None, why not) otherwise."""
    if not ENABLED:
        return None, "turned off by CUCTX_NATIVE=0"
    if sys.byteorder != "little":
        return None, "the compiled path packs parameters for little-endian hosts only"
    try:
        from .. import _native
    except ImportError as exc:
        return None, (
            f"the extension cuctx._native is not built ({exc}); reinstall cuctx "
            "where a C compiler and Python's headers are present to build it"
        )
    return _native, ""


def load(driver, sim) -> tuple[object | None, str]:
    """A backend's ``native`` slot and what to say about it: (a ``cuctx._native.Driver``,
    how it calls the driver) or (None, why there is no compiled path)."""
    module, why = extension()
    if module is None:
        return None, why
    if sim is not None:
        return (
            module.Driver({name: getattr(driver, name) for name in FUNCTIONS}),
            "compiled paths ending in the sim's driver functions",
        )
    # cuda.bindings' own default-stream choice, so a handle of 0 means the same stream in both
    per_thread = int(os.environ.get("CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM", "0") or 0)
    flags = driver.CUdriverProcAddress_flags
    flag = (
        flags.CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
        if per_thread
        else flags.CU_GET_PROC_ADDRESS_LEGACY_STREAM
    )
    addresses = {}
    for name in FUNCTIONS:
        try:
            err, address, _ = driver.cuGetProcAddress(name.encode(), ABI_VERSION, flag)
        except Exception as exc:  # noqa: BLE001 - a binding that differs: Python paths then
            return None, f"cuGetProcAddress failed for {name} ({type(exc).__name__}: {exc})"
        if err or not int(address or 0):
            return None, f"the driver gave no address for {name} (cuGetProcAddress: {err!r})"
        addresses[name] = int(address)
    compiled = module.Driver(addresses)
    compiled.builds = _same_layout(module, driver)
    return compiled, "compiled paths calling the driver's functions"


def _same_layout(module: ModuleType, driver) -> bool:
    """Whether the kernel node struct the compiled builds pass (csrc/native.h,
    kernel_node_params) is laid out as cuda.bindings' CUDA_KERNEL_NODE_PARAMS, which is the
    driver's at this ABI: the same values in each, compared byte for byte. Where they differ
    (another cuda.bindings), AutoGraph builds its nodes through cuda.bindings instead."""
    import ctypes

    values = dict(
        func=0x1111_0000_0101,
        kern=0x3333_0000_0303,
        ctx=0x4444_0000_0404,
        grid=(2, 3, 4),
        block=(5, 6, 7),
        shared=8,
        params=0x2222_0000_0202,
    )
    try:
        params = driver.CUDA_KERNEL_NODE_PARAMS()
        params.func = driver.CUfunction(values["func"])
        params.kern = driver.CUkernel(values["kern"])
        params.ctx = driver.CUcontext(values["ctx"])
        params.gridDimX, params.gridDimY, params.gridDimZ = values["grid"]
        params.blockDimX, params.blockDimY, params.blockDimZ = values["block"]
        params.sharedMemBytes = values["shared"]
        params.kernelParams = values["params"]
        ours = module.kernel_node_bytes(
            values["func"],
            values["kern"],
            values["ctx"],
            values["grid"],
            values["block"],
            values["shared"],
            values["params"],
        )
        return ctypes.string_at(params.getPtr(), len(ours)) == ours
    except Exception:  # noqa: BLE001 - a binding that differs: no compiled builds
        return False
