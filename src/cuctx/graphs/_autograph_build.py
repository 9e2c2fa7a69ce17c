"""A `Recording` as a `Graph` (every node keeps what it uses), the per-node patches of an
executable made from one, and its launch (`launch`).

A kernel node takes the parameter bytes its launch packed during the call (`kernel_node`):
the launch checked its configuration and arguments, so nothing is checked or packed again.
Where the backend builds in C (`cuctx._native`, on a GPU), the nodes of a recording of
launches on one stream and their GraphNodes are made in C at once (`kernel_chain`: a build
costs about what the driver costs), any other recording's kernel nodes one by one;
elsewhere (the sim) through cuda.bindings' structs. Copies, fills, host functions and events go
through `Graph`'s methods.

Stream order becomes dependencies: each role (stream) has a *tail*, the nodes its next
operation comes after. A node on a role follows that role's tail and becomes it; a wait of
one followed stream for another adds the other's tail to the waiter's; a wait for an event
recorded in the call adds the tail the record had. Records become record nodes (the event
is recorded for whoever uses it after the call); waits for outside work have no node (the
executable's launch waits for it, see `launch`). Nodes keep the memory of the call's
temporaries through its block, not its lease (`_autograph_arena.anchor`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, NamedTuple

import numpy as np
from cuda.bindings.driver import CUgraphNode, CUkernel, CUresult

from .. import _trace
from .._driver.native import extension
from .._calls import fail
from ..kernels._launcher import Launcher
from ._autograph_arena import anchor
from ._autograph_record import COPY, FILL, HOST, RECORD, Recording
from ._graph import Graph
from ._graph_node import GraphNode
from ._nodes import KernelParams, NodeInfo, describe_kernel

if TYPE_CHECKING:
    from ._autograph_state import Entry
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
                return (
                    f"launch of {key.kernel.name!r} with "
                    f"{'a cluster' if config.cluster is not None else 'cooperative'} "
                    "configuration, which graph kernel nodes made by cuctx do not take"
                )
    return None


def construct(recording: Recording) -> tuple[Graph, list[GraphNode | None], int]:
    """A new graph doing what ``recording`` holds; its node for each operation (None for
    edges and outside waits); the estimated bytes of an executable of it."""
    keys, values, items = recording.keys, recording.values, recording.items
    ctx = recording.ctx
    native = ctx._backend.native
    builds = native if native is not None and native.builds else None
    site = _trace.user_site()  # (the call's line, for every node: what errors name)
    with ctx:
        graph = Graph()
        graph._private = True  # never handed out: see `_exec_lifetime._unlink_private`
        if (
            builds is not None
            and len(recording.streams) == 1
            and set(map(type, keys)) == {Launcher}
        ):
            return (
                graph,
                kernel_chain(graph, recording, site, builds),
                sum(map(len, values)) + NODE_BYTES * len(keys),
            )
        tails: list[tuple[GraphNode, ...]] = [()] * len(recording.streams)
        at_record: dict[int, tuple[GraphNode, ...]] = {}
        nodes: list[GraphNode | None] = [None] * len(keys)
        size = 0
        for i, key in enumerate(keys):
            if key.__class__ is Launcher:
                role = recording.role_of(key.stream)
                node = nodes[i] = kernel_node(
                    graph, key, values[i], items[i][0], tails[role], site, builds
                )
                size += len(values[i]) + NODE_BYTES
                tails[role] = (node,)
                continue
            size += _node(graph, recording, i, tails, at_record, nodes)
    return graph, nodes, size


class NodeSpec(NamedTuple):
    """What a launcher's kernel nodes share: add_kernel_node's (function, kern, ctx, grid,
    block, shared_mem), the parameters' offsets, and the words for the node (in this order:
    the compiled build reads them by position)."""

    call: tuple
    offsets: tuple[int, ...]
    description: str


def node_spec(launcher: Launcher) -> NodeSpec:
    kernel, c = launcher.kernel, launcher.config
    spec = launcher._node_spec = NodeSpec(
        node_call(kernel, c, launcher._ctx), offsets(kernel), describe_kernel(kernel, c)
    )
    return spec


def node_call(kernel: Any, config: Any, ctx: Any) -> tuple:
    """add_kernel_node's (function, kern, ctx, grid, block, shared_mem) for ``kernel``."""
    handle = int(kernel._handle)
    # A library's CUkernel goes in `kern`, a module's CUfunction in `func` (as KernelParams).
    function, kern = (None, handle) if isinstance(kernel._handle, CUkernel) else (handle, None)
    return (function, kern, int(ctx._handle), config.grid, config.block, config.shared_mem)


def offsets(kernel: Any) -> tuple[int, ...]:
    """Where each of ``kernel``'s parameters starts in its packed bytes."""
    return tuple(offset for offset, _ in kernel.param_layout)


def kernel_node(
    graph: Graph,
    launcher: Launcher,
    data: bytes,
    args: tuple,
    after: tuple[GraphNode, ...],
    site: tuple | None,
    builds: Any,
) -> GraphNode:
    """The kernel node of a recorded launch, of its packed parameter bytes, after ``after``
    (in the graph's context, current): added in C where the backend ``builds``, else with
    a parameter struct of cuda.bindings. It keeps the kernel's library and the arguments
    (a temporary's block, not its lease)."""
    spec = launcher._node_spec or node_spec(launcher)
    kernel = launcher.kernel
    deps = [node._handle for node in after]
    if builds is not None:
        err, handle = builds.add_kernel_node(graph._handle, deps, *spec.call, data, spec.offsets)
        handle = None if err else CUgraphNode(handle)
    else:
        params = KernelParams(kernel, launcher.config, graph._ctx)
        params.buffer[: len(data)] = data
        err, handle = graph._backend.driver.cuGraphAddKernelNode(
            graph._handle, deps, len(deps), params.struct
        )
    if err:
        fail(
            graph._backend,
            CUresult(int(err)),
            "cuGraphAddKernelNode",
            graph._ctx,
            hint=f"adding {spec.description}",
        )
    keep = (kernel._owner, *map(anchor, args))
    return graph._append(
        GraphNode(
            graph, "kernel", handle, NodeInfo(site, keep, spec.description, kernel, launcher.config)
        )
    )


def kernel_chain(
    graph: Graph, recording: Recording, site: tuple | None, builds: Any
) -> list[GraphNode]:
    """The kernel nodes of a recording of launches on one stream, each after the one before,
    and their GraphNodes (each what `kernel_node` makes), added in C: a build costs about
    what the driver costs, not Python per node."""
    keys = recording.keys
    specs = [key._node_spec or node_spec(key) for key in keys]
    err, handles = builds.add_kernel_chain(graph._handle, specs, recording.values)
    if err:
        fail(
            graph._backend,
            CUresult(int(err)),
            "cuGraphAddKernelNode",
            graph._ctx,
            hint=f"adding {specs[handles].description}",
        )
    nodes = extension()[0].kernel_graph_nodes(
        graph, handles, specs, keys, recording.items, site, anchor, GraphNode, CUgraphNode
    )
    graph._extend(nodes, handles)
    return nodes


def _node(
    graph: Graph, recording: Recording, i: int, tails: list, at_record: dict, nodes: list
) -> int:
    """Operation i (not a launch) as a node, or as an edge; the bytes it adds."""
    key = recording.keys[i]
    kind, role = key[0], key[1]
    _, payload = recording.items[i]
    if kind is COPY:
        node = graph.copy(anchor(payload[1]), anchor(payload[2]), after=tails[role])
    elif kind is FILL:
        node = graph.fill(anchor(payload[0]), fill_value(*payload), after=tails[role])
    elif kind is HOST:
        node = graph.host(payload[0], *payload[1], after=tails[role])
    elif kind is RECORD:
        nodes[i] = graph.record(payload[0], after=tails[role])
        at_record[i] = tails[role]
        return NODE_BYTES
    else:  # WAIT: (WAIT, role, other role, None), (WAIT, role, None, record index), outside
        if len(key) == 4:
            other = tails[key[2]] if key[2] is not None else at_record[key[3]]
            tails[role] = tuple({id(n): n for n in tails[role] + other}.values())
        return 0
    nodes[i] = node
    tails[role] = (node,)
    return NODE_BYTES


def fill_value(array: Any, pattern: bytes) -> Any:
    """The element value a fill's byte pattern stands for."""
    return np.frombuffer(pattern, array.dtype)[0]


def patchable(nodes: list[GraphNode | None], changed: Iterable[int]) -> bool:
    """Whether each changed operation's node (if it has one) can be patched by itself."""
    return all(nodes[i] is None or nodes[i].kind in PATCHABLE for i in changed)


def patch(
    exe: GraphExec,
    nodes: list[GraphNode | None],
    recording: Recording,
    changed: list[int],
    patcher: Any = None,
) -> int:
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
            slot.params.buffer[: len(value)] = value
            (err,) = slot.set()
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
    """The compiled patches and launch of ``exe`` (`cuctx._native.Patcher`). Where the
    backend builds in C the Patcher keeps each kernel node's struct itself, made from what
    add_kernel_node takes; elsewhere it patches the executable's slot (`kernel_slot`)."""

    def make(i: int) -> tuple | None:  # what the Patcher asks of operation i, once
        node = nodes[i]
        if node is None or node.kind != "kernel" or node._kernel is None:
            return None
        handle = exe._handles[exe._where[node]]
        if native.builds:
            return (
                int(handle),
                node_call(node._kernel, node._config, exe._ctx),
                offsets(node._kernel),
            )
        slot = kernel_slot(exe, node)
        return handle, slot.params.struct, slot.params.buffer

    def refused(err: int, i: int) -> None:  # raise what the Python path raises
        code = CUresult(err)
        if i < 0:
            fail(exe._backend, code, "cuGraphLaunch", exe._ctx, hint=f"launching {exe!r}")
        exe._refuse_node(code, "cuGraphExecKernelNodeSetParams", nodes[i])

    return native.patcher(
        exe._handle,
        exe._ctx,
        exe._held.streams,
        exe._libraries,
        make,
        refused,
        len(nodes),
        not (exe._host or exe._events),
    )


def launch(entry: Entry, recording: Recording) -> None:
    """Launch the executable on role 0's stream, after the outside work the call waited
    for and the work queued before on its other streams; those then wait for it."""
    streams = recording.streams
    root = streams[0]
    if len(streams) == 1 and not entry.outside:
        if entry.patcher is None or not entry.patcher.launch(root):
            entry.exe.launch(root)
        return
    for i in entry.outside:
        root.wait(recording.items[i][1][0])
    for stream in streams[1:]:
        root.wait(stream)
    entry.exe.launch(root)
    for stream in streams[1:]:
        stream.wait(root)
