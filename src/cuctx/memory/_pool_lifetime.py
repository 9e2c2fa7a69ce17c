"""A pool's making and destroying where drivers fail, apart from `MemoryPool`'s API: whether
a host or managed pool can be made at all (`_supported`), and the destroy of a pool
(`_destroy`, its finalizer).

A pool outlives contexts (measured on an H100: neither a context's destruction nor a reset
frees a pool's allocation). A MemoryPool lives while it is referenced, by the user or by the
arrays allocated from it (each holds its pool), and is destroyed (cuMemPoolDestroy) when the
last reference goes; the frees of its arrays were queued by then, and its destroy waits
until they have run (the driver promises to give the memory back once they have, but a pool
destroyed with frees still queued crashed the process at a later pool's first allocation:
H100s and an H200, driver 580, while another process used the GPU).
"""

from __future__ import annotations

import weakref

from .._resource import ACTIVE, DESTROYED
from ..context import Context
from .._calls import call
from ..device import Device
from ..errors import NOT_SUPPORTED, NotSupportedError


def _supported(device: Device, location: str) -> None:
    """Refuse a host or managed pool the driver or device cannot make (NotSupportedError)."""
    attribute = {"host": "host_memory_pools_supported", "managed": "concurrent_managed_access"}[
        location
    ]
    version = int(call(device._backend, "cuDriverGetVersion"))
    if location == "managed" and version // 10 == 1300:  # CUDA 13.0
        # Measured on two H200s, driver 580: the pool is made, and the first allocation from
        # it ends the process (a segmentation fault in cuMemAllocFromPoolAsync).
        raise NotSupportedError(
            NOT_SUPPORTED,
            "MemoryPool",
            "",
            "managed memory pools crash CUDA 13.0 drivers at their first allocation (a "
            "segmentation fault, measured); cuctx makes them on newer drivers only: use "
            "cuctx.managed_empty for managed arrays",
        )
    try:
        supported = version >= 13000 and getattr(device.properties, attribute)
    except NotSupportedError:  # the driver predates the attribute
        supported = False
    if not supported:
        raise NotSupportedError(
            NOT_SUPPORTED,
            "MemoryPool",
            "",
            f"{location} memory pools need a CUDA 13 driver (this one is "
            f"{version // 1000}.{version % 1000 // 10}) and a device whose {attribute} is "
            f"true ({device!r}); use "
            + (
                "cuctx.pinned_empty for page-locked host arrays"
                if location == "host"
                else "cuctx.managed_empty for managed arrays"
            ),
        )


def _destroy(
    backend, handle, primary: Context, granted: dict[int, Context], freed_in: dict[int, weakref.ref]
) -> None:
    """Destroy the pool with its device's primary context current, once the frees of its
    memory queued in ``freed_in``'s contexts have run (see the module's docstring); ``granted``
    (the other devices' primary contexts it keeps retained) is released after, with the
    arguments."""
    if primary._state is DESTROYED:  # reset by other code: the driver must not see it again
        return
    drv = backend.driver
    for ref in list(freed_in.values()):
        ctx = ref()
        if ctx is not None and ctx._state is ACTIVE:
            drv.cuCtxPushCurrent(ctx._handle)
            try:  # (a fault it reports is its own work's, for its own synchronize to raise)
                drv.cuCtxSynchronize()
            finally:
                drv.cuCtxPopCurrent()
    drv.cuCtxPushCurrent(primary._handle)
    try:
        drv.cuMemPoolDestroy(handle)  # arrays of it hold it: none is left
    finally:
        drv.cuCtxPopCurrent()
