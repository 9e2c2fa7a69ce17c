"""Green contexts of the sim: SM resources, splits by count, descriptors, and contexts whose
kernels run on their own SMs (`_timing.Engines` lets kernels of green contexts on disjoint
SMs overlap).

A resource is a cuda.bindings ``CUdevResource`` the sim filled in; the SMs it stands for are
remembered by the struct's address (``getPtr``), so the caller must keep the objects it got
until it made a descriptor, as with the driver's out-parameters. SMs are numbered 0..131; a
split takes consecutive SMs. The granularity (``minSmPartitionSize`` and
``smCoscheduledAlignment``, 8 here) is the sim's assumption for an H100 without the
IGNORE_SM_COSCHEDULING flag; the GPU tells its own in the same fields.
"""

from __future__ import annotations

import itertools

from cuda.bindings.driver import (CUcontext, CUdevice_attribute, CUdevResource, CUdevResourceDesc,
                                  CUdevResourceType, CUgreenCtx)

from ._common import CONTEXT_IS_DESTROYED, INVALID_CONTEXT, INVALID_VALUE, NOT_INITIALIZED, OK

SM = CUdevResourceType.CU_DEV_RESOURCE_TYPE_SM
GRANULARITY = 8


class GreenModel:
    """cuDeviceGetDevResource, cuDevSmResourceSplitByCount, cuDevResourceGenerateDesc,
    cuGreenCtxCreate, cuCtxFromGreenCtx, cuGreenCtxDestroy."""

    def _init_green(self):
        self._green_handles = itertools.count(0x6EE7_0000_1000, 0x1000)
        self._resources: dict[int, tuple[int, frozenset]] = {}  # ptr -> (device, SMs)
        self._descs: dict[int, tuple[int, frozenset]] = {}
        self._greens: dict[int, object] = {}  # CUgreenCtx handle -> SimContext

    def _resource(self, device: int, sms: frozenset) -> CUdevResource:
        out = CUdevResource()
        out.type = SM
        out.sm.smCount = len(sms)
        out.sm.minSmPartitionSize = GRANULARITY
        out.sm.smCoscheduledAlignment = GRANULARITY
        self._resources[out.getPtr()] = (device, sms)
        return out

    def cuDeviceGetDevResource(self, device, typename):
        if not self._initialized:
            return (NOT_INITIALIZED, None)
        if self._device(device) is None or typename != SM:
            return (INVALID_VALUE, None)
        count = self._devices[int(device)].attributes[
            CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT]
        return (OK, self._resource(int(device), frozenset(range(count))))

    def cuDevSmResourceSplitByCount(self, nbGroups, input_, flags, minCount):
        found = self._resources.get(input_.getPtr()) if input_ is not None else None
        if found is None or int(flags) != 0 or not 0 <= int(minCount) <= len(found[1]):
            return (INVALID_VALUE, None, None, None)
        device, sms = found
        size = max(GRANULARITY, -(-int(minCount) // GRANULARITY) * GRANULARITY)
        ordered = sorted(sms)
        groups = min(int(nbGroups), len(ordered) // size)
        result = [self._resource(device, frozenset(ordered[i * size:(i + 1) * size]))
                  for i in range(groups)]
        remainder = self._resource(device, frozenset(ordered[groups * size:]))
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
