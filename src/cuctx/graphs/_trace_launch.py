"""A graph launch on the trace (`graph_launch`): the memory its kernel, copy and fill nodes
touch, node by node, so a race checker sees a graph's work as it sees eager work.

Only built while a trace sink listens (`GraphExec.launch` tests ``_trace.sinks``). Explicit
nodes know their arguments (a kernel's modes come from `cuctx.kernels._access`, copies read the
source and write the destination, fills write); a captured kernel node knows only the arrays
it uses, which count as read and written. What `GraphExec.update_node` changed later is not
seen: the nodes' arguments are those of the graph the executable last took.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..kernels import _access
from .. import _trace
from ..memory._array import DeviceArray

if TYPE_CHECKING:
    from ..stream import Stream
    from ._graph import Graph
    from ._graph_node import GraphNode


def _device(obj: Any, mode: str) -> tuple[_trace.Access, ...]:
    return (_trace.device_access(obj, mode),) if isinstance(obj, DeviceArray) else ()


def node_accesses(node: GraphNode, stream: Stream) -> tuple[_trace.Access, ...]:
    keep, kernel = node._keep, node._kernel
    if node.kind == "kernel" and kernel is not None:
        if keep and keep[0] is kernel._owner:  # Graph.launch: (library, *args)
            args = keep[1:]
            plan = kernel._packer().plan(args)
            return plan.accesses(args, stream, _access.modes(kernel))
        return tuple(a for obj in keep for a in _device(obj, _trace.READ_WRITE))
    if node.kind == "copy":
        if node.description.endswith("(captured)"):  # (source, destination) as traced
            modes = (_trace.READ, _trace.WRITE) if len(keep) == 2 else (_trace.READ_WRITE,)
            return tuple(a for obj, m in zip(keep, modes) for a in _device(obj, m))
        dst, src = keep  # Graph.copy
        return _device(src, _trace.READ) + _device(dst, _trace.WRITE)
    if node.kind == "fill":
        return tuple(a for obj in keep for a in _device(obj, _trace.WRITE))
    return ()


def announce(exe: Any, graph: Graph, stream: Stream) -> None:
    """Emit ``graph_launch``: every node's accesses, and per node (node, its accesses) in
    ``fields["nodes"]`` for checks between the nodes of one launch."""
    nodes = tuple((node, node_accesses(node, stream)) for node in graph._nodes)
    nodes = tuple(n for n in nodes if n[1])
    _trace.emit(
        "graph_launch",
        exe._ctx,
        stream,
        tuple(a for _, acc in nodes for a in acc),
        graph=graph,
        exec=exe,
        nodes=nodes,
    )
