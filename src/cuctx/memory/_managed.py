"""Managed memory (cuMemAllocManaged): one allocation that kernels use through its device
pointer and the host through a NumPy view of the same bytes (`DeviceArray.host`)."""

from __future__ import annotations

from typing import Any

import numpy as np
from cuda.bindings.driver import CUmemAttach_flags

from .._lifetimes import finalize
from ..context import ACTIVE, Context, context_for, in_context
from .._calls import fail
from ..device import Device
from ._array import DeviceArray
from ._host import HostBytes
from ._layout import dtype_of, nbytes_of, shape_of


class _ManagedMemory(HostBytes):
    """Owns one managed allocation (a DeviceArray's ``_owner``); every host view of it holds
    it too, so the memory is freed (cuMemFree) when the last array and view are gone."""

    __slots__ = ()

    def __init__(self, ctx: Context | None, ptr: int, nbytes: int):
        super().__init__(ptr, nbytes)
        if ctx is not None:
            finalize(self, _free, ctx, ptr)


def _free(ctx: Context, ptr: int) -> None:
    if ctx._state is ACTIVE:  # a reset took the memory with the context
        with in_context(ctx, "cuMemFree"):
            ctx._backend.driver.cuMemFree(ptr)  # waits for the device's work


def managed_empty(
    shape: int | tuple[int, ...], dtype: Any = np.float64, *, device: Device | int | None = None
) -> DeviceArray:
    """An uninitialised C-contiguous array in managed memory (cuMemAllocManaged, attached
    globally): a `DeviceArray` for kernels and copies, whose ``host`` is a NumPy array over
    the same memory.

    The host may read ``arr.host`` once the device work writing the array has finished
    (after a synchronize of its stream or context), and may write it while no queued
    device work uses the array: kernels enqueued afterwards see the host's writes. The
    memory belongs to the primary context of ``device`` (default: the current device), so
    only ``device.reset()`` takes it away; do not use the array or its host views after a
    reset (the memory is gone, as in CUDA)."""
    shape, dtype = shape_of(shape), dtype_of(dtype)
    ctx = context_for(device, primary=True)
    nbytes = nbytes_of(shape, dtype, "managed array")
    if nbytes == 0:  # the driver refuses 0 bytes; an empty array needs no memory
        return DeviceArray._make(ctx, 0, shape, dtype, None, None, _ManagedMemory(None, 0, 0))
    with in_context(ctx, "managed_empty"):
        err, ptr = ctx._backend.driver.cuMemAllocManaged(
            nbytes, CUmemAttach_flags.CU_MEM_ATTACH_GLOBAL
        )
    if err:
        fail(
            ctx._backend,
            err,
            "cuMemAllocManaged",
            ctx,
            f"asked for {nbytes} bytes of managed memory on device {ctx.device.ordinal}",
        )
    owner = _ManagedMemory(ctx, int(ptr), nbytes)
    return DeviceArray._make(ctx, int(ptr), shape, dtype, None, None, owner)
