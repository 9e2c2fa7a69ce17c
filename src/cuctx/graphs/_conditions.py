"""Conditional nodes and what CUDA allows around them, checked where the user adds a node:

- conditions (`Condition`: a cudaGraphConditionalHandle with its graph, default, line and
  the node it drives), cuctx's kinds ("if", "if_else", "while", "switch") as the driver's
  type and number of bodies, which graphs may use a condition, and that it drives one node
  (cuGraphAddNode refuses a second with CUDA_ERROR_INVALID_VALUE, as an H100 does);
- what a body holds: kernel, copy, fill, empty, child graph and conditional nodes, inside
  its child graphs too (the documented list of CUDA_CONDITIONAL_NODE_PARAMS::phGraph_out;
  the driver adds any other node to a body and refuses the graph at cuGraphInstantiate with
  CUDA_ERROR_INVALID_VALUE, naming nothing, as an H100 does);
- child graphs hold no conditional node (cuGraphAddChildGraphNode refuses one);
- a kernel parameter the source declares ``cudaGraphConditionalHandle`` takes a condition
  (a made-up number names none, and the node it should drive would never run);
- the nodes of a graph and of its conditional bodies, in one order (`with_bodies`), which
  is how an executable names the nodes `GraphExec.update_node` may change.
"""

from __future__ import annotations

import operator
import weakref
from typing import TYPE_CHECKING, Any, Iterator

from cuda.bindings.driver import (
    CU_GRAPH_COND_ASSIGN_DEFAULT,
    CUgraphConditionalNodeType,
    CUgraphNodeParams,
    CUgraphNodeType,
)

from .. import _trace
from ..context import in_context
from .._calls import fail

if TYPE_CHECKING:
    from ..context import Context
    from ._graph import Graph
    from ._graph_node import GraphNode


class Condition(int):
    """A graph's condition handle (cudaGraphConditionalHandle), made by `Graph.condition`
    (or by `Graph.conditional` without ``condition=``): pass it to the kernel that sets it
    (an ``unsigned long long`` parameter; the kernel calls ``cudaGraphSetConditional(handle,
    value)``) and to the one conditional node it drives. ``default``: the value each launch
    starts from (None: the value last set, 0 at first); ``site``: the user's line that made
    it; ``node``: the conditional node it drives, None until there is one (CUDA refuses to
    instantiate a graph with a condition no node uses, and to add a second node with it)."""

    def __new__(
        cls, handle: int, graph: Any, default: int | None, site: tuple[str, int, str] | None
    ) -> Condition:
        self = super().__new__(cls, handle)
        self.default = default
        self.site = site
        # Neither is kept: the graph holds its nodes, whose arguments may keep this.
        self._graph = weakref.ref(graph)
        self._node: weakref.ref | None = None
        return self

    @property
    def node(self) -> GraphNode | None:
        """The conditional node this condition drives, or None."""
        return self._node() if self._node is not None else None

    @property
    def where(self) -> str:
        return f"{self.site[0]}:{self.site[1]}" if self.site else "unknown line"

    def __repr__(self) -> str:
        start = "the last value set" if self.default is None else self.default
        return f"<Condition {int(self):#x} default={start!r} made at {self.where}>"


def condition_default(default: Any, operation: str) -> int | None:
    """A condition's default as the driver takes it: None, or an unsigned int (bools are 0
    and 1; a switch's default picks its body)."""
    if default is None:
        return None
    try:
        value = operator.index(default)  # ints, bools, NumPy integers; not floats
    except TypeError:
        raise TypeError(
            f"{operation}: default must be None, a bool or an int, not "
            f"{type(default).__name__} {default!r}"
        ) from None
    if not 0 <= value < 1 << 32:
        raise ValueError(
            f"{operation}: default={default!r} is outside what a condition holds "
            "(an unsigned 32-bit int: 0 to 4294967295)"
        )
    return value


_C = CUgraphConditionalNodeType
# cuctx's conditional kinds: the driver's type and the number of bodies (a switch's: cases=).
CONDITIONALS = {
    "if": (_C.CU_GRAPH_COND_TYPE_IF, 1),
    "if_else": (_C.CU_GRAPH_COND_TYPE_IF, 2),
    "while": (_C.CU_GRAPH_COND_TYPE_WHILE, 1),
    "switch": (_C.CU_GRAPH_COND_TYPE_SWITCH, None),
}


def conditional_size(kind: Any, cases: Any, operation: str) -> int:
    """The number of bodies of a conditional node of ``kind`` (checked with ``cases``)."""
    if kind not in CONDITIONALS:
        raise ValueError(
            f"Graph.conditional: kind must be one of "
            f"{', '.join(map(repr, CONDITIONALS))}, not {kind!r}"
        )
    size = CONDITIONALS[kind][1]
    if kind == "switch":
        if isinstance(cases, bool) or not isinstance(cases, int) or cases < 1:
            raise ValueError(
                f"{operation} needs cases=n, its number of bodies (an int >= 1; "
                f"body i runs when the condition is i), not {cases!r}"
            )
        return cases
    if cases is not None:
        raise ValueError(
            f"{operation}: cases= is for 'switch' nodes; an {kind!r} node has "
            f"{size} {'body' if size == 1 else 'bodies'}"
        )
    return size


def make_condition(graph: Graph, value: int | None, operation: str) -> Condition:
    """A new condition of ``graph`` (cuGraphConditionalHandleCreate), with ``value`` as its
    default (None: none), filed with the graph for the check at instantiation."""
    ctx, drv = graph._ctx, graph._backend.driver
    flags = CU_GRAPH_COND_ASSIGN_DEFAULT if value is not None else 0
    with in_context(ctx, operation):
        err, handle = drv.cuGraphConditionalHandleCreate(
            graph._handle, ctx._handle, value or 0, flags
        )
    if err:
        fail(
            ctx._backend,
            err,
            "cuGraphConditionalHandleCreate",
            ctx,
            hint="conditional nodes need a driver of CUDA 12.4 or newer",
        )
    condition = Condition(int(handle), graph, value, _trace.user_site())
    graph._conditions.append(condition)
    return condition


def _lies_in(graph: Graph | None, home: Graph | None) -> bool:
    """Whether ``graph`` is ``home`` or a conditional body inside it (at any depth)."""
    while graph is not None and graph is not home:
        graph = graph._home[0].graph if graph._home is not None else None
    return graph is not None


def check_condition(condition: Any, default: Any, graph: Graph, operation: str) -> None:
    """Check that ``condition`` can drive a conditional node of ``graph``: the driver takes
    a condition of the node's own graph or of a graph that graph lies in as a body."""
    if not isinstance(condition, Condition):
        raise TypeError(
            f"{operation}: condition= takes what Graph.condition() returns, not "
            f"{type(condition).__name__} {condition!r}"
        )
    if default is not None:
        raise ValueError(
            f"{operation}: the default is the condition's, set when it was made "
            f"(g.condition(default=...)); {condition!r} was given too"
        )
    if not _lies_in(graph, condition._graph()):
        raise ValueError(
            f"{operation}: {condition!r} is of another graph; a conditional node "
            "takes a condition of its own graph, or of a graph its own lies in "
            "as a body"
        )
    if condition.node is not None:
        raise ValueError(
            f"{operation}: {condition!r} drives {condition.node!r} already, and CUDA lets a "
            "condition drive one conditional node (the driver refuses a second, naming "
            "nothing): make a condition for this node (g.condition(), or leave condition= "
            "out and use node.condition) and have the kernel set both, or put this node's "
            "work in the body of the node the condition drives"
        )


def check_condition_args(
    handles: tuple[tuple[int, str], ...], args: tuple, graph: Graph, operation: str
) -> None:
    """Check the arguments of a kernel node of ``graph`` whose source declares the
    parameters ``handles`` ((index, declaration) pairs, `kernels._access.condition_params`)
    as condition handles: each takes a `Condition` the node's graph may use."""
    for index, declared in handles:
        if index >= len(args):
            continue  # the packer names a wrong argument count
        arg = args[index]
        where = f"{operation}: parameter {index} ({declared}) is a condition handle"
        if not isinstance(arg, Condition):
            raise TypeError(
                f"{where}, and {type(arg).__name__} {arg!r} is not a condition: pass one made "
                "by g.condition() (or a conditional node's node.condition); a made-up number "
                "names no condition, so the node it should drive would never run"
            )
        if not _lies_in(graph, arg._graph()):
            raise ValueError(
                f"{where}, and {arg!r} is of another graph: a kernel sets a "
                "condition of its own graph, or of a graph its own lies in as a "
                "body"
            )


def conditional_params(
    kind: str, condition: Condition, size: int, ctx: Context
) -> tuple[CUgraphNodeParams, str, str]:
    """cuGraphAddNode's parameters of a conditional node (the driver fills phGraph_out), its
    description, and what to say if the driver refuses it."""
    params = CUgraphNodeParams()
    params.type = CUgraphNodeType.CU_GRAPH_NODE_TYPE_CONDITIONAL
    cond = params.conditional
    cond.handle = condition
    cond.type = CONDITIONALS[kind][0]
    cond.size = size
    cond.ctx = ctx._handle
    hint = ""
    if kind in ("if_else", "switch"):
        version = ctx._backend.driver.cuDriverGetVersion()[1]
        hint = (
            f"'if_else' and 'switch' nodes need a driver of CUDA 12.8 or newer (this one "
            f"is {version // 1000}.{version % 1000 // 10})"
        )
    cases = f" cases={size}" if kind == "switch" else ""
    return params, f"conditional {kind} {condition:#x}{cases}", hint


# -- what bodies and child graphs hold ------------------------------------------------------

# The node kinds a conditional body runs (in its child graphs too).
BODY_KINDS = ("kernel", "copy", "fill", "empty", "child", "conditional")
_KIND_WORDS = {
    "host": "a host node",
    "record": "an event record node",
    "wait": "an event wait node",
    "alloc": "a memory allocation node",
    "free": "a memory free node",
}


def _body(graph: Graph) -> str:
    """Which body ``graph`` is, in words: "bodies[1] of <GraphNode conditional ...>"."""
    node, index = graph._home
    return f"bodies[{index}] of {node!r}"


def _refusal(graph: Graph, operation: str, what: str) -> ValueError:
    return ValueError(
        f"{operation}: {what}, and this graph is {_body(graph)}: CUDA runs only kernel, "
        "copy, fill, empty, child graph and conditional nodes in a conditional body and in "
        "the child graphs inside one (cuGraphInstantiate refuses any other, naming no node). "
        "Add it to the graph around the conditional node instead, before or after it "
        "(after=node)"
    )


def check_body_kind(graph: Graph, kind: str, operation: str) -> None:
    """Refuse a node of ``kind`` where ``graph`` is a conditional body that cannot run it."""
    if graph._home is not None and kind not in BODY_KINDS:
        raise _refusal(graph, operation, f"this adds {_KIND_WORDS.get(kind, kind)}")


def _inside(graph: Graph) -> Iterator[GraphNode]:
    """Every node of ``graph`` and of the child graphs and bodies inside it."""
    for node in graph._nodes:
        yield node
        if node.kind == "child" and node._extra is not None:
            yield from _inside(node._extra)
        elif node.kind == "conditional" and node._extra is not None:
            for body in node._extra[1]:
                yield from _inside(body)


def check_child(graph: Graph, child: Graph, operation: str) -> None:
    """Refuse ``child`` as a child graph of ``graph``: CUDA takes no conditional node in a
    child graph, and a body's child graphs hold only what a body holds."""
    for node in _inside(child):
        if node.kind == "conditional":
            raise ValueError(
                f"{operation}: {child!r} holds {node!r}, and CUDA forbids conditional nodes in "
                "child graphs (cuGraphAddChildGraphNode refuses them): add the conditional "
                "node to this graph directly (g.conditional(...)), and the child graph's "
                "other work before or after it (after=node)"
            )
        if graph._home is not None and node.kind not in BODY_KINDS:
            raise _refusal(graph, operation, f"{child!r} holds {node!r}")


def with_bodies(graph: Graph) -> list[GraphNode]:
    """The nodes of ``graph`` in the order they were added, each conditional node followed
    by the nodes of its bodies (not those of child graphs: the driver's child node holds a
    copy, whose nodes the graph's handles do not name)."""
    if not graph._parts:  # (no conditional bodies, no child graphs: the usual graph)
        return list(graph._nodes)
    out = []
    for node in graph._nodes:
        out.append(node)
        if node.kind == "conditional" and node._extra is not None:
            for body in node._extra[1]:
                out.extend(with_bodies(body))
    return out
