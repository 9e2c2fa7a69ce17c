"""Green contexts of the sim: SM resources, splits by count, descriptors, and contexts whose
kernels run on their own SMs (`_timing.Engines` lets kernels of green contexts on disjoint
SMs overlap).

A resource is a cuda.bindings ``CUdevResource`` the sim filled in; the SMs it stands for are
remembered by the struct's address (``getPtr``), so the caller must keep the objects it got
until it made a descriptor, as with the driver's out-parameters. SMs are numbered 0..131; a
split takes consecutive SMs. The granularity (``minSmPartitionSize`` and
``smCoscheduledAlignment``, 8 here) is the sim's assumption for an H100 without the
IGNORE_SM_COSCHEDULING flag; the GPU tells its own in the same fields.

As measured on an H100 (132 SMs, driver 580): a split's groups and remainder have those
fields 0 and cannot be split again (CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION, as for a
minCount above the SMs there are); a split rounds minCount up to the granularity but not
beyond the SMs there are (132 gives one group of 132); and groups of 8 are 15, not 16 (the
chip's layout; every larger size gives SMs // size groups).
"""

from __future__ import annotations

import itertools

from cuda.bindings.driver import (
    CUcontext,
    CUdevice_attribute,
    CUdevResource,
    CUdevResourceDesc,
    CUdevResourceType,
    CUgreenCtx,
    CUresult,
)

from ._common import CONTEXT_IS_DESTROYED, INVALID_CONTEXT, INVALID_VALUE, NOT_INITIALIZED, OK

SM = CUdevResourceType.CU_DEV_RESOURCE_TYPE_SM
GRANULARITY = 8
INVALID_RESOURCE_CONFIGURATION = CUresult.CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION
# (SMs, group size) -> the groups the driver makes where it makes fewer than SMs // size
_FEWER_GROUPS = {(132, 8): 15}


class GreenModel:
    """cuDeviceGetDevResource, cuDevSmResourceSplitByCount, cuDevResourceGenerateDesc,
    cuGreenCtxCreate, cuCtxFromGreenCtx, cuGreenCtxDestroy."""

    def _init_green(self):
        self._green_handles = itertools.count(0x6EE7_0000_1000, 0x1000)
        self._resources: dict[int, tuple[int, frozenset]] = {}  # ptr -> (device, SMs)
        self._split_outputs: set[int] = set()  # ptrs of resources a split made
        self._descs: dict[int, tuple[int, frozenset]] = {}
        self._greens: dict[int, object] = {}  # CUgreenCtx handle -> SimContext

    def _resource(self, device: int, sms: frozenset, split: bool = False) -> CUdevResource:
        out = CUdevResource()
        out.type = SM
        out.sm.smCount = len(sms)
        out.sm.minSmPartitionSize = 0 if split else GRANULARITY
        out.sm.smCoscheduledAlignment = 0 if split else GRANULARITY
        self._resources[out.getPtr()] = (device, sms)
        if split:
            self._split_outputs.add(out.getPtr())
        else:
            self._split_outputs.discard(out.getPtr())
        return out

    def cuDeviceGetDevResource(self, device, typename):
        if not self._initialized:
            return (NOT_INITIALIZED, None)
        if self._device(device) is None or typename != SM:
            return (INVALID_VALUE, None)
        count = self._devices[int(device)].attributes[
            CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
        ]
        return (OK, self._resource(int(device), frozenset(range(count))))

    def cuDevSmResourceSplitByCount(self, nbGroups, input_, flags, minCount):
        found = self._resources.get(input_.getPtr()) if input_ is not None else None
        if found is None or int(flags) != 0 or int(minCount) < 0:
            return (INVALID_VALUE, None, None, None)
        device, sms = found
        if input_.getPtr() in self._split_outputs or int(minCount) > len(sms):
            return (INVALID_RESOURCE_CONFIGURATION, None, None, None)
        size = min(max(GRANULARITY, -(-int(minCount) // GRANULARITY) * GRANULARITY), len(sms))
        ordered = sorted(sms)
        groups = min(
            int(nbGroups),
            len(ordered) // size,
            _FEWER_GROUPS.get((len(ordered), size), len(ordered)),
        )
        result = [
            self._resource(device, frozenset(ordered[i * size : (i + 1) * size]), True)
            for i in range(groups)
        ]
        remainder = self._resource(device, frozenset(ordered[groups * size :]), True)
        return (OK, result, groups, remainder)

    def cuDevResourceGenerateDesc(self, resources, nbResources):
        found = [self._resources.get(r.getPtr()) for r in list(resources or [])[:nbResources]]
        if not found or None in found or len({d for d, _ in found}) != 1:
            return (INVALID_VALUE, None)
        handle = next(self._green_handles)
        self._descs[handle] = (found[0][0], frozenset().union(*(s for _, s in found)))
        return (OK, CUdevResourceDesc(handle))

    def cuGreenCtxCreate(self, desc, dev, flags):
        found = self._descs.get(int(desc or 0))
        if not self._initialized:
            return (NOT_INITIALIZED, None)
        # The H100's driver 580 refuses flags 0: CU_GREEN_CTX_DEFAULT_STREAM (1) is required.
        if found is None or found[0] != int(dev) or int(flags) != 1:
            return (INVALID_VALUE, None)
        with self._lock:
            ctx = self._new_context(int(dev), 0, primary=False)
            ctx.sms = found[1]
            handle = next(self._green_handles)
            self._greens[handle] = ctx
        return (OK, CUgreenCtx(handle))

    def cuCtxFromGreenCtx(self, hCtx):
        ctx = self._greens.get(int(hCtx or 0))
        if ctx is None:
            return (INVALID_CONTEXT, None)
        return (OK, CUcontext(ctx.handle))

    def cuGreenCtxDestroy(self, hCtx):
        ctx = self._greens.get(int(hCtx or 0))
        if ctx is None:
            return (INVALID_CONTEXT,)
        if ctx.destroyed:
            return (CONTEXT_IS_DESTROYED,)
        with self._lock:
            self._release_context_resources(ctx)
            ctx.destroyed = True
        stack = self._stack()
        if stack and stack[-1] is ctx:
            stack.pop()
        return (OK,)
