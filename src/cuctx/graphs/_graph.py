"""Explicit CUDA graphs: `Graph`, a CUgraph in one context, and the nodes it is given.

Each node is added with the checks of the eager operation it stands for (_nodes.py), as a
`GraphNode` (_graph_node.py) remembering its graph, kind, the user's line that added it, a
description, and the objects its work uses: arrays, the kernel's library, events, host
functions, child graphs. A graph keeps its nodes (so their objects) alive; an executable
copies that set when it is made (_exec.py). Graphs the driver made (stream capture) are
wrapped by `_capture._adopt`.
"""

from __future__ import annotations

import os
import weakref
from operator import attrgetter
from typing import TYPE_CHECKING, Any, Callable, Iterable

from cuda.bindings.driver import CUgraphDebugDot_flags

from ..kernels._kernel import Kernel
from ..kernels._launch_config import make_config, validate
from .._lifetimes import drop_host_function, finalize
from .._resource import Resource
from ..context import ACTIVE, DESTROYED, Context, context_for, in_context
from .._calls import fail
from ..event import Event
from ..stream import resolve_stream
from ._conditions import (
    Condition,
    check_body_kind,
    check_child,
    check_condition,
    check_condition_args,
    condition_default,
    conditional_params,
    conditional_size,
    make_condition,
)
from ._exec import GraphExec
from ._graph_node import GraphNode, add_node, after_nodes
from ._nodes import (
    HostFunctions,
    KernelParams,
    NodeInfo,
    copy_params,
    describe_kernel,
    fill_params,
    summarize,
)

if TYPE_CHECKING:
    from ..stream import Stream


class Graph(Resource):
    """An explicit CUDA graph in the current context (see `context_for`). Add work with
    `launch`, `copy`, `fill`, `host`, `record`, `wait`, `child`, `empty` and `conditional`
    (its condition made first with `condition`, where a kernel must set it); each returns a
    `GraphNode` that later nodes can list in ``after=`` (a node or an iterable of nodes of
    this graph; nodes without ``after`` may run in any order). Make an executable with
    `instantiate`."""

    __slots__ = (
        "_nodes",
        "_by_handle",
        "_parts",
        "_host",
        "_own_host",
        "_stream",
        "_home",
        "_conditions",
        "_finalizer",
        "_private",
        "__weakref__",
    )

    def __init__(self) -> None:
        ctx = context_for()
        drv = ctx._backend.driver
        with in_context(ctx, "Graph"):
            err, handle = drv.cuGraphCreate(0)
        if err:
            fail(ctx._backend, err, "cuGraphCreate", ctx)
        self._setup(ctx, handle, None)
        self._finalizer = finalize(self, _destroy_graph, drv, handle, ctx)

    def _setup(self, ctx: Context, handle, home: tuple[GraphNode, int] | None) -> None:
        self._backend = ctx._backend
        self._ctx = ctx
        self._handle = handle
        self._key = int(handle)
        self._nodes: list[GraphNode] = []
        self._by_handle: dict[int, GraphNode] = {}
        self._parts: list[Graph] = []  # child graphs and conditional bodies: their objects too
        self._host: list[HostFunctions] = []  # its host nodes' functions (captured ones too)
        self._own_host: HostFunctions | None = None  # where Graph.host registers
        # The stream argument conversions get (its context is checked; another library's
        # array is ordered after its producer on it).
        self._stream: Stream = resolve_stream(None, ctx)
        # A conditional body: (its node, its index in node.bodies); the driver owns it with
        # its node.
        self._home = home
        self._conditions: list[Condition] = []  # made for this graph (Graph.condition)
        self._finalizer = None
        # AutoGraph's own graph, never handed out: see `_exec_lifetime._unlink_private`.
        self._private = False

    def _append(self, node: GraphNode) -> GraphNode:
        self._nodes.append(node)
        self._by_handle[int(node._handle)] = node
        return node

    def _extend(self, nodes: list[GraphNode], handles: list[int]) -> None:
        """`_append` of many nodes at once (``handles``: theirs, as ints)."""
        self._nodes.extend(nodes)
        self._by_handle.update(zip(handles, nodes))

    # -- adding nodes ---------------------------------------------------------------------

    def launch(
        self,
        kernel: Kernel,
        grid: Any,
        block: Any,
        *args: Any,
        shared_mem: int = 0,
        after: GraphNode | Iterable[GraphNode] = (),
    ) -> GraphNode:
        """A kernel node: ``kernel`` on a ``grid`` of ``block``-sized blocks with ``args``,
        checked exactly as `cuctx.launch` checks them (LaunchConfigError,
        KernelArgumentError)."""
        if not isinstance(kernel, Kernel):
            raise TypeError(
                f"Graph.launch needs a cuctx.Kernel (lib['name']), not "
                f"{type(kernel).__name__}: {kernel!r}"
            )
        operation = f"Graph.launch of {kernel.name!r}"
        ctx = self._ctx
        self._check(operation)
        kernel._check_launchable(ctx)
        config = make_config(grid, block, shared_mem, None, False)
        if (config, ctx._device) not in kernel._checked:
            validate(kernel, ctx._device, config)
            kernel._checked.add((config, ctx._device))
        params = KernelParams(kernel, config, ctx)
        check_condition_args(params.conditions, args, self, operation)
        params.pack(args, self._stream)
        kernel._owner._used_in(ctx)
        info = NodeInfo(None, params.keep(), describe_kernel(kernel, config), kernel, config)
        return add_node(
            self,
            operation,
            "kernel",
            self._backend.driver.cuGraphAddKernelNode,
            (params.struct,),
            after,
            info,
        )

    def copy(self, dst: Any, src: Any, after: GraphNode | Iterable[GraphNode] = ()) -> GraphNode:
        """A copy node from ``src`` to ``dst`` (same shape and dtype): device arrays of the
        graph's device, or page-locked host arrays (`pinned_empty`, `register_host`), in
        layouts one 3D copy can do."""
        self._check("Graph.copy")
        params, description = copy_params(dst, src, self._ctx, "Graph.copy")
        return add_node(
            self,
            "Graph.copy",
            "copy",
            self._backend.driver.cuGraphAddMemcpyNode,
            (params, self._ctx._handle),
            after,
            NodeInfo(keep=(dst, src), description=description),
        )

    def fill(
        self, array: Any, value: Any, after: GraphNode | Iterable[GraphNode] = ()
    ) -> GraphNode:
        """A memset node setting every element of the contiguous ``array`` to ``value`` (a
        number its dtype holds exactly, as for `DeviceArray.fill`)."""
        self._check("Graph.fill")
        params, description = fill_params(array, value, self._ctx, "Graph.fill")
        return add_node(
            self,
            "Graph.fill",
            "fill",
            self._backend.driver.cuGraphAddMemsetNode,
            (params, self._ctx._handle),
            after,
            NodeInfo(keep=(array,), description=description),
        )

    def host(
        self, fn: Callable[..., Any], *args: Any, after: GraphNode | Iterable[GraphNode] = ()
    ) -> GraphNode:
        """A host node calling ``fn(*args)`` at each launch. As for
        `Stream.launch_host_func`: ``fn`` must not call CUDA, and what it raises is raised
        as `HostFunctionError` by the next synchronize of the stream the executable was
        launched on (or of its context)."""
        if not callable(fn):
            raise TypeError(f"Graph.host needs a callable, not {type(fn).__name__}")
        self._check("Graph.host")
        check_body_kind(self, "host", "Graph.host")
        if self._own_host is None:
            self._own_host = HostFunctions(self._ctx)
            self._host.append(self._own_host)
        params = self._own_host.add(fn, args, self._backend.sim is None)
        name = getattr(fn, "__qualname__", repr(fn))
        try:
            return add_node(
                self,
                "Graph.host",
                "host",
                self._backend.driver.cuGraphAddHostNode,
                (params,),
                after,
                NodeInfo(keep=(fn, *args), description=f"host {name}"),
            )
        except BaseException:
            drop_host_function(int(params.userData))
            raise

    def record(self, event: Event, after: GraphNode | Iterable[GraphNode] = ()) -> GraphNode:
        """An event record node: each launch records ``event`` (of the graph's context)."""
        self._event("Graph.record", "record", event)
        if event._ctx is not self._ctx:
            raise ValueError(
                f"Graph.record: {event!r} belongs to {event._ctx!r}, the graph to "
                f"{self._ctx!r}; record an event of the graph's context"
            )
        return add_node(
            self,
            "Graph.record",
            "record",
            self._backend.driver.cuGraphAddEventRecordNode,
            (event._handle,),
            after,
            NodeInfo(keep=(event,), description="record event"),
            event,
        )

    def wait(self, event: Event, after: GraphNode | Iterable[GraphNode] = ()) -> GraphNode:
        """An event wait node: the nodes after it wait for the event's latest record at the
        time the graph runs (of any context or device)."""
        self._event("Graph.wait", "wait", event)
        return add_node(
            self,
            "Graph.wait",
            "wait",
            self._backend.driver.cuGraphAddEventWaitNode,
            (event._handle,),
            after,
            NodeInfo(keep=(event,), description="wait event"),
            event,
        )

    def _event(self, operation: str, kind: str, event: Any) -> None:
        self._check(operation)
        check_body_kind(self, kind, operation)
        if not isinstance(event, Event):
            raise TypeError(f"{operation} takes a cuctx.Event, not {type(event).__name__}")
        if event._backend is not self._backend:
            raise ValueError(f"{operation}: {event!r} is of another backend")
        event._check(operation)

    def child(self, graph: Graph, after: GraphNode | Iterable[GraphNode] = ()) -> GraphNode:
        """A child graph node: runs a copy of ``graph`` as it is now (later changes to
        ``graph`` do not reach this node)."""
        self._check("Graph.child")
        if not isinstance(graph, Graph):
            raise TypeError(f"Graph.child takes a cuctx.Graph, not {type(graph).__name__}")
        if graph is self or graph._backend is not self._backend:
            raise ValueError(
                "Graph.child: a graph cannot contain itself or a graph of another backend"
            )
        graph._check("Graph.child")
        check_child(self, graph, "Graph.child")
        node = add_node(
            self,
            "Graph.child",
            "child",
            self._backend.driver.cuGraphAddChildGraphNode,
            (graph._handle,),
            after,
            NodeInfo(keep=(graph,), description=f"child {summarize(graph._nodes)}"),
            graph,
        )
        self._parts.append(graph)
        return node

    def empty(self, after: GraphNode | Iterable[GraphNode] = ()) -> GraphNode:
        """A node that does nothing: a join point for ``after=``."""
        self._check("Graph.empty")
        return add_node(
            self,
            "Graph.empty",
            "empty",
            self._backend.driver.cuGraphAddEmptyNode,
            (),
            after,
            NodeInfo(description="empty"),
        )

    def condition(self, default: bool | int | None = None) -> Condition:
        """A condition for conditional nodes of this graph (or of graphs inside it), made
        before its node so that the kernel that sets it can be added first: pass it to that
        kernel and to `conditional` (``condition=``). With ``default`` (a bool, or an int for
        a switch), each launch starts from that value; without, from the value last set (0
        at first). Every condition must drive a conditional node before the graph is
        instantiated (a CUDA rule)."""
        value = condition_default(default, "Graph.condition")
        self._check("Graph.condition")
        return make_condition(self, value, "Graph.condition")

    def conditional(
        self,
        kind: str = "if",
        condition: Condition | None = None,
        default: bool | int | None = None,
        cases: int | None = None,
        after: GraphNode | Iterable[GraphNode] = (),
    ) -> GraphNode:
        """A conditional node, whose ``bodies`` (Graphs) you add nodes to. ``kind``: "if"
        (its body runs once when the condition is non-zero), "if_else" (``bodies[0]`` when
        non-zero, ``bodies[1]`` when zero), "while" (its body runs again and again while the
        condition is non-zero), "switch" with ``cases=n`` (``bodies[i]`` runs when the
        condition is i; none when it is n or more). ``condition``: one made by
        `Graph.condition`; without it, the node makes its own with ``default`` (see
        `Graph.condition`), as ``node.condition``. A kernel sets the condition with
        ``cudaGraphSetConditional(handle, value)``. Needs a driver of CUDA 12.4 or newer
        ("if_else" and "switch": 12.8), else a CudaError saying so."""
        operation = f"Graph.conditional({kind!r})"
        size = conditional_size(kind, cases, operation)
        if condition is None:
            value = condition_default(default, operation)
        else:
            check_condition(condition, default, self, operation)
        self._check(operation)
        # (before the handle: a refusal leaves none behind)
        after = after_nodes(self, after, operation)
        if condition is None:
            condition = make_condition(self, value, operation)
        ctx, drv = self._ctx, self._backend.driver
        params, words, hint = conditional_params(kind, condition, size, ctx)

        def add(graph, deps, count, node_params):  # cuGraphAddNode takes edge data too
            return drv.cuGraphAddNode(graph, deps, None, count, node_params)

        add.__name__ = "cuGraphAddNode"
        node = add_node(
            self,
            operation,
            "conditional",
            add,
            (params,),
            after,
            NodeInfo(description=words),
            hint=hint,
        )
        bodies = []
        for index, handle in enumerate(params.conditional.phGraph_out[:size]):
            body = object.__new__(Graph)
            body._setup(ctx, handle, (node, index))
            bodies.append(body)
        node._extra = (condition, tuple(bodies))
        condition._node = weakref.ref(node)
        self._parts.extend(bodies)
        if kind == "while" and self._backend.sim is not None:  # named where the sim stops it
            self._backend.sim.name_node(node._handle, repr(node))
        return node

    # -- the graph as a whole -------------------------------------------------------------

    @property
    def nodes(self) -> tuple[GraphNode, ...]:
        """The nodes, in the order they were added."""
        return tuple(self._nodes)

    @property
    def edges(self) -> tuple[tuple[GraphNode, GraphNode], ...]:
        """The dependencies as (from, to) pairs: ``to`` runs after ``from``."""
        self._check("Graph.edges")
        drv = self._backend.driver
        result = drv.cuGraphGetEdges(self._handle, 0)
        if result[0]:
            fail(self._backend, result[0], "cuGraphGetEdges", self._ctx)
        count = int(result[-1])
        if not count:
            return ()
        result = drv.cuGraphGetEdges(self._handle, count)
        if result[0]:
            fail(self._backend, result[0], "cuGraphGetEdges", self._ctx)
        by = self._by_handle
        return tuple((by[int(a)], by[int(b)]) for a, b in zip(result[1][:count], result[2][:count]))

    def instantiate(
        self, *, upload: Stream | Any | None = None, auto_free: bool = False, priority: bool = False
    ) -> GraphExec:
        """An executable of the graph as it is now. ``upload``: a stream to upload it on
        right away (else the first launch does); ``auto_free``: memory the graph allocates
        and does not free is freed at its next launch; ``priority``: kernel nodes run with
        their own priority attributes."""
        unused = [c for c in self._conditions if c.node is None]
        if unused:
            raise ValueError(
                f"Graph.instantiate: {', '.join(map(repr, unused))} drives no conditional "
                "node, and CUDA refuses to instantiate a graph with a condition it does not "
                "use (a condition cannot be removed): add its node, g.conditional(kind, "
                "condition=c), or build the graph again without it"
            )
        return GraphExec(self, upload, auto_free, priority)

    def to_dot(self, path: str | os.PathLike, verbose: bool = False) -> str:
        """Write the graph as Graphviz DOT to ``path`` (cuGraphDebugDotPrint; ``verbose``:
        every node's parameters too); returns the path."""
        self._check("Graph.to_dot")
        # The driver answers every file problem with CUDA_ERROR_OPERATING_SYSTEM: opening the
        # file here first raises what Python's open does (FileNotFoundError,
        # PermissionError, IsADirectoryError, ...), naming the path.
        # (os.fspath first: open() would take an int for a file descriptor.)
        path = os.fspath(path)
        open(path, "w").close()
        flags = int(CUgraphDebugDot_flags.CU_GRAPH_DEBUG_DOT_FLAGS_VERBOSE) if verbose else 0
        (err,) = self._backend.driver.cuGraphDebugDotPrint(self._handle, os.fsencode(path), flags)
        if err:
            fail(self._backend, err, "cuGraphDebugDotPrint", self._ctx, hint=f"writing {path!r}")
        return path

    def _node(self, handle) -> GraphNode | None:
        """The node of a driver handle, in this graph or the graphs inside it."""
        node = self._by_handle.get(int(handle or 0))
        if node is None:
            for part in self._parts:
                node = part._node(handle)
                if node is not None:
                    break
        return node

    def _closure(self) -> tuple[list[HostFunctions], set, list[Event]]:
        """What an executable of this graph must keep besides the graph (whose nodes keep
        their objects): host functions, libraries, recorded events (of the graphs inside it
        too)."""
        nodes, host = self._nodes, list(self._host)
        # (C-level passes: a build of a thousand kernel nodes pays this per node)
        kernels = set(map(_KERNEL_OF, nodes))
        kernels.discard(None)
        libraries = set(map(_OWNER_OF, kernels))
        events = [
            node._extra
            for node in nodes
            if node.kind == "record" and isinstance(node._extra, Event)
        ]
        for part in self._parts:
            h, lib, ev = part._closure()
            host.extend(h)
            libraries.update(lib)
            events.extend(ev)
        return host, libraries, events

    def __len__(self) -> int:
        return len(self._nodes)

    def __repr__(self) -> str:
        active = self._ctx._state is ACTIVE
        edges = f", {len(self.edges)} edges" if active else ""
        body = " (conditional body)" if self._home is not None else ""
        state = "" if active else f" context {self._ctx._state}"
        return (
            f"<Graph{body} {self._key:#x} {summarize(self._nodes)}{edges} ctx "
            f"{self._ctx._key:#x}{state}>"
        )


_KERNEL_OF = attrgetter("_kernel")
_OWNER_OF = attrgetter("_owner")


def _destroy_graph(drv, handle, ctx: Context) -> None:
    if ctx._state != DESTROYED:  # as for streams and events: nothing of a destroyed context
        drv.cuGraphDestroy(handle)
