"""Contexts: primary and created ones, the per-thread context stack, lazy initialisation.

The driver keeps the real stack; cuctx mirrors what it pushes in a per-thread *shadow* stack
of `Context` objects, which keeps every context cuctx made current alive while it is on a
stack and lets ``with ctx:`` restore the exact previous stack. A `Context` is ``active``,
``destroyed`` (by `destroy`, `Device.reset`, or the driver's word) or ``poisoned`` (a sticky
fault). Every operation checks the state first: pushing a destroyed context corrupts the
heap on driver 580, and a poisoned one only answers with the old fault.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from . import _driver, _lifetimes, _record, _trace
from ._calls import call, fail, refuse_in_host_function
from ._enums import ContextFlags
from ._lifetimes import finalize, raise_host_func_errors
from ._resource import ACTIVE, DESTROYED, POISONED, Resource, upper
from .errors import (
    CONTEXT_IS_DESTROYED,
    INVALID_CONTEXT,
    INVALID_VALUE,
    ContextDestroyedError,
    ContextPoisonedError,
    CudaError,
    InvalidContextError,
)

if TYPE_CHECKING:
    from .device import Device


def exit_block(backend: _driver.Backend) -> None:
    """Leave the innermost ``with ctx:`` / ``with device:`` block of this thread: pop what
    the block pushed and left, then its own entry, so the stack is exactly as before."""
    state = backend.tls.state
    depth = state.blocks.pop()
    stack = state.stack
    pop = backend.driver.cuCtxPopCurrent
    while len(stack) > depth:
        err, _ = pop()
        if err:
            fail(
                backend,
                err,
                "cuCtxPopCurrent",
                hint="the context stack was popped past a `with` block by other code",
            )
        stack.pop()


class _InContext:
    __slots__ = ("_ctx", "_op", "_pushed")

    def __init__(self, ctx: Context, operation: str):
        self._ctx = ctx
        self._op = operation

    def __enter__(self) -> Context:
        ctx, operation = self._ctx, self._op
        ctx._check(operation)
        refuse_in_host_function(operation)
        drv = ctx._backend.driver
        self._pushed = int(drv.cuCtxGetCurrent()[1]) != ctx._key
        if self._pushed:
            (err,) = drv.cuCtxPushCurrent(ctx._handle)
            if err:
                fail(ctx._backend, err, "cuCtxPushCurrent", ctx)
        return ctx

    def __exit__(self, *exc_info) -> None:
        if self._pushed:
            self._ctx._backend.driver.cuCtxPopCurrent()


def in_context(ctx: Context, operation: str) -> _InContext:
    """THE way to run a call with ``ctx`` current (``with in_context(ctx, "Op"):``): checks
    ``ctx`` and that no host function runs, pushes it unless it is current, pops it after;
    the shadow stack is left alone (users write ``with ctx:``)."""
    return _InContext(ctx, operation)


class Context(Resource):
    """A CUDA context: the primary context of a device, one made by `Context.create`, or
    one made by another library and found current (``kind`` says which).

    ``with ctx:`` pushes it on this thread's context stack and restores the exact previous
    stack on exit. Objects made in a context hold a reference to it, so it lives as long as
    they do; a created context is destroyed when `destroy` is called or when the last
    reference goes, a primary context released.
    """

    __slots__ = (
        "_drv",
        "_device",
        "kind",
        "_state",
        "_fault",
        "_why_destroyed",
        "_finalizer",
        "_default_streams",
        "_teardown",
        "_before_teardown",
        "_allocations",
        "__weakref__",
    )

    def __init__(self) -> None:
        raise TypeError(
            "make contexts with Context.create(device), device.primary_context "
            "or cuctx.current_context()"
        )

    @classmethod
    def _wrap(cls, backend, handle, device, kind: str, finalizer=None) -> Context:
        ctx = object.__new__(cls)
        ctx._backend = backend
        ctx._drv = backend.driver
        ctx._handle = handle
        ctx._key = int(handle)
        ctx._device = device
        ctx.kind = kind
        ctx._state = ACTIVE
        ctx._fault, ctx._why_destroyed = None, ""
        ctx._default_streams = {}  # "legacy"/"per-thread" -> Stream, made on first use
        ctx._teardown = []  # called with the context when it is destroyed
        ctx._before_teardown = []  # called while it is still usable, just before
        ctx._allocations = None  # the pending frees of its allocations (memory._alloc)
        ctx._finalizer = finalize(ctx, *finalizer) if finalizer else None
        backend.contexts[ctx._key] = ctx
        return ctx

    # -- making contexts ------------------------------------------------------------------

    @classmethod
    def create(cls, device: Device | int | None = None, flags: ContextFlags | int = 0) -> Context:
        """Create a context on ``device`` and push it on this thread's stack (as
        cuCtxCreate does). Destroy it with `destroy`, or let it go out of scope."""
        device = current_device() if device is None else upper.device(device)
        if not isinstance(flags, int) or isinstance(flags, bool):
            raise TypeError(f"flags must be ContextFlags or an int, not {type(flags).__name__}")
        backend = device._backend
        drv = backend.driver
        stack = backend.tls.state.stack  # (read first: inside a host function it raises)
        err, handle = drv.cuCtxCreate(None, int(flags), device._handle)
        if err:
            fail(
                backend,
                err,
                "cuCtxCreate",
                hint=f"flags={int(flags):#x}; valid flags are ContextFlags members"
                if int(err) == INVALID_VALUE
                else "",
            )
        ctx = cls._wrap(backend, handle, device, "created", (drv.cuCtxDestroy, handle))
        stack.append(ctx)
        return ctx

    def destroy(self) -> None:
        """Destroy a created context. Every object bound to it becomes unusable: using one
        raises `ContextDestroyedError`. It leaves the calling thread's context stack wherever
        it sits there (the driver only pops it when it is on top); other threads that have it
        on their stacks drop it when their next cuctx call finds it current."""
        if self.kind != "created":
            raise InvalidContextError(
                INVALID_CONTEXT,
                "Context.destroy",
                "",
                f"{self!r} was not created by Context.create; primary contexts are released "
                "when unreferenced, or reset with device.reset()",
            )
        if self._state == DESTROYED:
            raise ContextDestroyedError(
                operation="Context.destroy", hint=f"{self!r} was already destroyed"
            )
        backend = self._backend
        drv = backend.driver
        state = backend.tls.state
        stack = state.stack  # inside a host function this raises, before anything is done
        on_top = int(drv.cuCtxGetCurrent()[1] or 0) == self._key
        if self._state is ACTIVE:
            self._tear_down_first()
        (err,) = drv.cuCtxDestroy(self._handle)
        if err and int(err) != CONTEXT_IS_DESTROYED:
            # still alive: leave it as it was, finalizer included
            fail(backend, err, "cuCtxDestroy", self)
        self._finalizer.detach()
        self._mark_destroyed("by Context.destroy")
        if on_top and stack and stack[-1] is self:  # the driver popped it
            stack.pop()
        if self in stack:  # deeper in the stack: the driver leaves it there, current later
            _take_out_of_stack(backend, state, self)

    # -- state ----------------------------------------------------------------------------

    @property
    def state(self) -> str:
        """``"active"``, ``"destroyed"`` or ``"poisoned"``."""
        return self._state

    @property
    def fault(self) -> CudaError | None:
        """The sticky fault that poisoned this context, if one did."""
        return self._fault

    @property
    def _ctx(self) -> Context:  # the Resource protocol: a context is its own
        return self

    def _on_teardown(self, callback: Callable[[Context], None], *, before: bool = False) -> None:
        """Call ``callback(self)`` once when this context is destroyed (how the layers above
        drop what they keep for it), or with ``before`` just before, while it still works."""
        callbacks = self._before_teardown if before else self._teardown
        if callback not in callbacks:
            callbacks.append(callback)

    def _tear_down_first(self) -> None:  # Context.destroy, Device.reset
        callbacks, self._before_teardown = self._before_teardown, []
        for callback in callbacks:
            callback(self)

    def _mark_destroyed(self, why: str) -> None:
        self._state = DESTROYED
        self._why_destroyed = why
        callbacks, self._teardown = self._teardown, []
        for callback in callbacks:
            callback(self)

    def _poison(self, fault: CudaError) -> None:
        if self._state == ACTIVE:
            self._state = POISONED
            self._fault = fault

    def _unusable(self, operation: str) -> CudaError:
        if self._state == POISONED:
            return ContextPoisonedError(self._fault, operation)
        return ContextDestroyedError(
            operation=operation,
            hint=f"{self!r} was destroyed {self._why_destroyed}; objects bound to it cannot "
            "be used any more",
        )

    def _check(self, operation: str) -> None:
        if self._state is not ACTIVE:
            raise self._unusable(operation)

    # -- the stack ------------------------------------------------------------------------

    # push, pop and `with` are hot paths, benchmarked against raw cuCtxPushCurrent/Pop:
    # they bind what they call and touch the thread state once.

    def push(self) -> None:
        """Push this context on the calling thread's context stack."""
        if self._state is not ACTIVE:
            raise self._unusable("Context.push")
        stack = self._backend.tls.state.stack  # before the driver call: see HostFunctionState
        (err,) = self._drv.cuCtxPushCurrent(self._handle)
        if err:
            fail(self._backend, err, "cuCtxPushCurrent", self)
        stack.append(self)

    def pop(self: Context | None = None) -> Context:
        """``Context.pop()``: pop the calling thread's current context and return it.
        ``ctx.pop()``: pop ``ctx``, which must be the current one; with another on top it
        raises ValueError naming that one, and pops nothing."""
        backend = (_driver._active or _driver.active()) if self is None else self._backend
        stack = backend.tls.state.stack
        if self is not None:
            top = live_current(backend)
            if top is not None and top is not self:
                raise ValueError(
                    f"Context.pop: {self!r} is not the current context of this thread; "
                    f"{top!r} is (the top of its context stack), and ctx.pop() pops only "
                    "the context it names, so nothing was popped. Pop the top with "
                    "Context.pop(), or use `with ctx:` blocks, which restore the stack"
                )
        err, handle = backend.driver.cuCtxPopCurrent()
        if err:
            fail(
                backend,
                err,
                "cuCtxPopCurrent",
                hint="the context stack of this thread is empty"
                if int(err) == INVALID_CONTEXT
                else "",
            )
        if stack and stack[-1]._handle == handle:
            return stack.pop()
        return _object_for(backend, handle)  # pushed by other code than cuctx

    def set_current(self) -> None:
        """Replace the top of this thread's stack with this context (push if empty)."""
        self._check("Context.set_current")
        stack = self._backend.tls.state.stack
        (err,) = self._drv.cuCtxSetCurrent(self._handle)
        if err:
            fail(self._backend, err, "cuCtxSetCurrent", self)
        if stack:
            stack[-1] = self
        else:
            stack.append(self)

    def __enter__(self) -> Context:
        if self._state is not ACTIVE:
            raise self._unusable("Context.__enter__")
        state = self._backend.tls.state
        (err,) = self._drv.cuCtxPushCurrent(self._handle)
        if err:
            fail(self._backend, err, "cuCtxPushCurrent", self)
        state.blocks.append(len(state.stack))
        state.stack.append(self)
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        state = self._backend.tls.state
        if len(state.stack) != state.blocks[-1] + 1:  # the block left more, or popped us
            return exit_block(self._backend)
        state.blocks.pop()
        err, _ = self._drv.cuCtxPopCurrent()
        if err:
            fail(self._backend, err, "cuCtxPopCurrent", self)
        state.stack.pop()

    # -- queries --------------------------------------------------------------------------

    @property
    def device(self) -> Device:
        return self._device

    @property
    def handle(self) -> int:
        """The CUcontext as an integer, for other libraries."""
        return self._key

    @property
    def api_version(self) -> int:
        self._check("Context.api_version")
        return call(self._backend, "cuCtxGetApiVersion", self._handle, ctx=self)

    @property
    def flags(self) -> ContextFlags:
        with _InContext(self, "Context.flags"):
            return ContextFlags(call(self._backend, "cuCtxGetFlags", ctx=self))

    def synchronize(self) -> None:
        """Wait for all work in this context; raises the fault if a kernel in it failed, and
        `HostFunctionError` if a host function launched on one of its streams raised."""
        if _record.threads:  # an autograph call enqueues what it recorded, and stops
            _record.interrupt("Context.synchronize")
        if _lifetimes.capturing:
            _lifetimes.refuse_in_capture("Context.synchronize", ctx=self)
        if _lifetimes.orphans:  # freed first, so this synchronize gives their memory back
            _lifetimes.free_orphans(self)
        held = _lifetimes.marks(self._key) if _lifetimes._queues else None
        if _trace.sinks:  # before the wait: what other threads queue meanwhile is not seen
            _trace.emit("sync_context", self, None)
        with _InContext(self, "Context.synchronize"):
            (err,) = self._drv.cuCtxSynchronize()
        if err:
            fail(self._backend, err, "cuCtxSynchronize", self)
        if held is not None:  # every stream of the context is idle
            _lifetimes.idle(held)
        raise_host_func_errors(self)

    def __repr__(self) -> str:
        where = f"device {self._device.ordinal}"
        return f"<Context {self.kind} {where} {self._key:#x} {self._state}>"


def _take_out_of_stack(backend: _driver.Backend, state, ctx: Context) -> None:
    """Take the destroyed ``ctx`` out of this thread's stack wherever it sits: pop the driver's
    stack down to its deepest entry, then push back what was above it (popping a destroyed
    context is safe; pushing one can abort the process, so no destroyed context goes back)."""
    stack, drv = state.stack, backend.driver
    first = stack.index(ctx)
    above = stack[first:]
    popped = []
    for _ in above:
        err, handle = drv.cuCtxPopCurrent()
        if err:  # other code popped more than cuctx knows of: nothing below to restore
            break
        popped.append(handle)
    keep = []
    for entry, handle in zip(above, reversed(popped)):  # bottom first
        if entry is not ctx and (entry._state != DESTROYED or entry.kind == "primary"):
            drv.cuCtxPushCurrent(handle)
            keep.append(entry)
    gone = [first + i for i, entry in enumerate(above) if entry not in keep]
    stack[first:] = keep
    state.blocks[:] = [depth - sum(1 for i in gone if i < depth) for depth in state.blocks]


def _device_of(backend, handle, current: bool = False) -> Device:
    drv = backend.driver
    if not current:  # the driver answers for the current context only
        (err,) = drv.cuCtxPushCurrent(handle)
        if err:
            fail(backend, err, "cuCtxPushCurrent")
    err, dev = drv.cuCtxGetDevice()
    if not current:
        drv.cuCtxPopCurrent()
    if err:
        fail(backend, err, "cuCtxGetDevice")
    with backend.lock:
        return upper.device._for_backend(backend, int(dev))


def _object_for(backend: _driver.Backend, handle, current: bool = False) -> Context:
    """The Context object of a handle the driver returned (``current``: the calling thread's
    current context); adopts contexts cuctx did not make (another library's), recognising a
    device's primary context as such."""
    ctx = backend.contexts.get(int(handle))
    if ctx is not None:
        return ctx
    device = _device_of(backend, handle, current)
    primary = device.primary_context  # retains it: as long as we hold it, it stays alive
    if primary._key == int(handle):
        return primary
    return Context._wrap(backend, handle, device, "foreign")


def live_current(backend: _driver.Backend) -> Context | None:
    """The calling thread's current context, or None; never a destroyed one: a created one
    destroyed while current here is popped first (driver stack and shadow), as needed."""
    stack = backend.tls.state.stack  # (read first: inside a host function it raises)
    drv = backend.driver
    while True:
        err, handle = drv.cuCtxGetCurrent()
        if err:
            fail(backend, err, "cuCtxGetCurrent")
        if not int(handle):
            return None
        ctx = backend.contexts.get(int(handle))
        if ctx is None:
            return _object_for(backend, handle, current=True)
        if ctx._state != DESTROYED:
            return ctx
        if ctx.kind == "primary":  # the handle outlives a reset: a new object stands for it
            backend.contexts.pop(ctx._key, None)
            return _object_for(backend, handle, current=True)
        drv.cuCtxPopCurrent()
        if stack and stack[-1] is ctx:
            stack.pop()


def current_context() -> Context | None:
    """The calling thread's current context, or None; never a destroyed one (`live_current`)."""
    return live_current(_driver.active())


def current_device() -> Device:
    """The device of the current context; device 0 when none is (a query: it makes none)."""
    ctx = current_context()
    return ctx.device if ctx is not None else upper.device(0)


def context_for(device: Device | int | None = None, *, primary: bool = False) -> Context:
    """THE rule for which context an operation uses: the current context if it is on
    ``device`` (any, when None), else ``device``'s primary context; with none current, the
    primary context (device 0's by default) becomes current and stays retained, as the
    runtime API does. ``primary=True``: the primary context of ``device`` (default: the
    current device), made current nowhere (memory that must outlive created contexts)."""
    if primary:
        return (current_device() if device is None else upper.device(device)).primary_context
    device = None if device is None else upper.device(device)
    ctx = live_current(_driver.active() if device is None else device._backend)
    if ctx is None:
        return (device or upper.device(0)).set_current()
    return ctx if device is None or ctx._device is device else device.primary_context


def ensure_context() -> Context:
    """The current context; with none, device 0's primary context (`context_for`)."""
    return context_for()


def synchronize() -> None:
    """Wait for all work on the current device (`Device.synchronize`), as
    cudaDeviceSynchronize does; with no context current, device 0 is initialised first."""
    context_for().device.synchronize()
