"""Lifetimes of queued work: what the Python side must keep alive, and report, for work the
driver runs later. It sits below context.py and imports no cuctx object module.

An *owner* holds what its queued work needs: host arrays that asynchronous copies read or
write (`Owner.keep`), host functions with their arguments (`Owner.add_host_function`), and
the failures of those host functions until someone asks. Two kinds:

- `StreamQueue`: the work queued on one stream (by context and handle, since several Stream
  objects can name one stream). Kept objects go when the stream is known idle (a synchronize
  of it or of its context, `Stream.done` answering True, or a query every so often: only
  those kept before the wait began, see `marks`; a Stream's finalizer, `_destroy_stream`,
  synchronizes first while they are kept); a host function goes once it ran. No driver
  query is made while ``capturing`` is set (a stream being captured into a graph must not be
  queried; see "stream capture" below for what the lower layers ask about active captures).
- `GraphOwner`: a graph executable's. Its host functions run on every replay, so they stay
  registered until `release` (when the graph is destroyed).

When a context is torn down, everything filed under it goes (`forget_context`, registered as
the context's teardown callback). Also here: the host-function trampoline and the guard that
makes cuctx calls inside a host function raise `NotPermittedError` (see
`_driver.HostFunctionState`), and `defer_cleanup`'s held frees.
"""

from __future__ import annotations

import atexit
import ctypes
import itertools
import sys
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any, Callable

from cuda.bindings.driver import CU_STREAM_LEGACY, CUhostFn

from . import _driver
from ._driver import HOST_FUNCTION_STATE, in_host_function
from ._resource import DESTROYED
from .errors import HostFunctionError

if TYPE_CHECKING:
    from .context import Context

HOLD_CHECK = 64  # past this many kept objects, ask whether the stream is idle
_release_lock = threading.Lock()  # see StreamQueue.release_to


class Owner:
    """Keeps the Python objects of queued work alive; files its host functions' failures
    under ``key`` ((context key, stream handle) for a stream, (context key, id) for a graph)."""

    __slots__ = ("key", "_kept", "_functions")
    one_shot = False  # whether a host function is dropped once it ran

    def __init__(self, key: tuple[int, int]) -> None:
        self.key = key
        self._kept: list[Any] = []
        self._functions: list[int] = []  # keys in _pending

    def keep(self, obj: Any) -> None:
        self._kept.append(obj)

    def add_host_function(self, fn: Callable, args: tuple, on_gpu: bool) -> int:
        """Register ``fn(*args)``; the key is the userData to give cuLaunchHostFunc (or a
        graph's host node). Undo with `drop_host_function` when the driver refused it."""
        key = next(_keys)
        _pending[key] = (fn, args, self, on_gpu)
        if not self.one_shot:
            self._functions.append(key)
        return key

    def release(self) -> None:
        """The owner's work is done and will not run again: drop what it kept."""
        self._kept.clear()
        for key in self._functions:
            _pending.pop(key, None)
        self._functions.clear()


class StreamQueue(Owner):
    __slots__ = ("capturing", "_released", "context")
    one_shot = True

    def __init__(self, key: tuple[int, int], ctx: Context) -> None:
        super().__init__(key)
        # The Context object whose streams it serves (weakly): its handles may go to another
        # context once it is destroyed, and a stream of it that is collected later must not
        # take that context's queue (`_destroy_stream`).
        self.context = weakref.ref(ctx)
        self.capturing: Any = None  # the capture the stream takes part in: no query meanwhile
        self._released = 0  # kept objects let go so far: `mark` counts every one ever kept

    def keep(self, obj: Any, idle: Callable[[], bool] | None = None) -> None:
        """Keep ``obj`` until the stream is known idle; past HOLD_CHECK objects, ask
        ``idle()`` (a driver query) unless a capture is active: querying any stream during
        a capture invalidates it (measured on an H100)."""
        kept = self._kept
        kept.append(obj)
        if len(kept) > HOLD_CHECK and idle is not None and not capturing:
            mark = self.mark()  # the query releases the GIL: another thread may keep more
            if idle():
                self.release_to(mark)

    def mark(self) -> int:
        """How many objects this queue has kept so far, counted from its start: taken before
        a synchronize or a query, it says which objects that wait covers (`release_to`)."""
        return self._released + len(self._kept)

    def release_to(self, mark: int) -> None:
        """Drop the objects kept before ``mark``: the work that used them is done. Objects
        kept since (by another thread while the driver waited) stay. Two threads' waits may
        release at once: the count and the cut are made under a lock (`keep` appends without
        one; `mark`, read meanwhile, can only come out lower, which keeps more)."""
        with _release_lock:
            count = mark - self._released
            if count <= 0:
                return
            kept = self._kept
            dropped = kept[:count]
            del kept[:count]
            self._released = mark
        del dropped  # (their finalizers run outside the lock)

    def release(self) -> None:
        with _release_lock:
            dropped = self._kept[:]
            self._released += len(dropped)
            super().release()
        del dropped


class GraphOwner(Owner):
    __slots__ = ()


_queues: dict[tuple[int, int], StreamQueue] = {}


def queue(ctx: Context, stream_key: int) -> StreamQueue:
    """The owner of the work queued on a stream of ``ctx`` (made on first use)."""
    key = (ctx._key, stream_key)
    owner = _queues.get(key)
    if owner is None:
        owner = _queues[key] = StreamQueue(key, ctx)
    elif owner.context() is not ctx:  # the handle's next Context object (see below)
        owner.context = weakref.ref(ctx)
    # Per Context object: a handle outlives a released primary context's object, and the
    # queue filed under it then serves the next object for that handle.
    ctx._on_teardown(forget_context)
    return owner


def marks(ctx_key: int, stream_key: int | None = None) -> list[tuple[StreamQueue, int]]:
    """Marks of what the queue of a stream (or of every stream of a context, with
    ``stream_key`` None) kept so far. Take them before a synchronize; once it returned, give
    them to `idle`, which drops only what they cover: another thread can queue work (and
    keep its host arrays) while the driver waits, and that work may still run."""
    if stream_key is not None:
        owner = _queues.get((ctx_key, stream_key))
        return [] if owner is None else [(owner, owner.mark())]
    return [(owner, owner.mark()) for key, owner in list(_queues.items()) if key[0] == ctx_key]


def idle(taken: list[tuple[StreamQueue, int]]) -> None:
    """A synchronize that began after ``taken`` (from `marks`) returned: drop what the marks
    cover. The queue itself stays filed until its stream is destroyed (or its context): a
    thread that just looked it up may be about to keep an object in it."""
    if _held:
        run_held_finalizers()
    for owner, mark in taken:
        owner.release_to(mark)


def _destroy_stream(drv, handle, ctx: Context) -> None:
    alive = ctx._state != DESTROYED  # else the driver freed it with the context
    key = (ctx._key, int(handle))
    owner = _queues.get(key)
    if owner is not None and owner.context() is not ctx:
        # Filed for another Context object that got the same handles after this stream's
        # context went (its own queues went with it): that context's, not this stream's.
        owner = None
    if alive and owner is not None and owner._kept:  # its copies still use host arrays
        drv.cuStreamSynchronize(handle)
    if owner is not None:
        del _queues[key]  # before the handle can be reused
        owner.release()
    if alive:
        drv.cuStreamDestroy(handle)


# -- stream capture --------------------------------------------------------------------------
#
# graphs/_capture.py files each stream taking part in an active capture here, by (context key,
# stream handle), with its capture object (and sets the stream's queue's ``capturing``). The
# dict is empty unless a capture is active, so the layers below graphs/ ask with one truth
# test off their hot paths (``if _lifetimes.capturing:``), then call the functions that
# graphs/_capture.py installs here at import:
#
# - refuse_in_capture(operation, *, stream=None, event=None, ctx=None, legacy=None,
#   captures=None, why="") raises GraphCaptureError when the call would break an active
#   capture (a synchronize or query of a capturing stream, of an event recorded in a
#   capture, of a context with a capturing stream; a pageable copy on a capturing stream;
#   work on the legacy stream ``legacy`` while a global-mode capture is active in its
#   context; ``captures``: those the caller found it breaks, a graph instantiated while
#   they forbid it), after ending the captures of the calling thread it breaks; it returns
#   when the call is fine.
# - capture_failed(operation, code) -> str, for _calls.fail when the driver answered a
#   capture code: ends the calling thread's captures the driver invalidated, marks other
#   threads' ones broken, and returns the words to add to the error (the user's line, what
#   was ended).
# - held_by_capture(stream, ptr, free) -> bool: whether a free (``free()``) was taken to run
#   later: memory not allocated in the capture of ``stream`` is freed when that capture ends
#   (the driver accepts only graph allocations in a captured free), and a free on a stream
#   that does not capture waits with the destroys (below) until the last capture ends.

capturing: dict[tuple[int, int], Any] = {}
refuse_in_capture: Callable[..., None]
capture_failed: Callable[[str, int], str]
held_by_capture: Callable[[Any, int, Callable[[], None]], bool]


def holds(ctx_key: int, stream_key: int) -> bool:
    owner = _queues.get((ctx_key, stream_key))
    return owner is not None and bool(owner._kept)


def forget_context(ctx: Context) -> None:
    """Drop everything filed under a context that is gone: host functions that will never
    run, failures nobody can ask for any more, and kept objects."""
    ctx_key = ctx._key
    with _failures_lock:
        for key in [k for k, entry in _pending.items() if entry[2].key[0] == ctx_key]:
            del _pending[key]
        for key in [k for k in _failures if k[0] == ctx_key]:
            del _failures[key]
    for key in [k for k in _queues if k[0] == ctx_key]:
        _queues.pop(key).release()


# -- host functions: one C trampoline, a table of pending Python calls ---------------------
#
# The driver gets the address of one ctypes callback and an integer key as its userData. The
# table keeps each function, its arguments and its owner; failures are filed under the
# owner's key until a synchronize reports them.

_pending: dict[int, tuple[Callable, tuple, Owner, bool]] = {}  # fn, args, owner, on a GPU
_failures: dict[tuple[int, int], list[tuple[Callable, BaseException]]] = {}
_failures_lock = threading.Lock()
_keys = itertools.count(1)


def _run_host_func(key: int, _finalizing=sys.is_finalizing) -> None:
    # The C entry point: runs on the driver's thread (on the sim: the thread that
    # synchronizes), so nothing may escape into it. Only cuctx's own bookkeeping can raise
    # here, and only while the interpreter tears down (module globals gone): then the host
    # function is dropped.
    try:
        _call_pending(key)
    except BaseException:
        if not _finalizing():
            raise


def _call_pending(key: int) -> None:
    entry = _pending.get(key)
    if entry is None:  # already dropped (its context went away)
        return
    fn, args, owner, _ = entry
    if owner.one_shot:
        _pending.pop(key, None)
    guard = _enter_host_function()
    try:
        fn(*args)
    except BaseException as exc:  # noqa: BLE001 - reported at the next synchronize
        with _failures_lock:
            _failures.setdefault(owner.key, []).append((fn, exc))
    finally:
        _leave_host_function(guard)


def drop_host_function(key: int) -> None:
    """Forget a host function the driver did not accept."""
    _pending.pop(key, None)


def _enter_host_function() -> tuple:
    """Until `_leave_host_function`, every cuctx call of this thread raises: its state (of
    each backend) becomes HOST_FUNCTION_STATE, and the thread is marked for the entries that
    read no state."""
    ident = threading.get_ident()
    saved = [(backend, backend.tls.state) for backend in list(_driver._loaded.values())]
    for backend, _ in saved:
        backend.tls.state = HOST_FUNCTION_STATE
    nested = ident in in_host_function
    in_host_function.add(ident)
    return ident, nested, saved


def _leave_host_function(guard: tuple) -> None:
    ident, nested, saved = guard
    for backend, state in saved:
        backend.tls.state = state
    if not nested:
        in_host_function.discard(ident)


_TRAMPOLINE = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(_run_host_func)
TRAMPOLINE_FN = CUhostFn(ctypes.cast(_TRAMPOLINE, ctypes.c_void_p).value)
_EXIT_WAIT_S = 5.0


# ``exiting[0]`` is set once the interpreter exits (after every later atexit handler, the
# order being LIFO): frees of garbage collected from then on are not run, as weakref.finalize's
# with ``atexit = False`` are not (the driver tears everything down then). A list, so that a
# finalizer holding it reads it still while the interpreter clears this module's globals.
exiting = [False]


@atexit.register
def _exit() -> None:
    exiting[0] = True


@atexit.register
def _wait_for_host_functions() -> None:
    """At interpreter exit, give host functions still queued on a GPU a few seconds to run:
    the driver would otherwise call the trampoline from its thread while Python tears down.
    (Only one-shot ones: a graph's stay registered while it lives.)"""
    deadline = time.monotonic() + _EXIT_WAIT_S
    while (
        any(on_gpu and owner.one_shot for _, _, owner, on_gpu in list(_pending.values()))
        or in_host_function
    ) and time.monotonic() < deadline:
        time.sleep(0.001)


def take_failures(match: Callable[[tuple[int, int]], bool]) -> list:
    with _failures_lock:
        keys = [k for k in _failures if match(k)]
        return [f for k in keys for f in _failures.pop(k)]


def raise_host_func_errors(ctx: Context) -> None:
    """Raise `HostFunctionError` for host functions of any stream of ``ctx`` that failed
    since they were last reported (what Context.synchronize reports)."""
    if _held:
        run_held_finalizers()
    if orphans:
        free_orphans(ctx)
    if _failures:
        failures = take_failures(lambda k: k[0] == ctx._key)
        if failures:
            raise HostFunctionError(f"streams of {ctx!r}", failures) from failures[0][1]


# -- defer_cleanup: frees held until the outermost block ends -------------------------------

_defer_lock = threading.Lock()
_defer_depth = 0
_deferred: list[tuple[Callable, tuple]] = []


def free_or_defer(free: Callable, *args: Any) -> None:
    """Call ``free(*args)`` now, or at the end of the outermost `defer_cleanup` block (or,
    inside a host function, at the next cuctx call outside one: see `run_finalizer`)."""
    with _defer_lock:
        if _defer_depth:
            _deferred.append((free, args))
            return
    run_finalizer(free, *args)


# -- finalizers that run inside a host function or a capture --------------------------------
#
# A garbage collection can start anywhere, inside a host function too, where CUDA must not be
# called. A cuctx finalizer that finds itself there waits in this list, and runs at the next
# allocation, finalizer or synchronize outside a host function. While a stream capture is
# active, destroy calls (streams, events, graph executables, libraries, modules, page-locked
# memory) wait here too, since the driver refuses some of them in a capture and invalidates
# it (cuGraphExecDestroy, measured on an H100), and so do frees on streams that do not
# capture (`held_by_capture`); they run when the last capture ends. Frees on a capturing
# stream are the capture's business: free nodes of its own memory, others held to its end.

_held: list[tuple[Callable, tuple]] = []


def finalize(obj: Any, fn: Callable, *args: Any) -> weakref.finalize:
    """``weakref.finalize(obj, fn, *args)`` for a finalizer that calls CUDA: held while a host
    function runs on the collecting thread, never run at interpreter exit (the driver tears
    everything down then)."""
    finalizer = weakref.finalize(obj, _run_destroy, fn, *args)
    finalizer.atexit = False
    return finalizer


def _run_destroy(fn: Callable, *args: Any) -> None:
    if capturing:
        _held.append((fn, args))
        return
    run_finalizer(fn, *args)


def run_finalizer(fn: Callable, *args: Any) -> None:
    if in_host_function and threading.get_ident() in in_host_function:
        _held.append((fn, args))
        return
    if _held:
        run_held_finalizers()
    fn(*args)


# Stream-ordered memory that a context could not free before it was torn down (a poisoned
# context runs nothing): the device's pool still holds it after the context is gone. It is
# freed through the next context of the same device that allocates or synchronizes.
orphans: dict[Any, list[int]] = {}  # Device -> device pointers


def free_orphans(ctx: Context) -> None:
    """Free the orphaned pointers of ``ctx``'s device, with ``ctx`` (usable) current."""
    ptrs = orphans.pop(ctx._device, None)
    if not ptrs:
        return
    drv = ctx._backend.driver
    if drv.cuCtxPushCurrent(ctx._handle)[0]:
        orphans[ctx._device] = ptrs  # not now: the next one
        return
    try:
        for ptr in ptrs:
            drv.cuMemFreeAsync(ptr, CU_STREAM_LEGACY)  # nothing to report to: best effort
        drv.cuStreamSynchronize(CU_STREAM_LEGACY)  # rare: give the memory back now
    finally:
        drv.cuCtxPopCurrent()


def run_held_finalizers() -> None:
    """Run the finalizers held while host functions ran or captures were active (call
    outside a host function; nothing runs while a capture is active)."""
    while _held and not capturing:
        try:
            fn, args = _held.pop(0)
        except IndexError:  # another thread took the last one
            return
        fn(*args)


class _DeferCleanup:
    """The block of `defer_cleanup` (a class, not a generator: an autograph call enters one
    on every call). Stateless: the hold is the module's, so one object serves every block."""

    __slots__ = ()

    def __enter__(self) -> None:
        global _defer_depth
        with _defer_lock:
            _defer_depth += 1

    def __exit__(self, *exc_info: Any) -> None:
        global _defer_depth
        with _defer_lock:
            _defer_depth -= 1
            held = _deferred[:] if _defer_depth == 0 else []
            if held:
                _deferred.clear()
        for free, args in held:
            free(*args)


_DEFER = _DeferCleanup()


def defer_cleanup() -> _DeferCleanup:
    """Hold every free of device memory until the (outermost) block ends, as Numba's
    ``defer_cleanup`` does: memory of arrays that die inside the block stays allocated, so
    work still queued on other streams may use it. Blocks nest; the hold is process-wide,
    because arrays may be collected on any thread."""
    return _DEFER
