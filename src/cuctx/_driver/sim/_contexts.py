"""Contexts of the sim: primary contexts with their refcounts, created contexts, and the
per-thread context stack, with the driver's answers to misuse (recorded on a real H100 by
scripts/probe_driver.py)."""

from __future__ import annotations

import itertools

from cuda.bindings.driver import CUcontext, CUctx_flags, CUdevice

from ._common import (
    CONTEXT_IS_DESTROYED,
    INVALID_CONTEXT,
    INVALID_DEVICE,
    INVALID_VALUE,
    NOT_INITIALIZED,
    NOT_PERMITTED,
    NOT_SUPPORTED,
    OK,
)

_VALID_FLAGS = 0
for _flag in CUctx_flags:
    if _flag.name != "CU_CTX_FLAGS_MASK":
        _VALID_FLAGS |= int(_flag)


class SimContext:
    def __init__(self, handle: int, device: int, flags: int, primary: bool):
        self.handle = handle
        self.device = device
        self.flags = flags
        self.primary = primary
        self.active = not primary  # a primary context is active while retained
        self.destroyed = False
        self.sticky = None  # the CUresult of a sticky fault, once one happened
        self.resources: dict = {}  # filled by the stream, memory and library models
        self.sms: frozenset | None = None  # a green context's SM partition; None: all SMs

    def reset(self):
        """What cuDevicePrimaryCtxReset and the last release do: drop all state."""
        self.sticky = None
        self.resources.clear()


class ContextModel:
    """cuCtx* and cuDevicePrimaryCtx*."""

    def _init_contexts(self):
        self._handles = itertools.count(0x5A5A_0000_1000, 0x1000)
        self._contexts: dict[int, SimContext] = {}
        self._primary = [None] * len(self._devices)  # (SimContext, refcount) per device

    # -- the per-thread stack -------------------------------------------------------------

    def _stack(self) -> list[SimContext]:
        stack = self._tls.stack
        if stack is None:
            stack = self._tls.stack = []
        return stack

    def _lookup(self, ctx) -> SimContext | None:
        return self._contexts.get(int(ctx)) if ctx is not None else None

    def _work_context(self, ctx: SimContext | None = None):
        """(error, context) for work in ``ctx`` or, when None, the current context."""
        if not self._initialized:
            return NOT_INITIALIZED, None
        if ctx is None:
            stack = self._stack()
            if not stack:
                return INVALID_CONTEXT, None
            ctx = stack[-1]
        if ctx.destroyed:
            return CONTEXT_IS_DESTROYED, None
        if not ctx.active:
            return INVALID_CONTEXT, None
        if ctx.sticky is not None:
            return ctx.sticky, None
        return OK, ctx

    def _new_context(self, device: int, flags: int, primary: bool) -> SimContext:
        ctx = SimContext(next(self._handles), device, flags, primary)
        self._contexts[ctx.handle] = ctx
        return ctx

    # -- created contexts -----------------------------------------------------------------

    def cuCtxCreate(self, ctxCreateParams, flags, dev):
        if not self._initialized:
            return (NOT_INITIALIZED, None)
        if self._device(dev) is None:
            return (INVALID_DEVICE, None)
        if ctxCreateParams is not None:
            return (NOT_SUPPORTED, None)  # execution affinity / CIG are not modelled
        if int(flags) & ~_VALID_FLAGS:
            return (INVALID_VALUE, None)
        with self._lock:
            ctx = self._new_context(int(dev), int(flags), primary=False)
        self._stack().append(ctx)
        return (OK, CUcontext(ctx.handle))

    def cuCtxDestroy(self, ctx):
        """As the driver: the context is popped from the calling thread's stack when it is
        on top there; deeper in this stack, and in other threads' stacks, it stays (and is
        current again once what is above it is popped)."""
        target = self._lookup(ctx)
        if target is None:
            return (INVALID_VALUE,)
        if target.destroyed:
            return (CONTEXT_IS_DESTROYED,)
        if target.primary:
            return (INVALID_CONTEXT,)
        with self._lock:
            self._release_context_resources(target)
            target.destroyed = True
        stack = self._stack()
        if stack and stack[-1] is target:
            stack.pop()
        return (OK,)

    def _release_context_resources(self, ctx: SimContext):
        ctx.reset()

    def _in_host_function(self) -> bool:
        """Whether this thread is running a host function (the stream model knows)."""
        return False

    # -- the stack ------------------------------------------------------------------------

    def cuCtxPushCurrent(self, ctx):
        target = self._lookup(ctx)
        if target is None:
            return (INVALID_VALUE,)
        if target.destroyed:  # the real driver corrupts its heap here; the sim says no
            return (CONTEXT_IS_DESTROYED,)
        self._stack().append(target)
        return (OK,)

    def cuCtxPopCurrent(self):
        stack = self._stack()
        if not stack:
            return (INVALID_CONTEXT, None)
        return (OK, CUcontext(stack.pop().handle))

    def cuCtxSetCurrent(self, ctx):
        stack = self._stack()
        if ctx is None or int(ctx) == 0:
            if stack:
                stack.pop()
            return (OK,)
        target = self._lookup(ctx)
        if target is None:
            return (INVALID_VALUE,)
        if target.destroyed:
            return (CONTEXT_IS_DESTROYED,)
        if stack:
            stack[-1] = target
        else:
            stack.append(target)
        return (OK,)

    def cuCtxGetCurrent(self):
        if not self._initialized:
            return (NOT_INITIALIZED, None)
        if self._in_host_function():
            return (NOT_PERMITTED, None)  # as on an H100, driver 580
        stack = self._stack()
        return (OK, CUcontext(stack[-1].handle if stack else 0))

    def cuCtxGetDevice(self):
        stack = self._stack()
        if not stack:
            return (INVALID_CONTEXT, None)
        return (OK, CUdevice(stack[-1].device))  # answered even for a destroyed context

    def cuCtxGetFlags(self):
        err, ctx = self._work_context()
        return (err, ctx.flags if ctx else None)

    def cuCtxGetApiVersion(self, ctx):
        target = self._lookup(ctx)
        if target is None:
            return (INVALID_CONTEXT, None)
        if target.destroyed:
            return (CONTEXT_IS_DESTROYED, None)
        return (OK, self._spec["api_version"])

    def cuCtxSynchronize(self):
        err, ctx = self._work_context()
        if err:
            return (err,)
        return (self._synchronize_context(ctx),)

    def _synchronize_context(self, ctx: SimContext):
        """Run all work queued in ``ctx``; the stream model overrides this."""
        return OK

    def _device_synchronized(self, device: int) -> None:
        """A stream, event or context synchronize of ``device`` returned (pools release)."""

    def _block_dropped(self, block) -> None:
        """A block of device memory left the address space (pools account for it)."""

    # -- primary contexts -----------------------------------------------------------------

    def _primary_of(self, dev):
        ordinal = int(dev)
        entry = self._primary[ordinal]
        if entry is None:
            entry = self._primary[ordinal] = [self._new_context(ordinal, 0, primary=True), 0]
        return entry

    def cuDevicePrimaryCtxRetain(self, dev):
        if not self._initialized:
            return (NOT_INITIALIZED, None)
        if self._device(dev) is None:
            return (INVALID_DEVICE, None)
        with self._lock:
            entry = self._primary_of(dev)
            entry[1] += 1
            entry[0].active = True
        return (OK, CUcontext(entry[0].handle))

    def cuDevicePrimaryCtxRelease(self, dev):
        if self._device(dev) is None:
            return (INVALID_DEVICE,)
        with self._lock:
            entry = self._primary_of(dev)
            if entry[1] == 0:
                return (INVALID_CONTEXT,)
            entry[1] -= 1
            if entry[1] == 0:
                ctx = entry[0]
                self._release_context_resources(ctx)
                ctx.active = False
        return (OK,)

    def cuDevicePrimaryCtxGetState(self, dev):
        if self._device(dev) is None:
            return (INVALID_DEVICE, None, None)
        ctx, refs = self._primary_of(dev)
        return (OK, ctx.flags, int(refs > 0))

    def cuDevicePrimaryCtxReset(self, dev):
        if self._device(dev) is None:
            return (INVALID_DEVICE,)
        with self._lock:
            self._release_context_resources(self._primary_of(dev)[0])
        return (OK,)

    # -- memory info (the memory model adds allocations) ------------------------------------

    def cuMemGetInfo(self):
        err, ctx = self._work_context()
        if err:
            return (err, None, None)
        device = self._devices[ctx.device]
        free = device.total_mem - device.reserved - self._device_bytes_in_use(ctx.device)
        return (OK, free, device.total_mem)

    def _device_bytes_in_use(self, ordinal: int) -> int:
        return 0
