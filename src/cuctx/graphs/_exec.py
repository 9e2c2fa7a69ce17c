"""Graph executables: `GraphExec` (cuGraphInstantiate), launches and uploads,
whole-graph updates (cuGraphExecUpdate) and per-node ones (cuGraphExec*NodeSetParams,
cuGraphNodeSetEnabled).

What an executable's work uses stays alive as long as it can run: at instantiation it copies
its graph's set (every node's objects, host functions, libraries; the graph itself, whose
node handles identify the executable's nodes), and each per-node update adds the new
arguments. When the executable is destroyed (or collected) while launches may still run,
that set goes to the queues of the streams it was launched on (`_lifetimes`), which drop it
once those streams are known idle. A use after its context is gone raises the context's
error first (ContextDestroyedError).

Refusals name the node, the user's line that made it and the driver's reason in words
(`GraphUpdateError`).
"""

from __future__ import annotations

import functools
import weakref
from typing import TYPE_CHECKING, Any

from cuda.bindings.driver import CUgraphInstantiate_flags

from .. import _lifetimes, _trace
from .._driver import in_host_function
from ..kernels._launch_config import make_config, validate
from .._resource import Resource
from ..context import ACTIVE, Context, in_context
from .._calls import fail, refuse_in_host_function
from ..errors import CONTEXT_IS_DESTROYED, CudaError, GraphUpdateError
from ..stream import Stream, resolve_stream
from ._capture_rules import _refuse_captured, _refuse_instantiation
from ._conditions import check_condition_args, with_bodies
from ._nodes import KernelParams, copy_params, fill_params
from ._trace_launch import announce
from ._update import TOPOLOGY, UPDATE_REASONS, refusal
from ._exec_lifetime import _destroy_exec, _forget_context, _Held, _live, _retire, _unlink_private

if TYPE_CHECKING:
    from ._graph import Graph
    from ._graph_node import GraphNode

_F = CUgraphInstantiate_flags


class GraphExec(Resource):
    """An executable graph: made by `Graph.instantiate`. `launch` runs it on a stream of its
    context; `update` takes the parameters of another graph of the same structure;
    `update_node` changes one kernel, copy or fill node; `enable` turns a node off and on.
    `destroy` (or the end of a ``with`` block, or garbage collection) frees it."""

    __slots__ = (
        "graph",
        "_origin",
        "_held",
        "_host",
        "_libraries",
        "_events",
        "_where",
        "_handles",
        "_specs",
        "_finalizer",
        "__weakref__",
    )

    def __init__(self, graph: Graph, upload: Any, auto_free: bool, priority: bool) -> None:
        graph._check("Graph.instantiate")
        if _lifetimes.capturing:
            _refuse_instantiation("Graph.instantiate")
        ctx = graph._ctx
        backend = ctx._backend
        drv = backend.driver
        flags = (int(_F.CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH) if auto_free else 0) | (
            int(_F.CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY) if priority else 0
        )
        stream = None if upload is None else _stream_for(ctx, upload, "Graph.instantiate")
        with in_context(ctx, "Graph.instantiate"):
            err, handle = drv.cuGraphInstantiate(graph._handle, flags)
        if err:
            fail(backend, err, "cuGraphInstantiate", ctx, hint=f"instantiating {graph!r}")
        self._backend = backend
        self._ctx = ctx
        self._handle = handle
        self._key = int(handle)
        self._origin = graph  # its node handles name the executable's nodes
        self._held = _Held()
        self._take(graph)
        self._handles = [node._handle for node in self._specs]
        self._finalizer = _lifetimes.finalize(self, _destroy_exec, drv, handle, ctx, self._held)
        live = _live.get(ctx._key)
        if live is None:  # (not setdefault: a WeakSet made for nothing costs a microsecond)
            live = _live[ctx._key] = weakref.WeakSet()
        live.add(self)
        ctx._on_teardown(_forget_context)
        if stream is not None:  # what CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD does, in one more call
            self.upload(stream)

    def _take(self, graph: Graph) -> None:
        """Keep what ``graph``'s nodes use; its nodes, and those of its conditional bodies,
        name this executable's nodes (by position in `with_bodies`: the order the driver
        pairs them in for an update)."""
        host, libraries, events = graph._closure()
        self.graph = graph
        self._host = tuple(host)
        self._libraries = tuple(libraries)
        self._events = tuple(events)
        held = self._held
        _retire(held, (held.objects, list(held.slots.values())))
        _unlink_private(held.objects[1:2], keep=(self._origin, graph))  # (an update's, replaced)
        held.objects = (self._origin, graph, *host)  # (each graph's nodes keep their objects)
        held.slots.clear()
        self._specs = with_bodies(graph)
        origin = self._specs if graph is self._origin else with_bodies(self._origin)
        self._where = dict(zip(origin, range(len(origin))))
        if graph is not self._origin:  # (an update's graph: its nodes name them too)
            self._where.update(zip(self._specs, range(len(self._specs))))

    # -- properties -----------------------------------------------------------------------

    @property
    def context(self) -> Context:
        return self._ctx

    @property
    def device(self):
        return self._ctx.device

    @property
    def handle(self) -> int:
        """The CUgraphExec as an integer (0 once destroyed)."""
        return self._key if self._handle is not None else 0

    def _usable(self, operation: str) -> None:
        ctx = self._ctx
        if ctx._state is not ACTIVE:
            raise ctx._unusable(operation)
        if self._handle is None:
            raise RuntimeError(
                f"{operation}: the executable was destroyed; instantiate the graph again"
            )
        if in_host_function:
            refuse_in_host_function(operation)

    # -- running --------------------------------------------------------------------------

    def launch(self, stream: Stream | Any | None = None) -> None:
        """Run the graph on ``stream`` (default: the current stream of its context), after
        the work queued there before. The stream must belong to the executable's context."""
        self._usable("GraphExec.launch")
        ctx = self._ctx
        if stream.__class__ is not Stream or stream._ctx is not ctx:
            stream = _stream_for(ctx, stream, "GraphExec.launch")
        if _lifetimes.capturing:
            _refuse_captured(stream, "GraphExec.launch")
        for library in self._libraries:
            if not library._loaded:
                raise library._gone("GraphExec.launch")
        for host in self._host:  # its host nodes' failures go to this stream's synchronize
            host.owner.key = (ctx._key, stream._key)
        (err,) = stream._call(self._backend.driver.cuGraphLaunch, self._handle, stream._handle)
        if err:
            fail(self._backend, err, "cuGraphLaunch", ctx, hint=f"launching {self!r}")
        self._held.streams.add(stream)
        for event in self._events:
            event._recorded = True
        if _trace.sinks:
            announce(self, self.graph, stream)

    def upload(self, stream: Stream | Any | None = None) -> None:
        """Prepare the executable's device resources on ``stream`` now, so the first launch
        does not pay for it."""
        self._usable("GraphExec.upload")
        stream = _stream_for(self._ctx, stream, "GraphExec.upload")
        if _lifetimes.capturing:
            _refuse_captured(stream, "GraphExec.upload")
        (err,) = stream._call(self._backend.driver.cuGraphUpload, self._handle, stream._handle)
        if err:
            fail(self._backend, err, "cuGraphUpload", self._ctx)

    # -- updates --------------------------------------------------------------------------

    def update(self, graph: Graph) -> None:
        """Take every node's parameters from ``graph``, which must have the structure of
        this executable's graph (the same kinds of nodes, added in the same order, with the
        same dependencies). A refusal raises `GraphUpdateError` naming the node, the line
        that added it and the reason; the executable is then unchanged."""
        self._usable("GraphExec.update")
        if not isinstance(graph, type(self._origin)):
            raise TypeError(f"GraphExec.update takes a cuctx.Graph, not {type(graph).__name__}")
        graph._check("GraphExec.update")
        if graph._ctx is not self._ctx:
            raise ValueError(
                f"GraphExec.update: {graph!r} belongs to {graph._ctx!r}, the "
                f"executable to {self._ctx!r}"
            )
        with in_context(self._ctx, "GraphExec.update"):
            err, info = self._backend.driver.cuGraphExecUpdate(self._handle, graph._handle)
        if err:
            self._refuse_update(err, graph, info)
        self._take(graph)

    def _refuse_update(self, err, graph: Graph, info) -> None:
        result, node, dependency = refusal(self.graph, graph, info)
        reason = UPDATE_REASONS.get(result, f"result {result}")
        if node is not None:
            what = f"{node.description}, added at {node.where}"
            if dependency is not None:
                what += (
                    f" (its dependency on {dependency.description}, added at "
                    f"{dependency.where}, is new)"
                )
        elif result == TOPOLOGY:
            what = (
                f"the graph as a whole ({len(graph._nodes)} nodes, the executable's "
                f"{len(self.graph._nodes)})"
            )
        else:
            what = "the graph"
        try:
            fail(
                self._backend,
                err,
                "GraphExec.update",
                self._ctx,
                hint=f"refused {what}: {reason}; the executable is unchanged",
            )
        except GraphUpdateError as exc:
            exc.node, exc.reason = node, reason
            raise

    def update_node(
        self,
        node: GraphNode,
        *args: Any,
        grid: Any = None,
        block: Any = None,
        shared_mem: Any = None,
    ) -> None:
        """Change one node of the executable (its graph is unchanged): a kernel node's
        arguments (all of them, checked and packed as for `cuctx.launch`) and optionally its
        ``grid``, ``block``, ``shared_mem``; a copy node's ``(dst, src)``; a fill node's
        ``(array, value)``. The new objects are kept alive with the executable."""
        self._usable("GraphExec.update_node")
        position = self._where.get(node)
        if position is None:
            raise ValueError(
                f"GraphExec.update_node: {node!r} is not a node of the graph this "
                "executable was made from (or updated with) or of its conditional "
                "bodies; nor are a child graph's nodes (its child node runs a "
                "copy of them): change those with exe.update(graph)"
            )
        slot = self._held.slots.get(position)
        if slot is None:
            slot = self._held.slots[position] = self._slot(position)
        kind = slot.kind
        if kind != "kernel" and (grid is not None or block is not None or shared_mem is not None):
            raise TypeError(
                f"GraphExec.update_node: grid, block and shared_mem are for kernel "
                f"nodes, and {node!r} is a {kind} node"
            )
        err = slot.update(self, args, grid, block, shared_mem)
        if err:
            self._refuse_node(err, slot.name, self._specs[position])

    def _slot(self, position: int) -> _Slot:
        spec = self._specs[position]
        handle = self._handles[position]
        maker = _SLOTS.get(spec.kind)
        if maker is None or (spec.kind == "kernel" and spec._kernel is None):
            raise TypeError(
                f"GraphExec.update_node changes kernel, copy and fill nodes made "
                f"by cuctx; {spec!r} is a {spec.kind} node: update the whole graph "
                "with exe.update(graph)"
            )
        return maker(self, spec, handle)

    def _refuse_node(self, err, operation: str, node: GraphNode) -> None:
        hint = f"refused for {node.description}, added at {node.where}"
        try:
            fail(self._backend, err, operation, self._ctx, hint=hint)
        except CudaError as exc:
            if exc.sticky or exc.code == CONTEXT_IS_DESTROYED or isinstance(exc, GraphUpdateError):
                raise
            refusal = GraphUpdateError(exc.code, exc.operation, exc.message, exc.hint)
            refusal.node, refusal.reason = node, exc.message
            raise refusal from None

    def enable(self, node: GraphNode, enabled: bool = True) -> None:
        """Turn a kernel, copy or fill node off (it does nothing at later launches) or on
        again; its parameters stay."""
        self._usable("GraphExec.enable")
        position = self._where.get(node)
        if position is None:
            raise ValueError(f"GraphExec.enable: {node!r} is not a node of this executable's graph")
        spec = self._specs[position]
        if spec.kind not in ("kernel", "copy", "fill"):
            raise TypeError(
                f"GraphExec.enable turns kernel, copy and fill nodes on and off "
                f"(the driver's rule); {spec!r} is a {spec.kind} node"
            )
        (err,) = self._backend.driver.cuGraphNodeSetEnabled(
            self._handle, self._handles[position], int(bool(enabled))
        )
        if err:
            self._refuse_node(err, "cuGraphNodeSetEnabled", spec)

    # -- the end --------------------------------------------------------------------------

    def destroy(self) -> None:
        """Free the executable. Launches still queued run to completion (the driver's rule),
        and what they use stays alive until their streams are known idle."""
        if self._handle is not None:
            self._handle = None
            self._finalizer()

    def __enter__(self) -> GraphExec:
        return self

    def __exit__(self, *exc_info) -> None:
        self.destroy()

    def __repr__(self) -> str:
        state = f"{self._key:#x}" if self._handle is not None else "destroyed"
        return f"<GraphExec {state} of {self.graph!r}>"


# -- per-node updates: what each kind precomputes ---------------------------------------------


class _Slot:
    """One node's update state: the bound driver call and what the new parameters use."""

    __slots__ = ("kind", "name", "set", "params", "keep")

    def __init__(self, kind: str, name: str, call) -> None:
        self.kind, self.name, self.set = kind, name, call
        self.params: KernelParams | None = None
        self.keep: tuple = ()


class _KernelSlot(_Slot):
    __slots__ = ("device", "graph")

    def update(self, exe: GraphExec, args: tuple, grid, block, shared_mem):
        params = self.params
        if params.conditions:
            check_condition_args(params.conditions, args, self.graph, "GraphExec.update_node")
        config = None
        if grid is not None or block is not None or shared_mem is not None:
            old = params.config
            config = make_config(
                old.grid if grid is None else grid,
                old.block if block is None else block,
                old.shared_mem if shared_mem is None else shared_mem,
                None,
                False,
            )
            kernel = params.kernel
            if (config, self.device) not in kernel._checked:
                validate(kernel, self.device, config)
                kernel._checked.add((config, self.device))
        replaced = params.args
        params.pack(args, exe._origin._stream)
        if config is not None:
            params.configure(config)
        if replaced and exe._held.streams:
            _retire(exe._held, replaced)
        return self.set()[0]


def _kernel_slot(exe: GraphExec, spec: GraphNode, handle) -> _Slot:
    slot = _KernelSlot("kernel", "cuGraphExecKernelNodeSetParams", None)
    slot.params = KernelParams(spec._kernel, spec._config, exe._ctx)
    slot.device = exe._ctx._device
    slot.graph = spec.graph  # the graph the node is in: which conditions it may set
    slot.set = functools.partial(
        exe._backend.driver.cuGraphExecKernelNodeSetParams, exe._handle, handle, slot.params.struct
    )
    return slot


class _MemorySlot(_Slot):
    """A copy or fill node: its struct rebuilt from two arguments, with the eager checks."""

    __slots__ = ()
    BUILD = {"copy": (copy_params, "(dst, src)"), "fill": (fill_params, "(array, value)")}

    def update(self, exe: GraphExec, args: tuple, grid, block, shared_mem):
        build, takes = self.BUILD[self.kind]
        if len(args) != 2:
            raise TypeError(
                f"GraphExec.update_node of a {self.kind} node takes {takes}, got "
                f"{len(args)} argument(s)"
            )
        params, _ = build(args[0], args[1], exe._ctx, "GraphExec.update_node")
        (err,) = self.set(params, exe._ctx._handle)
        if not err:
            _retire(exe._held, self.keep)
            self.keep = args
        return err


def _bound(cls, kind: str, name: str):
    def make(exe: GraphExec, spec: GraphNode, handle) -> _Slot:
        call = functools.partial(getattr(exe._backend.driver, name), exe._handle, handle)
        return cls(kind, name, call)

    return make


_SLOTS = {
    "kernel": _kernel_slot,
    "copy": _bound(_MemorySlot, "copy", "cuGraphExecMemcpyNodeSetParams"),
    "fill": _bound(_MemorySlot, "fill", "cuGraphExecMemsetNodeSetParams"),
}


# -- streams, lifetimes, teardown ---------------------------------------------------------------


def _stream_for(ctx: Context, stream: Any, operation: str) -> Stream:
    """The stream to run on: None is the current stream of ``ctx``; one of another context
    (or device) is refused, naming both."""
    stream = resolve_stream(stream, ctx)
    if stream._ctx is not ctx:
        raise ValueError(
            f"{operation}: the executable belongs to {ctx!r} (device {ctx._device.ordinal}) "
            f"and {stream!r} to {stream._ctx!r} (device {stream._ctx._device.ordinal}); an "
            "executable runs on streams of its own context: make one there "
            "(with exe.context: cuctx.Stream()) or instantiate a graph of that context"
        )
    return stream
