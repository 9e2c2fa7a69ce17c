"""Where the compiled fast path plugs into the classes: the one place that puts the C
implementations of `cuctx._native` in front of the checked Python methods.

Each method below becomes a ``_native.Method``: a compiled path for the common case that
hands every other case, and every call on a backend whose ``native`` slot is None, to the
Python method it stands in for (its ``__wrapped__``; ``help`` and ``inspect`` see that one).
The launchers' compiled paths are chosen in `Launcher._fast_path`. `setup` also gives
`Stream` a hash slot in C (the value `Stream.__hash__` computes; streams key every launcher
cache lookup).

While any value in `STEP_ASIDE` is true, the compiled record and wait step aside to the
checked paths, which announce the operation (a trace sink) or refuse it (inside a host
function); the compiled launch steps aside for `LAUNCH_STEP_ASIDE` (a host function, a
capture) and announces itself while a trace sink listens. A new reason to step aside is
one more (namespace, name) pair there. While some thread records an `@autograph` call
(`_record.threads`), the compiled record and wait step aside too (their Python paths hand
the operation to the recorder); a compiled launch hands its packed bytes to the calling
thread's recorder itself. `cuctx.empty`'s allocation of the default pool and an
`Allocation`'s free (its ``__del__``, a Method too) step aside to `_alloc.from_pool` and the
Python ``__del__`` for `ALLOC_STEP_ASIDE` and `FREE_STEP_ASIDE`.

Without the extension (no C compiler at install time) or with ``CUCTX_NATIVE=0`` nothing is
replaced and `launch` is the Python function.
"""

from __future__ import annotations

import time

from cuda.bindings.driver import CUcontext, CUresult

from . import _driver, _lifetimes, _record, _trace, memory
from .kernels import _launcher
from ._driver import Backend, ThreadState, native
from .errors import CudaError
from .graphs import _autograph, _autograph_policy
from .graphs._autograph import AutoGraph
from .graphs._autograph_arena import Arena, Lease, Slot
from .graphs._autograph_record import Recording
from .graphs._autograph_state import GRAPH, Entry, Tally
from .kernels._kernel import Kernel
from .kernels._library import _Code
from .kernels._launcher import Launcher
from ._resource import ACTIVE
from ._calls import fail
from .context import Context, _object_for
from .device import Device
from .event import Event
from .memory import _alloc, _array, _construct, _layout
from .memory._array import DeviceArray
from . import stream
from .stream import Stream

STEP_ASIDE = (
    (vars(_trace), "sinks"),  # a trace sink listens: the checked paths announce operations
    (vars(_driver), "in_host_function"),  # a host function runs: the checked paths refuse
)
# Launches announce themselves (`_trace.emit_launch`, while any of ANNOUNCE is true) and step
# aside only for what the checked path does differently: refusing inside a host function,
# and checking a capture's rules (the legacy stream in a global capture).
LAUNCH_STEP_ASIDE = (
    (vars(_lifetimes), "capturing"),
    (vars(_driver), "in_host_function"),
)
ANNOUNCE = ((vars(_trace), "sinks"),)
# cuctx.empty's allocation of the default pool and an Allocation's free run in C unless their
# Python paths (`_alloc.from_pool`, `Allocation.__del__` with `free_or_defer` and `_release`)
# have more to do than the driver call: announce it, refuse it, a capture's rules, finalizers
# held by a host function or a capture (they run first), the orphans of a torn-down context
# of the allocation's device (freed first: csrc/arrays.c looks them up by device, so another
# device's orphans slow no allocation here), a defer_cleanup block (it holds the free).
ALLOC_STEP_ASIDE = STEP_ASIDE + (
    (vars(_lifetimes), "capturing"),
    (vars(_lifetimes), "_held"),
)
FREE_STEP_ASIDE = STEP_ASIDE + (
    (vars(_lifetimes), "capturing"),
    (vars(_lifetimes), "_held"),
    (vars(_lifetimes), "_defer_depth"),
)

# (class, method name) of every method with a compiled path (cuctx/csrc/methods.c, IMPLS).
METHODS = (
    (Stream, "record"),
    (Stream, "wait"),
    (Event, "record"),
    (Context, "push"),
    (Context, "pop"),
    (Context, "__enter__"),
    (Context, "__exit__"),
    (Device, "__enter__"),
    (Device, "__exit__"),
    (Kernel, "__getitem__"),
    (Launcher, "__call__"),
    (AutoGraph, "__call__"),
    (_alloc.Allocation, "__del__"),
)


def _install():
    """Put the compiled methods on the classes; return the public `launch`, `empty` and
    `current_stream` (`empty` also in the modules that call it: `full`, `zeros`,
    `to_device` use it)."""
    module, _ = native.extension()
    if module is None:
        return _launcher.launch, _array.empty, stream.current_stream
    for cls, name in METHODS:
        python = vars(cls)[name]
        if isinstance(python, staticmethod):
            setattr(
                cls, name, staticmethod(module.Method(f"{cls.__name__}.{name}", python.__func__))
            )
        else:
            setattr(cls, name, module.Method(f"{cls.__name__}.{name}", python))
    # (after the methods: setup gives Launcher its call slot, which a class assignment of
    # __call__ would replace)
    module.setup(
        Context=Context,
        Stream=Stream,
        Event=Event,
        DeviceArray=DeviceArray,
        ThreadState=ThreadState,
        Device=Device,
        Kernel=Kernel,
        Launcher=Launcher,
        Tape=_record.Tape,
        AutoGraph=AutoGraph,
        Recording=Recording,
        Entry=Entry,
        Policy=_autograph_policy.Policy,
        Tally=Tally,
        Arena=Arena,
        Slot=Slot,
        Lease=Lease,
        Allocation=_alloc.Allocation,
        Backend=Backend,
        Code=_Code,
        ACTIVE=ACTIVE,
        CUresult=CUresult,
        CUcontext=CUcontext,
        fail=fail,
        object_for=_object_for,
        driver_namespace=vars(_driver),
        step_aside=STEP_ASIDE,
        launch_step_aside=LAUNCH_STEP_ASIDE,
        announce=ANNOUNCE,
        emit_launch=_trace.emit_launch,
        recording=_record.threads,
        autograph_namespace=vars(_autograph),
        policy_namespace=vars(_autograph_policy),
        GRAPH=GRAPH,
        CudaError=CudaError,
        defer=_lifetimes.defer_cleanup(),
        perf_counter=time.perf_counter,
        lifetimes_namespace=vars(_lifetimes),
        known_dtypes=_layout.KNOWN_DTYPES,
        default_dtype=_array.empty.__defaults__[0],
        from_pool=_alloc.from_pool,
        release=_alloc._release,
        exiting=_lifetimes.exiting,
        alloc_step_aside=ALLOC_STEP_ASIDE,
        free_step_aside=FREE_STEP_ASIDE,
    )
    compiled_empty = module.Method("empty", _array.empty)
    _array.empty = _construct.empty = memory.empty = compiled_empty
    current_stream = module.Method("current_stream", stream.current_stream)
    stream.current_stream = current_stream
    return module.Method("launch", _launcher.launch), compiled_empty, current_stream


launch, empty, current_stream = _install()
