"""The memory an `@autograph` function's calls allocate and drop, kept from call to call: a
temporary gets the same address on every call, so the graph nodes that use it need no patch.

Each function has an `Arena` of slots, one per (allocation index within the call, stream):
the k-th allocation of a call on stream s is served by slot (k, s). A slot holds one block
(a stream-ordered `Allocation` of the pool); it *lends* it to the call as a `Lease`, an
`Allocation` of the same memory whose end (the last array using it dropped, at the end of
the call for a temporary) gives the block back to the slot instead of freeing it. A slot
whose block is still lent (an array of an earlier call was returned or stored: it outlives
its call, or another thread's call uses it now) lends nothing, and the allocation comes from
the pool, as eagerly: nothing a caller keeps is ever handed out again while it lives.

Ordering is the pool's: a block goes back to its slot when its arrays die, and is lent again
only for an allocation on the same stream, whose work comes after the work queued there
before (a graph of the call is launched after that work too). A lease that was
`record_stream`-ed to other streams, or ends while its stream is being captured, does not go
back: its block is freed by the pool's rules (after those streams' work). While any capture
is active nothing is lent (the capture makes graph memory of the allocations in it).

Graph nodes keep what they use alive: an executable built from a call holds the *block*
(`anchor`), never the lease, so the temporary's lease still ends with the call, and the
block lives as long as the executable even after its slot is trimmed or cleared. The trace
sees the blocks' own allocations and frees: a lease is no new memory.
"""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict
from typing import Any

from .. import _lifetimes
from ..memory._alloc import Allocation, from_pool
from ..memory._array import DeviceArray
from ..stream import Stream

SLOTS_KEPT = 16  # at least this many slots are kept, or 4x a call's allocations if more


class _Slot:
    __slots__ = ("block", "capacity", "lent")

    def __init__(self) -> None:
        self.block: Allocation | None = None
        self.capacity = 0
        self.lent = False


class Lease(Allocation):
    """A slot's block lent to the arrays of one call: when the last of them goes, the block
    goes back to its slot (`_give_back`), held like any free until the call's work is
    enqueued (`defer_cleanup`)."""

    __slots__ = ("block", "slot", "arena")

    def __init__(self, arena: Arena, slot: _Slot) -> None:
        block = slot.block
        self.ptr, self.stream, self.recorded = block.ptr, block.stream, []
        self.pool = block.pool  # (the device's default pool's: arenas lend only its memory)
        self.block, self.slot, self.arena = block, slot, arena

    def __del__(self) -> None:
        if not sys.is_finalizing():
            _lifetimes.free_or_defer(_give_back, self.arena, self.slot, self.block,
                                     self.recorded)


def _give_back(arena: Arena, slot: _Slot, block: Allocation, recorded: list[Stream]) -> None:
    stream = block.stream
    captured = _lifetimes.capturing and (stream._ctx._key, stream._key) in _lifetimes.capturing
    with arena.lock:
        if slot.block is block:
            slot.lent = False
            if recorded or captured:  # not lent again: freed by the pool's rules instead
                arena.drop(slot)
    block.recorded.extend(recorded)  # its free waits for those streams


class Arena:
    """One function's slots (see the module's docstring); `bytes` is what their blocks
    hold."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.bytes = 0
        self._slots: OrderedDict[tuple[int, Stream], _Slot] = OrderedDict()  # least recent first
        self._most = 0  # the most allocations one call made
        self._grown = False  # blocks were allocated since the last trim

    def lend(self, index: int, nbytes: int, stream: Stream) -> Lease | None:
        """The ``index``-th allocation of a call, ``nbytes`` on ``stream``: a lease of its
        slot's block, of a new block the slot keeps, or None (allocate from the pool)."""
        if _lifetimes.capturing:
            return None
        key = (index, stream)
        with self.lock:
            if index >= self._most:
                self._most = index + 1
            slot = self._slots.get(key)
            if slot is None:
                slot = self._slots[key] = _Slot()
            elif slot.lent:
                return None
            self._slots.move_to_end(key)
            slot.lent = True
            if slot.block is not None and (slot.capacity < nbytes
                                           or not slot.block._finalizer.alive):
                self.drop(slot)  # too small, or freed with its context: a new one
            block = slot.block
        if block is None:
            try:
                block = from_pool(nbytes, stream)
            except BaseException:
                slot.lent = False
                raise
            with self.lock:
                slot.block, slot.capacity = block, nbytes
                self.bytes += nbytes
                self._grown = True
        return Lease(self, slot)

    def drop(self, slot: _Slot) -> None:
        """Let go of the slot's block (the pool frees it once nothing uses it); under the
        lock."""
        if slot.block is not None:
            self.bytes -= slot.capacity
            slot.block, slot.capacity = None, 0

    def trim(self, max_bytes: int) -> None:
        """Keep at most 4x the slots a call uses (at least SLOTS_KEPT) and at most
        ``max_bytes`` in blocks: the least recently lent idle slots go first."""
        if not self._grown:
            return
        with self.lock:
            self._grown = False
            limit = max(SLOTS_KEPT, 4 * self._most)
            slots = self._slots
            if len(slots) <= limit and self.bytes <= max_bytes:
                return
            for key, slot in list(slots.items()):
                if len(slots) <= limit and self.bytes <= max_bytes:
                    break
                if not slot.lent:
                    self.drop(slot)
                    del slots[key]

    def clear(self) -> None:
        """Let go of every block (a lent one goes when its arrays go)."""
        with self.lock:
            for slot in self._slots.values():
                self.drop(slot)
            self._slots.clear()


def anchor(obj: Any) -> Any:
    """``obj``, or for an array on lent memory the same array holding the block itself:
    what a graph node keeps alive (the lease must end with its call)."""
    if obj.__class__ is DeviceArray and obj._alloc.__class__ is Lease:
        return DeviceArray._make(obj._ctx, obj.ptr, obj.shape, obj.dtype, obj.strides,
                                 obj._alloc.block, obj._owner)
    return obj

