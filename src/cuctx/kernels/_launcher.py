"""Launchers: a kernel bound to a checked configuration and a stream (``kernel[grid, block,
shared_mem, stream]``, CUDA C's ``<<<Dg, Db, Ns, S>>>``), and `launch`, the same as a
function.

A launcher binds the driver call with everything but the parameter bytes fixed. Each thread
gets its own parameter buffer and a ``void*`` array pointing into it, whose address the
driver call receives (cuda.bindings passes an int ``kernelParams`` straight through as
``void**``); the driver copies the parameters during the call. The checked general path
packs from the kernel's plan for the argument types (`cuctx.kernels._plan`) and announces the
launch to trace sinks; it makes the fast path for that plan, which every thread then uses:
the compiled one (`cuctx._native`, when the backend's ``native`` slot is filled), else the
generated Python one (`cuctx.kernels._codegen`).
"""

from __future__ import annotations

import ctypes
import functools
import threading
from typing import TYPE_CHECKING, Any, Callable, Mapping

from . import _access, _codegen
from .. import _lifetimes, _record, _trace
from ._args import PACK_ERRORS
from .._driver import in_host_function
from ._launch_config import Config, driver_config, make_config, validate
from ._plan import Plan, pack_slowly
from .._calls import fail, refuse_in_host_function, refuse_legacy_in_global_capture
from ..context import ACTIVE, context_for
from ..stream import resolve_stream

if TYPE_CHECKING:
    from ._kernel import Kernel
    from ..stream import Stream


class Launcher:
    """A kernel bound to a checked launch configuration and a stream; call it with the
    kernel's arguments to launch. Made by ``kernel[grid, block, shared_mem, stream]``."""

    __slots__ = (
        "kernel",
        "config",
        "stream",
        "_ctx",
        "_owner",
        "_backend",
        "_packer",
        "_go_at",
        "_sim_args",
        "_ex_config",
        "_local",
        "_fast",
        "_fast_source",
        "_fast_plan",
        "_made",
        "_misses",
        "_node_spec",
        "__weakref__",
    )

    def __init__(self, kernel: Kernel, config: Config, stream: Stream):
        ctx = stream._ctx
        if ctx._state is not ACTIVE:
            raise ctx._unusable(f"launch of {kernel.name!r}")
        device = ctx.device
        kernel._check_launchable(ctx)
        if (config, device) not in kernel._checked:
            validate(kernel, device, config)
            kernel._checked.add((config, device))
        self.kernel = kernel
        self.config = config
        self.stream = stream
        self._ctx = ctx
        self._owner = kernel._owner
        self._backend = ctx._backend
        self._packer = kernel._packer()
        self._local = threading.local()  # .state: this thread's (buffer, bound driver call)
        # The fast path, used by every thread, is for the argument types of the first launch;
        # it follows types that changed for good (`_follow`). Those made are kept by plan.
        self._fast: Callable | None = None
        self._fast_source: str | None = None
        self._fast_plan: Plan | None = None
        self._made: dict[Plan, tuple[Callable, str]] = {}
        self._misses = 0  # checked launches with other types since the fast path was chosen
        self._node_spec: Any = None  # AutoGraph's graph node of this launch, once built
        kernel._launched.add(self)
        self._owner._used_in(ctx)
        drv = ctx._backend.driver
        function, handle = kernel._function, stream._handle
        # stream._bind: a default stream's handle means "the current context's", so for one
        # the call runs with the stream's context current.
        # The driver call but for (kernelParams, extra); the compiled path makes it from C.
        if config.cluster is None and not config.cooperative:
            self._ex_config = None
            self._sim_args = (function, *config.grid, *config.block, config.shared_mem, handle)
            self._go_at = functools.partial(stream._bind(drv.cuLaunchKernel), *self._sim_args)
        else:
            self._ex_config = driver_config(config, stream)
            self._sim_args = (self._ex_config, function)
            self._go_at = functools.partial(stream._bind(drv.cuLaunchKernelEx), *self._sim_args)

    @property
    def fast_source(self) -> str | None:
        """The source of this launcher's generated fast path, for the argument types of its
        latest checked launch (None before its first launch, with fast paths off:
        ``CUCTX_FASTPATH=0``, or when the compiled fast path launches: `cuctx.backend`'s
        ``native``)."""
        return self._fast_source

    def _thread_state(self) -> tuple[bytearray, Callable]:
        """This thread's parameter buffer and the driver call bound to its pointer array."""
        local = self._local
        buffer, pointers = self._packer.buffers()
        local.pointers = pointers  # the driver reads it at every call: keep it alive
        address = ctypes.addressof(pointers) if pointers is not None else 0
        state = local.state = (buffer, functools.partial(self._go_at, address, 0))
        return state

    def __call__(self, *args: Any) -> None:
        (self._fast or self._general)(args)

    def _general(self, args: tuple) -> None:
        """Every launch the fast path was not made for: the first one, a thread's first,
        other argument types (the fast path follows types that changed for good), bad
        arguments (for their errors), unusable contexts, calls from inside a host function,
        launches while a trace sink listens."""
        if in_host_function:
            refuse_in_host_function(f"launch of {self.kernel.name!r}")
        ctx = self._ctx
        if ctx._state is not ACTIVE:
            raise ctx._unusable(f"launch of {self.kernel.name!r}")
        if not self._owner._loaded:
            raise self._owner._gone(f"launch of {self.kernel.name!r}")
        try:
            buffer, go = self._local.state
        except AttributeError:  # this thread's first launch with this launcher
            buffer, go = self._thread_state()
        plan = self._packer.plan(args)
        try:
            plan.pack(buffer, self.stream, args)
        except PACK_ERRORS:
            pack_slowly(self._packer, plan, args, self.stream, buffer)
        # A recording thread's recorder (an autograph call) takes the packed launch instead.
        if not (_record.threads and _record.launch(self, buffer, args, plan)):
            if _lifetimes.capturing:  # (fast paths step aside while a capture listens)
                refuse_legacy_in_global_capture(self.stream, f"launch of {self.kernel.name!r}")
            (err,) = go()
            if err:
                self._fail(err)
            if _trace.sinks:
                _trace.emit_launch(self, args, plan)
        if plan is not self._fast_plan and _codegen.ENABLED:
            self._misses += 1
            if self._fast is None or self._misses >= _FOLLOW_AFTER:
                self._follow(plan)

    def _modes(self) -> tuple[str, ...]:
        """Each parameter's access mode for this launch (`_access.modes`: a mode given to
        `launch(access=)` for this call, the kernel's annotation, ``const``, else rw)."""
        override = _launch_access.modes
        modes = self.kernel._access_modes
        return _access.modes(self.kernel, override) if modes is None or override else modes

    def _enqueue(self, data: bytes, args: tuple, plan: Plan) -> None:
        """Launch with parameter bytes packed before (from ``args`` by ``plan``): a recorded
        launch that runs eagerly after all."""
        ctx = self._ctx
        if ctx._state is not ACTIVE:
            raise ctx._unusable(f"launch of {self.kernel.name!r}")
        try:
            buffer, go = self._local.state
        except AttributeError:
            buffer, go = self._thread_state()
        buffer[:] = data
        (err,) = go()
        if err:
            self._fail(err)
        if _trace.sinks:
            _trace.emit_launch(self, args, plan)

    def _follow(self, plan: Plan) -> None:
        """Make ``plan``'s fast path the launcher's (generating it the first time), so
        arguments whose types changed for good run fast again."""
        made = self._made.get(plan)
        if made is None:
            made = self._made[plan] = self._fast_path(plan)
        self._fast, self._fast_source = made
        self._fast_plan = plan
        self._misses = 0

    def _fast_path(self, plan: Plan) -> tuple[Callable, str | None]:
        """(fast path, its generated source or None) for ``plan``: the compiled one where
        the backend has it and it packs this plan, else the generated one. Both hand the
        packed bytes to a recording thread's recorder (an autograph call); the compiled one
        hands what it steps aside from to the generated one (which goes on to the checked
        path)."""
        generated = _codegen.fast_launch(
            plan,
            ctx=self._ctx,
            owner=self._owner,
            local=self._local,
            general=self._general,
            fail=self._fail,
            stream=self.stream,
        )
        native = self._backend.native
        if native is not None:
            c = self.config
            fast = native.launcher(
                plan,
                self._ctx,
                self._owner,
                self.stream,
                self.kernel._function,
                c.grid,
                c.block,
                c.shared_mem,
                self._ex_config,
                generated[0],
                self._fail,
                self._sim_args,
                self,
            )
            if fast is not None:
                return fast, None
        return generated

    def _retyped(self) -> None:
        """The kernel's parameters take other dtypes now (`Kernel.set_dtypes`): the fast
        paths made for its old plans are dropped; the next launch makes one anew."""
        self._fast = self._fast_source = self._fast_plan = None
        self._made = {}
        self._misses = 0

    def _fail(self, err) -> None:
        c = self.config
        fail(
            self._backend,
            err,
            "cuLaunchKernel",
            self._ctx,
            hint=f"kernel {self.kernel.name!r}, grid {c.grid}, block {c.block}, "
            f"shared_mem {c.shared_mem}",
        )

    def __repr__(self) -> str:
        c = self.config
        return (
            f"<Launcher {self.kernel.name!r} grid={c.grid} block={c.block} "
            f"shared_mem={c.shared_mem} on {self.stream!r}>"
        )


_LAUNCHER_CACHE_SIZE = 64
# Checked launches with other types than the fast path's before it follows them: types that
# changed for good get a fast path again; types alternating call by call switch it only
# once every so many calls (each switch sends the other types to the checked path).
_FOLLOW_AFTER = 8


def make_launcher(
    kernel: Kernel,
    grid: Any,
    block: Any,
    shared_mem: int = 0,
    stream: Any = None,
    cluster: Any = None,
    cooperative: bool = False,
) -> Launcher:
    """The launcher for this configuration; the same one each time it is asked for again, so
    ``kernel[...](...)`` and `launch` check and bind a configuration only once."""
    cache = getattr(kernel, "_launchers", None)
    if cache is None:
        raise TypeError(
            f"the kernel argument of cuctx.launch must be a cuctx.Kernel "
            f"(lib['name']), not {type(kernel).__name__}: {kernel!r}"
        )
    if stream is None:  # (no operation name: resolving None in a context cannot fail)
        stream = resolve_stream(None, kernel._ctx or context_for())
    # Types too: 1.0 == 1 and True == 1, but only the int passes the checks.
    key = (
        grid,
        block,
        shared_mem,
        stream,
        cluster,
        cooperative,
        type(grid),
        type(block),
        type(shared_mem),
    )
    try:
        return cache[key]
    except KeyError:
        pass
    except TypeError:  # an unhashable configuration (lists): not cached
        key = None
    config = make_config(grid, block, shared_mem, cluster, cooperative)
    launcher = Launcher(kernel, config, resolve_stream(stream))
    if key is not None:
        if len(cache) >= _LAUNCHER_CACHE_SIZE:  # many configurations: start over, stay small
            cache.clear()
        cache[key] = launcher
    return launcher


class _LaunchAccess(threading.local):
    modes: Mapping[int, str] | None = None  # (a class default: no AttributeError to catch)


# A launch's own access modes (``launch(..., access=...)``), read when the launch is announced
# to a trace sink.
_launch_access = _LaunchAccess()


def launch(
    kernel: Kernel,
    grid: Any,
    block: Any,
    *args: Any,
    shared_mem: int = 0,
    stream: Any = None,
    cluster: Any = None,
    cooperative: bool = False,
    access: Mapping[str | int, str] | None = None,
) -> None:
    """Launch ``kernel`` on a ``grid`` of ``block``-sized blocks (ints or 1-3 tuples) with
    ``args``, on ``stream`` (default: the current stream of the current context), with
    ``shared_mem`` bytes of dynamic shared memory per block, optionally as thread block
    ``cluster``s or as a ``cooperative`` launch. The configuration is checked against the
    device first: a violation raises `LaunchConfigError` naming the limit. ``access``: how
    this launch uses its pointer parameters, by name or index ("r", "w", "rw"), over the
    kernel's own (`Kernel.set_access`); the race checker reads it."""
    launcher = make_launcher(kernel, grid, block, shared_mem, stream, cluster, cooperative)
    if access is None or not _trace.sinks:
        return launcher(*args)
    _launch_access.modes = _access.resolve(kernel, access)
    try:
        launcher(*args)
    finally:
        _launch_access.modes = None
