"""The memory an `@autograph` function's calls allocate and drop, kept from call to call: a
temporary gets the same address on every call, so the graph nodes that use it need no patch.

Each function has an `Arena` of slots, one per (allocation index within the call, stream):
the k-th allocation of a call on stream s is served by slot (k, s). A slot holds one block
(a stream-ordered `Allocation` of the pool) and one `Lease` of it, an `Allocation` of the
same memory that the arrays of a call hold as theirs. The lease is lent to a call while
nothing but the slot holds it: its reference count says so (CPython's, which cuctx needs
anyway), so lending costs no new object and giving back costs nothing at all. A lease still
held (an array of an earlier call was returned or stored: it outlives its call, or another
thread's call uses it now) is not lent, and the allocation comes from the pool, as eagerly:
nothing a caller keeps is ever handed out again while it lives.

Ordering is the pool's: a lease is lent again only for an allocation on the stream its block
was allocated on, whose work comes after the work queued there before (a graph of the call
is launched after that work too; calls of one function enqueue their work one at a time). A
lease that was `record_stream`-ed to other streams is not lent again: its block is freed by
the pool's rules, after those streams' work. While any capture is active nothing is lent
(the capture makes graph memory of the allocations in it).

Graph nodes keep what they use alive: an executable built from a call holds the *block*
(`anchor`), never the lease, so the block lives as long as the executable even after its
slot is trimmed or cleared, and the lease is free again after the call. The trace sees the
blocks' own allocations and frees: a lease is no new memory. The compiled path lends from the
same slots (cuctx/csrc/arrays.c).
"""

from __future__ import annotations

import sys
import threading
from typing import Any

from .. import _lifetimes
from ..memory._alloc import Allocation, from_pool
from ..memory._array import DeviceArray
from ..stream import Stream

SLOTS_KEPT = 16  # at least this many slots are kept, or 4x a call's allocations if more
_getrefcount = sys.getrefcount


class Slot:
    __slots__ = ("block", "capacity", "lease")

    def __init__(self) -> None:
        self.block: Allocation | None = None
        self.capacity = 0
        self.lease: Lease | None = None  # None: no block, or its lease was dropped


class Lease(Allocation):
    """A slot's block as the allocation of the arrays of one call at a time (see the module's
    docstring)."""

    __slots__ = ("block",)

    def __init__(self, block: Allocation) -> None:
        self.ptr, self.nbytes, self.stream, self.recorded = (
            block.ptr,
            block.nbytes,
            block.stream,
            [],
        )
        self.pool = block.pool  # (the device's default pool's: arenas lend only its memory)
        self.shared = None
        self._free = None  # (the block's free is the block's)
        self.block = block


# What a slot's lease is while its first block is being allocated (never idle: this module
# holds it too).
_MAKING: Any = object()


def _idle(slot: Slot) -> bool:
    """Whether the slot's lease is held by nothing but the slot (getrefcount's argument is
    the one other reference)."""
    return _getrefcount(slot.lease) <= 2


class Arena:
    """One function's slots (see the module's docstring); `bytes` is what their blocks
    hold. The compiled path lends from them as `lend` does, while nobody holds the lock."""

    __slots__ = ("lock", "bytes", "slots", "_most", "_grown")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.bytes = 0
        # (index, stream) -> slot, least recently lent first (a lend moves its slot to the
        # end: a plain dict, which C code can reorder as Python does).
        self.slots: dict[tuple[int, Stream], Slot] = {}
        self._most = 0  # the most allocations one call made
        self._grown = False  # blocks were allocated since the last trim

    def lend(self, index: int, nbytes: int, stream: Stream) -> Lease | None:
        """The ``index``-th allocation of a call, ``nbytes`` on ``stream``: its slot's lease
        (of a new block the slot keeps when it has none that fits), or None (allocate from
        the pool)."""
        if _lifetimes.capturing:
            return None
        key = (index, stream)
        with self.lock:
            if index >= self._most:
                self._most = index + 1
            slot = self.slots.pop(key, None)
            if slot is None:
                slot = Slot()
            elif slot.lease is not None:
                if not _idle(slot):
                    self.slots[key] = slot
                    return None
                # Used on other streams, too small, or freed with its context: a new block.
                if slot.lease.recorded or slot.capacity < nbytes or not slot.block.alive:
                    self.drop(slot)
            self.slots[key] = slot  # (at the end: the most recently lent)
            lease = slot.lease
            if lease is not None:
                return lease
            slot.lease = _MAKING  # (not idle: no other call takes the slot meanwhile)
        try:
            block = from_pool(nbytes, stream)
        except BaseException:
            slot.lease = None
            raise
        lease = Lease(block)
        with self.lock:
            slot.block, slot.capacity, slot.lease = block, nbytes, lease
            self.bytes += nbytes
            self._grown = True
        return lease

    def drop(self, slot: Slot) -> None:
        """Let go of the slot's block (the pool frees it once nothing uses it, after the
        streams its lease was recorded on); under the lock."""
        if slot.block is not None:
            slot.block.recorded.extend(slot.lease.recorded)  # its free waits for them
            self.bytes -= slot.capacity
        slot.block, slot.capacity, slot.lease = None, 0, None

    def trim(self, max_bytes: int) -> None:
        """Keep at most 4x the slots a call uses (at least SLOTS_KEPT) and at most
        ``max_bytes`` in blocks: the least recently lent idle slots go first."""
        if not self._grown:
            return
        with self.lock:
            self._grown = False
            limit = max(SLOTS_KEPT, 4 * self._most)
            slots = self.slots
            if len(slots) <= limit and self.bytes <= max_bytes:
                return
            for key, slot in list(slots.items()):
                if len(slots) <= limit and self.bytes <= max_bytes:
                    break
                if slot.lease is None or _idle(slot):
                    self.drop(slot)
                    del slots[key]

    def clear(self) -> None:
        """Let go of every block (a lent one goes when its arrays go)."""
        with self.lock:
            for slot in self.slots.values():
                self.drop(slot)
            self.slots.clear()


def anchor(obj: Any) -> Any:
    """``obj``, or for an array on lent memory the same array holding the block itself:
    what a graph node keeps alive (its lease must be free for the next call)."""
    if obj.__class__ is DeviceArray and obj._alloc.__class__ is Lease:
        return DeviceArray._make(
            obj._ctx,
            obj.ptr,
            obj.shape,
            obj.dtype,
            obj.strides,
            obj._alloc.block,
            obj._owner,
            (obj._c, obj._f),
        )
    return obj
