"""What a graph executable keeps alive, and its end: `_Held` (the objects its work uses,
handed to the queues of the streams it ran on when it goes), a private graph's nodes let go
of it (`_unlink_private`), the destroy (`_destroy_exec`) and the executables let go of when
their context is torn down (`_live`, `_forget_context`).

Kept apart from `_exec.py`, whose `GraphExec` says what an executable does; this is when
what it used may go, as `_lifetimes` is for streams.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

from ..context import ACTIVE, DESTROYED, Context

if TYPE_CHECKING:
    from ..stream import Stream


class _Held:
    """What an executable's work uses; its finalizer hands it to the queues of the streams
    it was launched on, so the objects outlive the launches still running."""

    __slots__ = ("objects", "slots", "streams")

    def __init__(self) -> None:
        self.objects: tuple = ()
        self.slots: dict[int, Any] = {}  # position -> per-node update state (its arguments)
        self.streams: set[Stream] = set()


def _retire(held: _Held, objects: Any) -> None:
    """Objects the executable no longer uses, which launches still queued may: the streams
    it ran on keep them until they are known idle."""
    if objects:
        for stream in held.streams:
            stream._hold(objects)


def _unlink_private(graphs: tuple, keep: tuple = ()) -> None:
    """Drop the nodes' references to each of ``graphs`` (an executable's graph and its
    latest whole update's) that is private (AutoGraph's: `_autograph_build.construct`),
    those in ``keep`` aside, once no executable uses it. A graph and its nodes refer to each
    other: without this the graph (and its driver graph) lived until the garbage
    collector's next pass, which then destroyed it inside whatever ran (on an H100, builds
    of 1000 kernels took 4.0-5.3 ms so, and 8-13 ms where a pass freed several; 3.2-3.3
    with graphs freed when let go)."""
    for graph in graphs:
        if graph._private and not any(graph is k for k in keep):
            for node in graph._nodes:
                node.graph = None


def _destroy_exec(drv, handle, ctx: Context, held: _Held) -> None:
    _unlink_private(held.objects[:2])
    if ctx._state is ACTIVE:  # launches may still run: keep it all until they ran
        _retire(held, (held.objects, list(held.slots.values())))
    held.objects, held.slots, held.streams = (), {}, set()
    if ctx._state != DESTROYED:  # the driver freed it with the context, and must not see it
        drv.cuGraphExecDestroy(handle)


# Executables by context key, to let go of what they keep when their context is torn down.
_live: dict[int, weakref.WeakSet] = {}


def _forget_context(ctx: Context) -> None:
    for exe in list(_live.pop(ctx._key, ())):
        held = exe._held
        held.objects, held.slots, held.streams = (), {}, set()
