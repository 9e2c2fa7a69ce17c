"""Green contexts: a device's SMs split into partitions, each a context whose kernels run on
its own SMs, side by side with the other partitions' (`Device.partition`).

Driver calls, in order: cuDeviceGetDevResource (the device's SMs), cuDevSmResourceSplitByCount
(equal counts: one split into that many groups; different counts: one group at a time from
what the previous split left), cuDevResourceGenerateDesc and cuGreenCtxCreate per group,
cuCtxFromGreenCtx for the CUcontext every other cuctx call takes, cuGreenCtxDestroy when
the partition is closed (or its contexts are unreferenced). The driver rounds each count up
to its granularity (``minSmPartitionSize``/``smCoscheduledAlignment`` of the resource).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from cuda.bindings.driver import CUdevResourceType, CUgreenCtxCreate_flags

from ._calls import fail
from .context import DESTROYED, Context

if TYPE_CHECKING:
    from .device import Device

_SM = CUdevResourceType.CU_DEV_RESOURCE_TYPE_SM
_DEFAULT_STREAM = int(CUgreenCtxCreate_flags.CU_GREEN_CTX_DEFAULT_STREAM)


class Partition(Sequence):
    """Green contexts on disjoint SMs of one device: ``partition[i]`` is a `Context` (kind
    ``"green"``) with ``sm_counts[i]`` SMs. ``with device.partition([64, 64]) as (a, b):``
    destroys them at the end of the block; `close` does it explicitly."""

    def __init__(
        self, device: Device, contexts: list[Context], greens: list, sm_counts: list[int]
    ) -> None:
        self.device = device
        self.sm_counts = sm_counts  # as the driver gave them (rounded to its granularity)
        self._contexts = contexts
        self._greens = greens

    def __getitem__(self, i):
        return self._contexts[i]

    def __len__(self) -> int:
        return len(self._contexts)

    def close(self) -> None:
        """Destroy the green contexts (cuGreenCtxDestroy): work queued in them runs first;
        objects made in them raise `ContextDestroyedError` from now on."""
        drv = self.device._backend.driver
        for ctx, green in zip(self._contexts, self._greens):
            if ctx._state == DESTROYED:
                continue
            ctx.synchronize()
            ctx._tear_down_first()
            (err,) = drv.cuGreenCtxDestroy(green)
            if err:
                fail(ctx._backend, err, "cuGreenCtxDestroy", ctx)
            ctx._finalizer.detach()
            ctx._mark_destroyed("by Partition.close")

    def __enter__(self) -> Partition:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def __repr__(self) -> str:
        states = {ctx._state for ctx in self._contexts}
        state = "closed" if states == {DESTROYED} else "/".join(sorted(states))
        handles = ", ".join(f"{ctx._key:#x}" for ctx in self._contexts)
        return (
            f"<Partition of device {self.device.ordinal}: {len(self)} green contexts "
            f"({handles}) of {self.sm_counts} SMs, {state}>"
        )


def partition(device: Device, sm_counts: Sequence[int]) -> Partition:
    """What `Device.partition` does (see there)."""
    counts = _counts(device, sm_counts)
    backend = device._backend
    drv = backend.driver
    operation = f"Device({device.ordinal}).partition({counts})"
    err, whole = drv.cuDeviceGetDevResource(device._handle, _SM)
    if err:
        fail(
            backend,
            err,
            "cuDeviceGetDevResource",
            hint=f"{operation}: green contexts need "
            "CUDA 12.4 or later and a device of compute capability 8.0 or later",
        )
    if sum(counts) > whole.sm.smCount:
        raise ValueError(
            f"{operation}: the device has {whole.sm.smCount} SMs, the partitions "
            f"ask for {sum(counts)}"
        )
    groups = _split(drv, backend, whole, counts, operation)
    contexts, greens = [], []
    for group in groups:
        err, desc = drv.cuDevResourceGenerateDesc(group, len(group))
        if err:
            fail(backend, err, "cuDevResourceGenerateDesc", hint=operation)
        # CU_GREEN_CTX_DEFAULT_STREAM: the driver (580, H100) refuses anything else.
        err, green = drv.cuGreenCtxCreate(desc, device._handle, _DEFAULT_STREAM)
        if err:
            fail(backend, err, "cuGreenCtxCreate", hint=operation)
        err, handle = drv.cuCtxFromGreenCtx(green)
        if err:
            drv.cuGreenCtxDestroy(green)
            fail(backend, err, "cuCtxFromGreenCtx", hint=operation)
        contexts.append(
            Context._wrap(backend, handle, device, "green", (drv.cuGreenCtxDestroy, green))
        )
        greens.append(green)
    return Partition(
        device, contexts, greens, [sum(g.sm.smCount for g in group) for group in groups]
    )


def _counts(device: Device, sm_counts: Any) -> list[int]:
    """The SM counts as ints: a list (or other sequence) of positive ints, one per
    partition. Floats are refused, not rounded (the driver rounds to its granularity, and
    the result's ``sm_counts`` says what it gave); bools and strings are refused too."""
    operation = f"Device({device.ordinal}).partition"
    if isinstance(sm_counts, np.ndarray):
        sm_counts = sm_counts.tolist()  # (a 0-d array gives its number: refused below)
    if not isinstance(sm_counts, Sequence) or isinstance(sm_counts, (str, bytes)):
        one = (
            f"; for one partition of {sm_counts} SMs, pass [{sm_counts}]"
            if isinstance(sm_counts, (int, np.integer)) and not isinstance(sm_counts, bool)
            else ""
        )
        raise TypeError(
            f"{operation} takes a list of SM counts, one int per partition "
            f"(e.g. [64, 64]), not {type(sm_counts).__name__} {sm_counts!r}{one}"
        )
    counts = []
    for c in sm_counts:
        if isinstance(c, bool) or not isinstance(c, (int, np.integer)):
            raise TypeError(
                f"{operation}: SM counts are ints, one per partition (e.g. [64, "
                f"64]); {sm_counts!r} holds {type(c).__name__} {c!r}"
            )
        counts.append(int(c))
    if not counts or any(c <= 0 for c in counts):
        raise ValueError(
            f"{operation}: SM counts must be one or more positive ints, one per "
            f"partition (e.g. [64, 64]), got {sm_counts!r}"
        )
    return counts


def _split(drv, backend, whole, counts: list[int], operation: str) -> list[list]:
    """The SM groups of each partition, from one split of the device's SMs. Equal counts:
    that many groups of the count. Different counts: groups of the driver's granularity,
    each partition taking as many as its count needs, for the driver does not split a
    split's groups or remainder again (CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION, H100 with
    driver 580, as its documentation says)."""
    step = max(whole.sm.minSmPartitionSize, whole.sm.smCoscheduledAlignment, 1)
    equal = len(set(counts)) == 1
    sizes = [1] * len(counts) if equal else [-(-c // step) for c in counts]
    wanted, size = sum(sizes), counts[0] if equal else step
    err, groups, n, _ = drv.cuDevSmResourceSplitByCount(wanted, whole, 0, size)
    if err:
        fail(backend, err, "cuDevSmResourceSplitByCount", hint=operation)
    if n < wanted:
        raise ValueError(
            f"{operation}: the driver rounds SM counts up to a multiple of "
            f"{step}, and makes only {n} group(s) of {size} from the device's "
            f"{whole.sm.smCount} SMs where {wanted} are needed; ask for fewer "
            "or smaller partitions"
        )
    groups, out, start = list(groups)[:n], [], 0
    for k in sizes:
        out.append(groups[start : start + k])
        start += k
    return out
