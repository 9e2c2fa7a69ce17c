"""The race checker's clocks: one actor per stream (per context; the per-thread default stream
per host thread too) and the host, each with a vector clock (actor id -> epoch).

An operation on a stream takes the stream's epoch and then advances it, so an earlier
operation (actor a, epoch e) happens before a later one on a stream whose clock says
``clock[a] > e``. A stream's work comes after what the host has seen finish when it is
submitted, and the host's clock only grows, so a stream's clock is the host's joined with
what the stream learnt beyond it (waits, the legacy stream's barrier): an actor keeps only
that part (``Actor.clock``), and `ordered` looks at the host's where it has nothing. A
synchronize then costs a join into the host's clock, not one into every stream's.

`Clocks.enter` gives the stream's actor after the legacy stream's barrier with the blocking
streams of its context (both ways). The host is one clock for all threads: what one thread
saw finish orders what every thread submits after it (see _racecheck.py). Actor ids are
never reused, so a stamp names its actor for good.

Retiring (`prune`, at a sweep): entries the host's clock covers are dropped from the
actors' clocks; an actor the host covers entirely that did nothing since the last sweep is
dropped: its stamps are behind the host (the sweep retired them) and what it knew the host
knows. A stream used again after that gets a fresh actor: the same order as before.
"""

from __future__ import annotations

import itertools
from typing import Any

from .._driver import LEGACY, PER_THREAD

_generations = itertools.count()


class Actor:
    __slots__ = ("id", "clock", "ctx_key", "legacy", "blocking", "mark", "gone")

    def __init__(self, actor: int, ctx_key: int, legacy: bool, blocking: bool) -> None:
        self.id = actor
        self.clock = {actor: 1}  # beyond the host's (its own epoch always)
        self.ctx_key = ctx_key
        self.legacy = legacy  # the legacy default stream of its context
        self.blocking = blocking  # the legacy stream, or a stream that waits for it
        self.mark = 0  # its epoch at the last sweep: unchanged means idle since
        self.gone = False  # pruned: the stream gets a new actor at its next operation


class Clocks:
    """The actors of the streams seen, and the host's clock."""

    def __init__(self) -> None:
        self.host: dict[int, int] = {}  # what any thread saw finish
        # A Stream remembers its actor (``_checked``: (generation, actor)), for these clocks
        # only: one look per operation.
        self.generation = next(_generations)
        self._next = 0
        self._table: dict[tuple, Actor] = {}  # (context key, stream key, thread) -> actor
        self._of_ctx: dict[int, list[Actor]] = {}  # context key -> its stream actors
        self._blocking: dict[int, list[Actor]] = {}  # context key -> its blocking ones
        self._legacy: dict[int, Actor] = {}  # context key -> its legacy stream's

    def enter(self, stream: Any, thread: int) -> Actor:
        """``stream``'s actor (``thread`` submits), after the legacy stream's barrier."""
        entry = stream._checked
        if entry is None or entry[0] != self.generation or entry[1].gone:
            actor = self._find(stream, thread)
        else:
            actor = entry[1]
        if actor.blocking:
            clock = actor.clock
            if actor.legacy:
                for other in self._blocking[actor.ctx_key]:
                    if other is not actor:
                        join(clock, other.clock)
            else:
                legacy = self._legacy.get(actor.ctx_key)
                if legacy is not None:
                    join(clock, legacy.clock)
        return actor

    def _find(self, stream: Any, thread: int) -> Actor:
        ctx_key, key = stream._ctx._key, stream._key
        key = LEGACY if key == 0 else key
        full = (ctx_key, key, thread if key == PER_THREAD else 0)
        actor = self._table.get(full)
        if actor is None:
            actor = self._table[full] = Actor(
                self._next, ctx_key, key == LEGACY, _is_blocking(stream, key)
            )
            self._next += 1
            self._of_ctx.setdefault(ctx_key, []).append(actor)
            if actor.legacy:
                self._legacy[ctx_key] = actor
            if actor.blocking:
                self._blocking.setdefault(ctx_key, []).append(actor)
        if key != PER_THREAD:  # (one Stream object for every thread's: looked up each time)
            stream._checked = (self.generation, actor)
        return actor

    def host_joins(self, *clocks: dict[int, int]) -> None:
        """The host has seen what ``clocks`` say (a thread synchronized)."""
        host = self.host
        for clock in clocks:
            join(host, clock)

    def of_context(self, ctx_key: int) -> list[Actor]:
        return self._of_ctx.get(ctx_key, [])

    def covered(self, clock: dict[int, int]) -> bool:
        """Whether the host has seen everything ``clock`` says."""
        host = self.host
        return all(host.get(actor, 0) >= epoch for actor, epoch in clock.items())

    def advanced(self) -> int:
        """How many operations took an epoch (touched memory) since the last `prune`."""
        return sum(actor.clock[actor.id] - actor.mark for actor in self._table.values())

    def prune(self) -> set[int]:
        """Drop what the host's clock covers: entries of the actors' clocks, and the actors
        it covers that were idle since the last prune; their ids. Call it only after every
        stamp the host covers was retired."""
        host = self.host
        gone = set()
        for full, actor in list(self._table.items()):
            epoch = actor.clock[actor.id]
            if epoch == actor.mark and self.covered(actor.clock):
                gone.add(actor.id)
                del self._table[full]
                actor.gone = True
            else:  # (a new dict: one that shrank keeps its size)
                actor.clock = {
                    a: e for a, e in actor.clock.items() if e > host.get(a, 0) or a == actor.id
                }
            actor.mark = epoch
        if not gone:
            return gone
        for table in (*self._of_ctx.values(), *self._blocking.values()):
            table[:] = [actor for actor in table if actor.id not in gone]
        for table in (self._of_ctx, self._blocking):
            for ctx_key in [key for key, actors in table.items() if not actors]:
                del table[ctx_key]
        for ctx_key in [key for key, actor in self._legacy.items() if actor.id in gone]:
            del self._legacy[ctx_key]
        self.host = {a: e for a, e in host.items() if a not in gone}
        return gone

    def __len__(self) -> int:
        return len(self._table)


def ordered(actor: int, epoch: int, clock: dict[int, int], host: dict[int, int]) -> bool:
    """Whether the operation ``(actor, epoch)`` happened before the next one of the stream
    whose clock (beyond the host's) is ``clock``."""
    return clock.get(actor, 0) > epoch or host.get(actor, 0) > epoch


def join(into: dict[int, int], other: dict[int, int]) -> None:
    for actor, epoch in other.items():
        if into.get(actor, 0) < epoch:
            into[actor] = epoch


def _is_blocking(stream: Any, key: int) -> bool:
    if key in (LEGACY, PER_THREAD):
        return True
    drv = stream._backend.driver
    query = getattr(drv, "cuStreamGetFlags", None)
    if query is None:  # the sim does not answer it yet: its own stream table does
        sim = getattr(drv, "_streams", {}).get(stream._key)
        return sim is not None and not sim.flags & 1
    err, flags = query(stream._handle)
    return not err and not int(flags) & 1  # CU_STREAM_NON_BLOCKING
