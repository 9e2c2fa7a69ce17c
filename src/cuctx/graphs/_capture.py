"""Stream capture: ``with stream.capture(mode) as graph:`` turns the work cuctx queues in the
block on ``stream``, and on streams that join it by waiting for it, into a `Graph`.

How the work is seen: while a capture is active, a trace sink (`_trace.add_sink`) receives
every operation cuctx enqueues (the generated fast paths step aside while a sink listens).
For each operation on a stream of the capture it keeps what the graph's nodes use (arrays,
page-locked host arrays, kernels, events), notes events recorded and memory allocated in the
capture, and asks the driver which nodes the operation added (`cuStreamGetCaptureInfo`: the
stream's dependencies after it are its last nodes; a count of the graph's nodes says how many
it added, and earlier ones of a multi-node operation are found among their dependencies),
giving each node the user's line. A stream joins when it waits for an event recorded in the
capture or for a stream of it. When the block ends, `_adopt` makes the driver's graph the
`Graph` handed out at entry (a `_Pending` until then).

Calls that would break a capture are refused, and captures the driver invalidated are ended,
by `_capture_rules`; this module installs those checks in `_lifetimes`.
"""

from __future__ import annotations

import threading
import weakref
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping

from cuda.bindings.driver import (
    CUresult,
    CUstreamCaptureMode,
    CUstreamUpdateCaptureDependencies_flags,
)

from .. import _lifetimes, _trace
from .._lifetimes import finalize
from ..memory._alloc import forget
from .._resource import upper
from .._calls import fail, refuse_in_host_function
from ..errors import CAPTURE_UNSUPPORTED, GraphCaptureError
from ..stream import Stream
from .._driver import LEGACY
from ._capture_rules import (
    _ACTIVE,
    _user_call,
    _user_frame,
    _where,
    capture_failed,
    held_by_capture,
    refuse_in_capture,
)
from ._graph import Graph, _destroy_graph
from ._graph_node import GraphNode
from ._nodes import HostFunctions, NodeInfo, describe_kernel, kind_of

if TYPE_CHECKING:
    from ..context import Context

MODES = {
    "thread_local": CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
    "global": CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL,
    "relaxed": CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED,
}
_SET_DEPENDENCIES = int(CUstreamUpdateCaptureDependencies_flags.CU_STREAM_SET_CAPTURE_DEPENDENCIES)
CAPTURE_INVALIDATED = int(CUresult.CUDA_ERROR_STREAM_CAPTURE_INVALIDATED)


def capture(stream: Stream, mode: str = "thread_local") -> Capture:
    """`Stream.capture`: the context manager of one capture."""
    if mode not in MODES:
        raise ValueError(f"capture mode must be one of {', '.join(map(repr, MODES))}, not {mode!r}")
    return Capture(stream, mode)


class Capture:
    """One capture of ``stream`` in ``mode``; ``with`` it to get the `Graph`."""

    __slots__ = (
        "stream",
        "mode",
        "thread",
        "ctx",
        "site",
        "graph",
        "host",
        "events",
        "allocations",
        "held",
        "broken",
        "_streams",
        "_info",
        "_count",
        "_lock",
    )

    def __init__(self, stream: Stream, mode: str) -> None:
        self.stream = stream
        self.mode = mode
        self.thread = threading.get_ident()
        self.ctx = stream._ctx
        self.site: tuple[str, int, str] | None = None  # where the capture began
        self.graph: Graph | None = None
        self.host = HostFunctions(self.ctx)  # the captured host functions (host nodes)
        self.events: set[int] = set()  # events recorded in the capture
        self.allocations: set[int] = set()  # memory allocated in it (graph memory)
        self.held: list[Callable[[], None]] = []  # frees of other memory, run at the end
        self.broken: GraphCaptureError | None = None  # what ended it early
        self._streams: list[Stream] = []  # the origin, then the streams that joined
        self._info: dict[int, NodeInfo] = {}  # node handle -> its line, what it uses
        self._count = 0  # the graph's node count after the last operation seen
        self._lock = threading.Lock()  # "relaxed" captures may be fed by several threads

    def __repr__(self) -> str:
        if self.broken is not None:
            state = f"broken ({self.broken.name}; .broken says by what), no graph"
        elif _lifetimes.capturing.get((self.ctx._key, self.stream._key)) is self:
            state = f"capturing since {_where(self.site)}"
        elif self.graph is None:
            state = "not begun"
        else:
            state = f"ended: {self.graph!r}"
        return f"<Capture {self.mode} of {self.stream!r}, {state}>"

    # -- the block ------------------------------------------------------------------------

    def __enter__(self) -> Graph:
        stream, ctx = self.stream, self.ctx
        if self.graph is not None:
            raise RuntimeError(
                f"this capture was entered at {_where(self.site)} already; a "
                "capture records one block: call stream.capture() again for "
                "another graph"
            )
        ctx._check("Stream.capture")
        refuse_in_host_function("Stream.capture")
        if stream._key in (0, LEGACY):
            raise GraphCaptureError(
                CAPTURE_UNSUPPORTED,
                "Stream.capture",
                "",
                "the legacy default stream cannot be captured (a CUDA rule); capture a stream "
                "you create: s = cuctx.Stream(); with s.capture() as graph: ...",
            )
        other = _lifetimes.capturing.get((ctx._key, stream._key))
        if other is not None:
            raise ValueError(
                f"{stream!r} is already being captured (since {_where(other.site)});"
                " a stream takes part in one capture at a time"
            )
        drv = ctx._backend.driver
        (err,) = stream._call(drv.cuStreamBeginCapture, stream._handle, MODES[self.mode])
        if err:
            fail(ctx._backend, err, "cuStreamBeginCapture", ctx)
        self.site = _trace.user_site()
        self.graph = object.__new__(_Pending)  # made a Graph at the end (_adopt)
        self._join(stream)
        _trace.add_sink(self._see)
        stream.__enter__()  # the current stream in the block, as torch.cuda.graph makes it
        return self.graph

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            self.stream.__exit__(exc_type, exc, tb)  # the block's current stream is undone
        finally:
            self._end(exc_type)

    def _end(self, exc_type) -> None:
        if self.broken is not None:  # ended already, by the call that broke it
            if exc_type is None:
                raise GraphCaptureError(
                    self.broken.code,
                    "Stream.capture",
                    self.broken.message,
                    f"the capture begun at {_where(self.site)} was broken earlier and holds "
                    f"no graph: {self.broken}",
                ) from self.broken
            return
        _trace.remove_sink(self._see)
        stream, ctx = self.stream, self.ctx
        err, handle = stream._call(ctx._backend.driver.cuStreamEndCapture, stream._handle)
        self._leave()
        if exc_type is not None or err:
            self._discard(handle)
            if exc_type is None:
                fail(ctx._backend, err, "cuStreamEndCapture", ctx, self._end_hint(int(err)))
            return
        _adopt(ctx, handle, self._info, (self.host,), into=self.graph)
        self._run_held()

    def _join(self, stream: Stream) -> None:
        """File ``stream`` as taking part in this capture."""
        self._streams.append(stream)
        _lifetimes.capturing[stream._ctx._key, stream._key] = self
        _lifetimes.queue(stream._ctx, stream._key).capturing = self

    def _leave(self) -> None:
        """The capture is over: its streams are ordinary streams again."""
        for stream in self._streams:
            key = (stream._ctx._key, stream._key)
            if _lifetimes.capturing.get(key) is self:
                del _lifetimes.capturing[key]
            queue = _lifetimes._queues.get(key)
            if queue is not None and queue.capturing is self:
                queue.capturing = None
        if _lifetimes._held and not _lifetimes.capturing:  # destroys collected meanwhile
            _lifetimes.run_held_finalizers()

    def _end_early(self, error: GraphCaptureError) -> None:
        """End the capture now (the calling thread began it): its graph is discarded and the
        stream is usable again."""
        self.broken = error
        _trace.remove_sink(self._see)
        stream = self.stream
        err, handle = stream._call(self.ctx._backend.driver.cuStreamEndCapture, stream._handle)
        self._leave()
        self._discard(None if err else handle)

    def _discard(self, handle) -> None:
        """Drop a capture that makes no graph: destroy what the driver returned, forget the
        memory allocated in it (it never existed), run the frees held back."""
        if handle is not None and int(handle):
            self.ctx._backend.driver.cuGraphDestroy(handle)
        forget(self.ctx, self.allocations)
        self.host.owner.release()
        self._info.clear()
        self._run_held()

    def _run_held(self) -> None:
        held, self.held = self.held, []
        for free in held:
            _lifetimes.free_or_defer(free)

    def _end_hint(self, code: int) -> str:
        joined = ", ".join(repr(s) for s in self._streams[1:])
        why = {
            901: "an earlier call invalidated it (an operation the capture could not hold)",
            904: f"a stream that joined the capture ({joined}) was not joined back: make "
            f"the capturing stream wait for it (stream.wait(other)) before the block "
            "ends",
        }.get(code, "")
        return f"the capture of {self.stream!r} begun at {_where(self.site)} made no graph" + (
            f": {why}" if why else ""
        )

    # -- what the capture sees ------------------------------------------------------------

    def _see(self, op: _trace.Operation) -> None:
        """The trace sink: every operation cuctx enqueues, on any thread."""
        stream = op.stream
        if stream is None or op.context is not self.ctx or self.broken is not None:
            return
        with self._lock:
            if _lifetimes.capturing.get((self.ctx._key, stream._key)) is not self:
                if not self._joins(op):
                    return
                self._join(stream)
            if op.kind == "record":
                self.events.add(op.event._key)
            elif op.kind == "alloc":
                self.allocations.add(op.accesses[0].ptr)
            site = op.site
            if op.kind == "free":  # run by a finalizer: the user's line is the one above it
                frame, _ = _user_frame((weakref.__file__,))
                if frame is not None:
                    site = (frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name)
            self._map(stream, op, site)

    def _joins(self, op: _trace.Operation) -> bool:
        """Whether ``op`` makes its stream join this capture (a fork)."""
        if op.kind == "wait_event":
            return op.event._key in self.events
        if op.kind == "wait_stream":
            other = op.other
            return _lifetimes.capturing.get((other._ctx._key, other._key)) is self
        return False

    def host_function(self, stream: Stream, fn: Callable, args: tuple) -> Any:
        """`Stream.launch_host_func` on a capturing stream: a host node added by hand after
        the stream's capture dependencies, which then become that node; the driver's
        result. Not cuLaunchHostFunc: cuda.bindings wraps the callback in data it frees
        after the first call, and a graph calls it at every launch (on an H100 the second
        launch of such a graph crashed the process)."""
        drv = self.ctx._backend.driver
        err, status, _, graph, deps, _, n = stream._call(drv.cuStreamGetCaptureInfo, stream._handle)
        if err or status != _ACTIVE:
            return err or CAPTURE_INVALIDATED
        params = self.host.add(fn, args, self.ctx._backend.sim is None)
        err, node = stream._call(drv.cuGraphAddHostNode, graph, deps, n, params)
        if not err:
            (err,) = stream._call(
                drv.cuStreamUpdateCaptureDependencies,
                stream._handle,
                [node],
                None,
                1,
                _SET_DEPENDENCIES,
            )
        if err:
            _lifetimes.drop_host_function(int(params.userData))
        return err

    def _map(self, stream: Stream, op: _trace.Operation, site: tuple[str, int, str] | None) -> None:
        """Give the nodes ``op`` added on ``stream`` the user's line and what they use."""
        drv = self.ctx._backend.driver
        err, status, _, graph, deps, _, _ = stream._call(drv.cuStreamGetCaptureInfo, stream._handle)
        if err or status != _ACTIVE:
            return  # invalidated: whoever broke it reports it
        err, _, count = drv.cuGraphGetNodes(graph, 0)
        added, self._count = count - self._count, count
        todo = list(deps)
        info = _node_info(op, site, self.allocations) if added > 0 else None
        while todo and added > 0:  # the last nodes first, then back through a multi-node op
            node = todo.pop()
            key = int(node)
            if key in self._info:
                continue
            self._info[key] = info
            added -= 1
            err, _, _, n = drv.cuGraphNodeGetDependencies(node, 0)
            if not err and n:
                todo.extend(drv.cuGraphNodeGetDependencies(node, n)[1])


class _Pending(Graph):
    """The graph ``with stream.capture() as graph:`` hands out: `_adopt` makes it a
    Graph when the block ends. Until then it has none of a Graph's state, so any use of it
    (instantiate, launch, nodes, ...) comes here and is a GraphCaptureError naming the call
    and the user's line."""

    __slots__ = ()

    def __getattr__(self, name: str) -> Any:
        call, where = _user_call("Graph")
        raise GraphCaptureError(
            CAPTURE_UNSUPPORTED,
            call,
            "the capture's graph does not exist yet",
            f"at {where}: the graph of a capture is made when its `with` block ends; use it "
            "(instantiate, launch, its nodes) after the block",
        )

    def __repr__(self) -> str:
        return (
            "<Graph of a capture, not made yet: the capture makes it when its block ends "
            "without an error>"
        )


def _adopt(
    ctx: Context,
    handle,
    info: Mapping[int, NodeInfo] | None = None,
    host_functions: Iterable[HostFunctions] = (),
    into: Graph | None = None,
) -> Graph:
    """A `Graph` owning a CUgraph the driver made (cuStreamEndCapture's): one
    `GraphNode` per driver node, in the driver's order, with the `NodeInfo` given for
    its handle (``int(CUgraphNode)``; without one: no site, nothing kept). The
    ``host_functions`` of its host nodes stay registered while the graph or an
    executable of it lives. ``into``: the (uninitialised) Graph to fill, handed out by
    ``with stream.capture() as graph:`` before the capture made one."""
    graph = object.__new__(Graph) if into is None else into
    graph.__class__ = Graph  # the capture's placeholder (`_Pending`) becomes a Graph
    graph._setup(ctx, handle, None)
    drv = ctx._backend.driver
    graph._finalizer = finalize(graph, _destroy_graph, drv, handle, ctx)
    graph._host.extend(host_functions)
    info = info or {}
    for node in _driver_nodes(ctx, handle):
        err, node_type = drv.cuGraphNodeGetType(node)
        if err:
            fail(ctx._backend, err, "cuGraphNodeGetType", ctx)
        kind = kind_of(node_type)
        graph._append(GraphNode(graph, kind, node, info.get(int(node), NodeInfo())))
    return graph


def _driver_nodes(ctx: Context, handle) -> list:
    drv = ctx._backend.driver
    err, _, count = drv.cuGraphGetNodes(handle, 0)
    if err:
        fail(ctx._backend, err, "cuGraphGetNodes", ctx)
    if not count:
        return []
    err, nodes, count = drv.cuGraphGetNodes(handle, count)
    if err:
        fail(ctx._backend, err, "cuGraphGetNodes", ctx)
    return list(nodes[:count])


def _node_info(
    op: _trace.Operation, site: tuple[str, int, str] | None, graph_memory: set[int]
) -> NodeInfo:
    """What cuctx knows of the nodes one operation made: the user's line, what their work
    uses, words for messages. Arrays of the graph's own memory (allocated in the capture,
    ``graph_memory``) are not kept: the graph makes that memory, and keeping them would keep
    their frees out of it."""
    acc = op.accesses
    keep = tuple(
        a.array
        for a in acc
        if a.array is not None
        and getattr(getattr(a.array, "_alloc", None), "ptr", None) not in graph_memory
    )
    if op.kernel is not None:
        keep += (op.kernel,)
    if op.kind == "launch":
        words = describe_kernel(op.kernel, op.config)
    elif op.kind == "copy":
        sides = ["host" if a.host else "device" for a in acc]
        words = f"copy of {acc[1].nbytes} bytes, {sides[0]} to {sides[1]}"
    elif op.kind == "host_func":
        fn = op.fields.get("fn")
        words = f"host function {getattr(fn, '__qualname__', fn)!r}"
    else:  # memset, alloc, free
        words = f"{'fill' if op.kind == 'memset' else op.kind} of {acc[0].nbytes} bytes"
    return NodeInfo(site, keep, words + " (captured)", op.kernel, op.config)


# Installed at import: Stream.capture, and the checks of captures for the lower layers.
upper.capture = capture
_lifetimes.refuse_in_capture = refuse_in_capture
_lifetimes.capture_failed = capture_failed
_lifetimes.held_by_capture = held_by_capture
