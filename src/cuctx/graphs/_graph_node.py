"""`GraphNode`, one node of a `Graph`, and how a node is added to one: the nodes it follows
(``after=``, checked by `after_nodes`) and the driver's call with the graph's context current,
the node recording the user's line (`add_node`).

Kept apart from `_graph.py`, whose methods say what each kind of node is (with the checks of
the eager operation it stands for): a node is the data the executables (`_exec.py`), the
update diagnosis (`_update.py`), the trace (`_trace_launch.py`) and AutoGraph's builds
(`_autograph_build.py`, and its C counterpart, which fills these slots) read and make.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Iterable

from .. import _trace
from ..context import in_context
from .._calls import fail

if TYPE_CHECKING:
    from ._conditions import Condition
    from ._graph import Graph
    from ._nodes import NodeInfo


class GraphNode:
    """One node of a `Graph`. ``graph``; ``kind``: "kernel", "copy", "fill", "host",
    "record", "wait", "child", "empty", "conditional" (captured graphs also hold "alloc"
    and "free"); ``site``: the user's (file, line, function) that added it; ``description``;
    ``keep``: what its work uses, kept alive with it. Pass nodes to ``after=`` to order
    work; a conditional node also has ``condition`` and ``bodies`` (``body`` when it has
    one)."""

    __slots__ = (
        "graph",
        "kind",
        "site",
        "description",
        "_handle",
        "_keep",
        "_kernel",
        "_config",
        "_extra",
        "__weakref__",
    )

    def __init__(self, graph: Graph, kind: str, handle, info: NodeInfo, extra: Any = None):
        self.graph = graph
        self.kind = kind
        self.site = info.site
        self.description = info.description or kind
        self._handle = handle
        self._keep = info.keep
        self._kernel = info.kernel
        self._config = info.config
        # record/wait: the Event; child: the Graph; conditional: (Condition, body graphs)
        self._extra = extra

    @property
    def keep(self) -> tuple:
        """The objects this node's work uses (arrays, the kernel's library, the event, the
        host function and its arguments, the child graph)."""
        return self._keep

    @property
    def condition(self) -> Condition:
        """A conditional node's condition: pass it to the kernel that sets it."""
        return self._conditional()[0]

    @property
    def bodies(self) -> tuple[Graph, ...]:
        """A conditional node's bodies, `Graph`s to add the nodes they run to: one for "if"
        and "while", two for "if_else" (then, else), ``cases`` for "switch"."""
        return self._conditional()[1]

    @property
    def body(self) -> Graph:
        """The body of an "if" or "while" node (``bodies[0]``)."""
        bodies = self._conditional()[1]
        if len(bodies) != 1:
            raise AttributeError(
                f"{self!r} has {len(bodies)} bodies: take one of "
                "node.bodies (node.body is for nodes with one)"
            )
        return bodies[0]

    def _conditional(self) -> tuple[Condition, tuple[Graph, ...]]:
        if self.kind != "conditional" or self._extra is None:
            raise AttributeError(
                f"{self!r} is not a conditional node made by "
                "Graph.conditional: it has no condition or bodies"
            )
        return self._extra

    @property
    def where(self) -> str:
        """ "file:line" of the call that added the node ("unknown line" without one)."""
        return f"{self.site[0]}:{self.site[1]}" if self.site else "unknown line"

    def __repr__(self) -> str:
        return f"<GraphNode {self.description} at {self.where}>"


def after_nodes(
    graph: Graph, after: GraphNode | Iterable[GraphNode], operation: str
) -> tuple[GraphNode, ...]:
    """The nodes of ``after=`` (every node-adding method's), checked: a GraphNode of
    this graph or an iterable of them."""
    nodes = (after,) if isinstance(after, GraphNode) else after
    expected = (
        f"{operation}: after= takes a GraphNode or an iterable of GraphNodes (what "
        "this graph's methods return)"
    )
    if not isinstance(nodes, Iterable) or isinstance(nodes, (str, bytes)):
        none = "; leave after= out for a node that waits for none" if after is None else ""
        raise TypeError(f"{expected}, not {type(after).__name__} {after!r}{none}")
    checked: dict[int, GraphNode] = {}
    for node in nodes:
        if not isinstance(node, GraphNode):
            raise TypeError(f"{expected}; it holds {type(node).__name__} {node!r}")
        if node.graph is not graph:
            raise ValueError(
                f"{operation}: after= names {node!r}, a node of another graph; "
                "a node can only follow nodes of its own graph (to run "
                "another graph inside this one, add it with Graph.child)"
            )
        checked.setdefault(id(node), node)
    return tuple(checked.values())


def add_node(
    graph: Graph,
    operation: str,
    kind: str,
    add: Callable,
    args: tuple,
    after,
    info: NodeInfo,
    extra: Any = None,
    hint: str = "",
) -> GraphNode:
    """Add one node through ``add(graph, deps, count, *args)`` with the graph's context
    current; the node records the user's line."""
    deps = [node._handle for node in after_nodes(graph, after, operation)]
    ctx = graph._ctx
    with in_context(ctx, operation):
        err, handle = add(graph._handle, deps, len(deps), *args)
    if err:
        fail(
            graph._backend,
            err,
            add.__name__,
            ctx,
            hint=f"adding {info.description}" + (f"; {hint}" if hint else ""),
        )
    site = _trace.user_site()
    return graph._append(GraphNode(graph, kind, handle, info._replace(site=site), extra))
