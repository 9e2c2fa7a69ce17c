"""A `Recording` as a `Graph` (through the explicit graph API, so every node is checked and
keeps what it uses), and the per-node patches of an executable made from one.

Stream order becomes dependencies: each role (stream) has a *tail*, the nodes its next
operation comes after. A node on a role follows that role's tail and becomes it; a wait of
one followed stream for another adds the other's tail to the waiter's; a wait for an event
recorded in the call adds the tail the record had. Records become record nodes (the event
is recorded for whoever uses it after the call); waits for outside work have no node (the
executable's launch waits for it, see `_autograph.AutoGraph._launch`). Nodes keep the memory
of the call's temporaries through its block, not its lease (`_autograph_arena.anchor`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable

import numpy as np
from cuda.bindings.driver import CUresult

from ..context import fail
from ..kernels._launcher import Launcher
from ._autograph_arena import anchor
from ._autograph_record import COPY, FILL, HOST, RECORD, Recording
from ._graph import Graph, GraphNode

if TYPE_CHECKING:
    from ._exec import GraphExec

# Node kinds `GraphExec.update_node` changes; other changed nodes need a whole update.
PATCHABLE = frozenset({"kernel", "copy", "fill"})
# The estimate of an executable's size per node (the driver's own bookkeeping, which it does
# not report), on top of the kernel parameter bytes: what max_bytes counts.
NODE_BYTES = 1024


def unbuildable(recording: Recording) -> str | None:
    """Why no graph can hold this structure (None: one can)."""
    if not recording.keys:
        return "the call enqueues no work"
    for key in recording.keys:
        if key.__class__ is Launcher:
            config = key.config
            if config.cluster is not None or config.cooperative:
                return (f"launch of {key.kernel.name!r} with "
                        f"{'a cluster' if config.cluster is not None else 'cooperative'} "
                        "configuration, which graph kernel nodes made by cuctx do not take")
    return None


def construct(recording: Recording) -> tuple[Graph, list[GraphNode | None], int]:
    """A new graph doing what ``recording`` holds; its node for each operation (None for
    edges and outside waits); the estimated bytes of an executable of it."""
    keys, values, items = recording.keys, recording.values, recording.items
    with recording.ctx:
        graph = Graph()
    tails: list[tuple[GraphNode, ...]] = [()] * len(recording.streams)
    at_record: dict[int, tuple[GraphNode, ...]] = {}
    nodes: list[GraphNode | None] = [None] * len(keys)
    size = 0
    for i, key in enumerate(keys):
        if key.__class__ is Launcher:
            args, _ = items[i]
            role = recording.role_of(key.stream)
            c = key.config
            node = graph.launch(key.kernel, c.grid, c.block, *map(anchor, args),
                                shared_mem=c.shared_mem, after=tails[role])
            size += len(values[i]) + NODE_BYTES
            nodes[i] = node
            tails[role] = (node,)
            continue
        kind, role = key[0], key[1]
        _, payload = items[i]
        if kind is COPY:
            node = graph.copy(anchor(payload[1]), anchor(payload[2]), after=tails[role])
        elif kind is FILL:
            node = graph.fill(anchor(payload[0]), fill_value(*payload), after=tails[role])
        elif kind is HOST:
            node = graph.host(payload[0], *payload[1], after=tails[role])
        elif kind is RECORD:
            nodes[i] = graph.record(payload[0], after=tails[role])
            at_record[i] = tails[role]
            size += NODE_BYTES
            continue
        else:  # WAIT: (WAIT, role, other role, None), (WAIT, role, None, record index), outside
            if len(key) == 4:
                other = tails[key[2]] if key[2] is not None else at_record[key[3]]
                tails[role] = tuple({id(n): n for n in tails[role] + other}.values())
            continue
        nodes[i] = node
        tails[role] = (node,)
        size += NODE_BYTES
    return graph, nodes, size


def fill_value(array: Any, pattern: bytes) -> Any:
    """The element value a fill's byte pattern stands for."""
    return np.frombuffer(pattern, array.dtype)[0]


def patchable(nodes: list[GraphNode | None], changed: Iterable[int]) -> bool:
    """Whether each changed operation's node (if it has one) can be patched by itself."""
    return all(nodes[i] is None or nodes[i].kind in PATCHABLE for i in changed)


def patch(exe: GraphExec, nodes: list[GraphNode | None], recording: Recording,
          changed: list[int], patcher: Any = None) -> int:
    """Give each changed node of ``exe`` the recording's values: a kernel node its recorded
    parameter bytes (already checked and packed by the launch), a copy or fill node its new
    arrays; the number of nodes patched. The compiled ``patcher`` (`patcher`) patches the
    kernel nodes it can and leaves the rest to this loop, which is its reference."""
    left = changed if patcher is None else patcher.patch(changed, recording.values)
    keys, items, values = recording.keys, recording.items, recording.values
    count = len(changed) - len(left)
    for i in left:
        node = nodes[i]
        if node is None:
            continue
        key = keys[i]
        if key.__class__ is Launcher:
            slot = kernel_slot(exe, node)
            value = values[i]
            slot.params.buffer[:len(value)] = value
            err, = slot.set()
            if err:
                exe._refuse_node(err, slot.name, node)
        else:
            payload = items[i][1]
            if key[0] is COPY:
                exe.update_node(node, anchor(payload[1]), anchor(payload[2]))
            else:  # FILL (patchable() let nothing else through)
                exe.update_node(node, anchor(payload[0]), fill_value(*payload))
        count += 1
    return count


def kernel_slot(exe: GraphExec, node: GraphNode) -> Any:
    """The executable's update state of a kernel node (its parameter struct and buffer, the
    bound cuGraphExecKernelNodeSetParams), made on first use."""
    position = exe._where[node]
    slots = exe._held.slots
    slot = slots.get(position)
    if slot is None:
        slot = slots[position] = exe._slot(position)
    return slot


def patcher(native: Any, exe: GraphExec, nodes: list[GraphNode | None]) -> Any:
    """The compiled patches and launch of ``exe`` (`cuctx._native.Patcher`)."""
    def make(i: int) -> tuple | None:  # what the Patcher asks of operation i, once
        node = nodes[i]
        if node is None or node.kind != "kernel" or node._kernel is None:
            return None
        slot = kernel_slot(exe, node)
        return exe._handles[exe._where[node]], slot.params.struct, slot.params.buffer
    def refused(err: int, i: int) -> None:  # raise what the Python path raises
        code = CUresult(err)
        if i < 0:
            fail(exe._backend, code, "cuGraphLaunch", exe._ctx, hint=f"launching {exe!r}")
        exe._refuse_node(code, "cuGraphExecKernelNodeSetParams", nodes[i])

    return native.patcher(exe._handle, exe._ctx, exe._held.streams, exe._libraries, make,
                          refused, len(nodes), not (exe._host or exe._events))
