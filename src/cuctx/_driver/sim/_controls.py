"""What only the simulated GPU can do: ``backend.sim`` on the sim backend (None on cuda).

These controls are not driver functions, so they are not on ``backend.driver``, which offers
only what ``cuda.bindings.driver`` has. They follow the driver's return convention (a tuple
whose first item is a ``CUresult``) so that the layers above translate failures with the
same `cuctx._calls.fail`. The public face for users is the `cuctx.sim` module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cuda.bindings.driver import CUresult

from ._common import INVALID_CONTEXT, INVALID_HANDLE, INVALID_VALUE, OK
from ._graph_conditional import CondWork
from ._timing import BUSY
from ._twins import decoders

if TYPE_CHECKING:
    from .driver import SimDriver


class SimControls:
    """Fault injection, work of a given duration, kernel twins and the virtual clock of one
    `SimDriver`."""

    __slots__ = ("_driver",)

    def __init__(self, driver: SimDriver) -> None:
        self._driver = driver

    def inject_fault(self, hctx, error: CUresult) -> tuple[CUresult]:
        """Make the context ``hctx`` fail as if a kernel in it had hit ``error`` (a sticky
        CUresult): its next call that does work fails with it and poisons it."""
        target = self._driver._lookup(hctx)
        if target is None or target.destroyed:
            return (INVALID_CONTEXT,)
        target.sticky = error
        return (OK,)

    def stream_busy(self, hstream, ns: int) -> tuple[CUresult]:
        """Enqueue an operation that does nothing for ``ns`` virtual nanoseconds on
        ``hstream`` (a stand-in for a long kernel, to test timing and races)."""
        if int(ns) < 0:
            return (INVALID_VALUE,)
        return (self._driver._enqueue(hstream, None, cost_ns=int(ns), label="busy", kind=BUSY),)

    def subscribe_activity(self, callback) -> tuple[CUresult]:
        """Call ``callback(record)`` with an `Activity` for every operation the sim executes
        from now on (kernels, copies, memsets, host functions, busy work; not event
        records or waits), when it executes, with the sim's lock held: store the record,
        call no driver function. Several callbacks may listen."""
        if not callable(callback):
            return (INVALID_VALUE,)
        with self._driver._lock:
            self._driver._activity += (callback,)
        return (OK,)

    def unsubscribe_activity(self, callback) -> tuple[CUresult]:
        """Stop calling ``callback`` (INVALID_VALUE when it does not listen)."""
        with self._driver._lock:
            listening = self._driver._activity
            if callback not in listening:
                return (INVALID_VALUE,)
            i = listening.index(callback)
            self._driver._activity = listening[:i] + listening[i + 1 :]
        return (OK,)

    def push_correlation(self, correlation: int) -> tuple[CUresult]:
        """Give every operation this thread queues from now on the external correlation id
        ``correlation`` (its `Activity.correlation`), until the matching pop: CUPTI's
        cuptiActivityPushExternalCorrelationId. Pushes nest; the innermost id counts."""
        tls = self._driver._tls
        if tls.correlation is None:
            tls.correlation = []
        tls.correlation.append(int(correlation))
        return (OK,)

    def pop_correlation(self) -> tuple[CUresult, int | None]:
        """(OK, the id pushed last on this thread), removing it; (INVALID_VALUE, None) when
        none is pushed."""
        stack = self._driver._tls.correlation
        if not stack:
            return (INVALID_VALUE, None)
        return (OK, stack.pop())

    def clock(self) -> int:
        """The host's virtual clock in nanoseconds: where the host stands after the last
        synchronization (event times are read from the same clock)."""
        return self._driver._now

    def pools_destroyed_early(self) -> int:
        """How many pools were destroyed while frees of their memory were still queued: the
        driver promises to wait for them, and crashed the process at a later pool's first
        allocation instead (H100s and an H200, driver 580, with another process using the
        GPU), so cuctx never does it (`cuctx.memory._pool_lifetime`); the sim counts it for
        tests."""
        return self._driver._pools_destroyed_early

    def set_kernel_twin(self, kernel, fn, kinds=None) -> tuple[CUresult]:
        """Make ``fn(grid, block, *args)`` the behaviour of ``kernel`` (a CUkernel or a
        CUfunction handle). ``kinds``: each parameter's kind ("int", "float", "struct",
        "other") where the caller knows the types, for decoding the arguments."""
        found = self._driver._kernel(kernel)
        if found is None:
            return (INVALID_HANDLE,)
        params = found.image.info.params
        if not callable(fn) or (kinds is not None and len(kinds) != len(params)):
            return (INVALID_VALUE,)
        found.kinds = decoders(fn, params, kinds)
        found.twin = fn
        return (OK,)

    def kernel_twin(self, kernel) -> tuple[CUresult, object]:
        """(OK, the twin registered for ``kernel`` or None)."""
        found = self._driver._kernel(kernel)
        return (OK, found.twin) if found else (INVALID_HANDLE, None)

    def set_conditional(self, handle, value: int) -> tuple[CUresult]:
        """What ``cudaGraphSetConditional(handle, value)`` does in a kernel, for kernel twins:
        set the condition ``handle`` (a CUgraphConditionalHandle, or the integer the twin
        received as its argument) to ``value`` (an unsigned int); the conditional node that
        reads it next sees the value."""
        condition = self._driver._conditions.get(int(handle))
        if condition is None or not 0 <= int(value) < 1 << 32:
            return (INVALID_VALUE,)
        condition.value = int(value)
        return (OK,)

    def name_node(self, hnode, name: str) -> tuple[CUresult]:
        """Give the conditional node ``hnode`` a name (cuctx passes its description and
        line) for the sentence `fault_cause` gives when the sim stops it: a WHILE node whose
        condition stays non-zero for ``MAX_ROUNDS`` rounds (`_graph_conditional`)."""
        node = self._driver._graph_node(hnode)
        if node is None or not isinstance(node.work, CondWork) or not isinstance(name, str):
            return (INVALID_VALUE,)
        node.work.name = name
        return (OK,)

    def fault_cause(self, hctx) -> tuple[CUresult, BaseException | None, str]:
        """(OK, exception or None, sentence) about what gave ``hctx`` its sticky fault: a
        twin that failed, or a WHILE node the sim stopped; (OK, None, "") for anything
        else."""
        ctx = self._driver._lookup(hctx)
        if ctx is None:
            return (INVALID_VALUE, None, "")
        exc, text = ctx.resources.get("fault_cause", (None, ""))
        return (OK, exc, text)
