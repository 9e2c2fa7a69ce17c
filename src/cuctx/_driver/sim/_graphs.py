"""Graphs of the sim: cuGraphCreate, the cuGraphAdd*Node functions and the structure queries.

A graph is a list of nodes in creation order; a node holds its dependencies (in the order
given) and its *work* (`_graph_nodes`: what it does, checked when the node is made, as the
driver checks). Handles are plain integers from one counter per kind, never reused. A bad
graph or node handle is CUDA_ERROR_INVALID_VALUE, as the driver documents for every graph
function. Child graphs are cloned when their node is added (the driver's contract); the
clone is owned by the node (cuGraphChildGraphNodeGetGraph hands it out, cuGraphDestroy
refuses it) and goes with its parent. Executables (`_graph_exec`) clone the whole tree.

Lists come back as cuda.bindings returns them: asked for ``n`` entries (the default 0 asks
only for the count), a list of ``n`` handles padded with null handles, and the real count;
in the H100's order (driver 580): nodes in creation order, root nodes newest first, edges
grouped by their source node in creation order, each source's in the order they were added.
"""

from __future__ import annotations

import itertools

from cuda.bindings.driver import (
    CUDA_HOST_NODE_PARAMS,
    CUgraph,
    CUgraphEdgeData,
    CUgraphNode,
    CUgraphNodeType,
)

from ._cargs import size_t
from ._common import INVALID_VALUE, NOT_INITIALIZED, NOT_SUPPORTED, OK
from ._graph_nodes import (
    ChildWork,
    EmptyWork,
    EventWork,
    HostWork,
    copy_work,
    kernel_work,
    memset_work,
)

T = CUgraphNodeType


class SimNode:
    __slots__ = ("handle", "graph", "work", "deps")

    def __init__(self, handle: int, graph: SimGraph, work, deps: list):
        self.handle = handle
        self.graph = graph
        self.work = work
        self.deps = deps  # SimNodes of the same graph, in the order given

    @property
    def type(self):
        return self.work.type

    def __repr__(self) -> str:
        return f"<SimNode {self.type.name} {self.handle:#x}>"


class SimGraph:
    __slots__ = ("handle", "nodes", "owner", "execs")

    def __init__(self, handle: int, owner=None):
        self.handle = handle
        self.nodes: list[SimNode] = []
        self.owner = owner  # the node that embeds it (child graph, conditional body) or None
        self.execs = 0  # live executables instantiated from it (memory nodes allow one)

    def walk(self):
        """Every node of this graph and of the graphs its nodes hold."""
        for node in self.nodes:
            yield node
            for inner in inner_graphs(node):
                yield from inner.walk()


def inner_graphs(node: SimNode) -> list[SimGraph]:
    if isinstance(node.work, ChildWork):
        return [node.work.graph]
    return list(getattr(node.work, "bodies", ()))


def order(nodes: list[SimNode]) -> list[SimNode]:
    """A dependency order of ``nodes``: each node after its dependencies, creation order
    among nodes that are ready together."""
    position = {id(n): i for i, n in enumerate(nodes)}
    waiting = {id(n): len(n.deps) for n in nodes}
    users: dict[int, list[SimNode]] = {id(n): [] for n in nodes}
    for node in nodes:
        for dep in node.deps:
            users[id(dep)].append(node)
    ready = [n for n in nodes if not n.deps]
    out = []
    while ready:
        ready.sort(key=lambda n: position[id(n)], reverse=True)
        node = ready.pop()
        out.append(node)
        for user in users[id(node)]:
            waiting[id(user)] -= 1
            if not waiting[id(user)]:
                ready.append(user)
    return out


def padded(handles: list, asked: int, kind):
    """cuda.bindings' answer for a list query: ``asked`` entries, null-padded."""
    return [kind(h) for h in handles[:asked]] + [kind(0)] * max(asked - len(handles), 0)


class GraphModel:
    """cuGraphCreate, cuGraphDestroy, cuGraphAdd*Node, cuGraphGetNodes/RootNodes/Edges,
    cuGraphNodeGetType/Dependencies, cuGraphChildGraphNodeGetGraph,
    cuGraphKernelNodeGetParams."""

    def _init_graphs(self):
        self._graph_handles = itertools.count(0x6A00_0000_0100, 0x100)
        self._node_handles = itertools.count(0x6E00_0000_0100, 0x100)
        self._graphs: dict[int, SimGraph] = {}
        self._graph_nodes: dict[int, SimNode] = {}

    # -- handles --------------------------------------------------------------------------

    def _graph(self, hGraph) -> SimGraph | None:
        return self._graphs.get(int(hGraph or 0))

    def _graph_node(self, hNode) -> SimNode | None:
        return self._graph_nodes.get(int(hNode or 0))

    def _new_graph(self, owner=None) -> SimGraph:
        graph = SimGraph(next(self._graph_handles), owner)
        self._graphs[graph.handle] = graph
        return graph

    def _forget(self, graph: SimGraph) -> None:
        for node in list(graph.walk()):
            self._graph_nodes.pop(node.handle, None)
            for inner in inner_graphs(node):
                self._graphs.pop(inner.handle, None)
        self._graphs.pop(graph.handle, None)

    def _dependencies(self, graph: SimGraph, dependencies, numDependencies):
        """(CUresult, [SimNode]) checked as cuda.bindings and the driver check them."""
        count = size_t(numDependencies)
        given = list(dependencies or [])
        if not all(isinstance(d, CUgraphNode) for d in given):
            raise TypeError(
                "Argument 'dependencies' is not instance of type (expected "
                "tuple[cydriver.CUgraphNode,] or list[cydriver.CUgraphNode,]"
            )
        if count > len(given):
            raise RuntimeError(f"List is too small: {len(given)} < {count}")
        deps = [self._graph_node(d) for d in given[:count]]
        if any(d is None or d.graph is not graph for d in deps) or len(set(map(id, deps))) != len(
            deps
        ):
            return INVALID_VALUE, None
        return OK, deps

    def _add_node(self, hGraph, dependencies, numDependencies, make):
        """(CUresult, CUgraphNode): ``make()`` gives (CUresult, work) after the graph and
        the dependencies were checked."""
        if not self._initialized:
            return (NOT_INITIALIZED, None)
        with self._lock:
            graph = self._graph(hGraph)
            if graph is None:
                return (INVALID_VALUE, None)
            err, deps = self._dependencies(graph, dependencies, numDependencies)
            if err:
                return (err, None)
            err, work = make()
            if err:
                return (err, None)
            return (OK, CUgraphNode(self._append(graph, work, deps).handle))

    def _append(self, graph: SimGraph, work, deps: list) -> SimNode:
        node = SimNode(next(self._node_handles), graph, work, deps)
        graph.nodes.append(node)
        self._graph_nodes[node.handle] = node
        return node

    def _clone(self, graph: SimGraph, owner) -> SimGraph:
        """A registered copy of ``graph`` (new handles), owned by the node ``owner``."""
        copy = self._new_graph(owner)
        mapped = {}
        for node in graph.nodes:
            work = node.work
            if isinstance(work, ChildWork):
                work = ChildWork(None)
            new = self._append(copy, work, [mapped[id(d)] for d in node.deps])
            if isinstance(work, ChildWork):
                work.graph = self._clone(node.work.graph, new)
            mapped[id(node)] = new
        return copy

    # -- graphs ---------------------------------------------------------------------------

    def cuGraphCreate(self, flags):
        if not self._initialized:
            return (NOT_INITIALIZED, None)
        if int(flags):
            return (INVALID_VALUE, None)  # "must be zero"
        with self._lock:
            return (OK, CUgraph(self._new_graph().handle))

    def cuGraphDestroy(self, hGraph):
        with self._lock:
            graph = self._graph(hGraph)
            if graph is None or graph.owner is not None:
                return (INVALID_VALUE,)
            self._forget(graph)
        return (OK,)

    # -- nodes ----------------------------------------------------------------------------

    def cuGraphAddKernelNode(self, hGraph, dependencies, numDependencies, nodeParams):
        return self._add_node(
            hGraph, dependencies, numDependencies, lambda: kernel_work(self, nodeParams)
        )

    def cuGraphAddMemcpyNode(self, hGraph, dependencies, numDependencies, copyParams, ctx):
        return self._add_node(
            hGraph, dependencies, numDependencies, lambda: copy_work(self, copyParams, ctx)
        )

    def cuGraphAddMemsetNode(self, hGraph, dependencies, numDependencies, memsetParams, ctx):
        return self._add_node(
            hGraph, dependencies, numDependencies, lambda: memset_work(self, memsetParams, ctx)
        )

    def cuGraphAddHostNode(self, hGraph, dependencies, numDependencies, nodeParams):
        return self._add_node(hGraph, dependencies, numDependencies, lambda: host_work(nodeParams))

    def cuGraphAddEmptyNode(self, hGraph, dependencies, numDependencies):
        return self._add_node(hGraph, dependencies, numDependencies, lambda: (OK, EmptyWork()))

    def cuGraphAddEventRecordNode(self, hGraph, dependencies, numDependencies, event):
        return self._add_node(
            hGraph,
            dependencies,
            numDependencies,
            lambda: self._event_work(T.CU_GRAPH_NODE_TYPE_EVENT_RECORD, event),
        )

    def cuGraphAddEventWaitNode(self, hGraph, dependencies, numDependencies, event):
        return self._add_node(
            hGraph,
            dependencies,
            numDependencies,
            lambda: self._event_work(T.CU_GRAPH_NODE_TYPE_WAIT_EVENT, event),
        )

    def _event_work(self, kind, hEvent):
        err, event = self._event(hEvent)
        return (INVALID_VALUE if err else OK), (None if err else EventWork(kind, event))

    def cuGraphAddChildGraphNode(self, hGraph, dependencies, numDependencies, childGraph):
        def make():
            child = self._graph(childGraph)
            if child is None or child is self._graph(hGraph):
                return INVALID_VALUE, None
            # "contains allocation or free nodes", or conditional nodes (H100, driver 580)
            if any(
                n.type in MEMORY_NODES or n.type == T.CU_GRAPH_NODE_TYPE_CONDITIONAL
                for n in child.walk()
            ):
                return NOT_SUPPORTED, None
            return OK, ChildWork(child)

        err, handle = self._add_node(hGraph, dependencies, numDependencies, make)
        if not err:
            node = self._graph_node(handle)
            node.work = ChildWork(self._clone(node.work.graph, node))
        return (err, handle)

    # -- queries --------------------------------------------------------------------------

    def cuGraphGetNodes(self, hGraph, numNodes=0):
        graph = self._graph(hGraph)
        if graph is None:
            return (INVALID_VALUE, None, None)
        handles = [n.handle for n in graph.nodes]
        return (OK, padded(handles, size_t(numNodes), CUgraphNode), len(handles))

    def cuGraphGetRootNodes(self, hGraph, numRootNodes=0):
        graph = self._graph(hGraph)
        if graph is None:
            return (INVALID_VALUE, None, None)
        handles = [n.handle for n in reversed(graph.nodes) if not n.deps]
        return (OK, padded(handles, size_t(numRootNodes), CUgraphNode), len(handles))

    def cuGraphGetEdges(self, hGraph, numEdges=0):
        """(CUresult, from, to, edgeData, numEdges): the edges out of each node in creation
        order, each node's in the order they were added; default (zeroed) edge data."""
        graph = self._graph(hGraph)
        if graph is None:
            return (INVALID_VALUE, None, None, None, None)
        out: dict[int, list] = {id(n): [] for n in graph.nodes}
        for node in graph.nodes:
            for dep in node.deps:
                out[id(dep)].append(node)
        edges = [(n.handle, user.handle) for n in graph.nodes for user in out[id(n)]]
        asked = size_t(numEdges)
        return (
            OK,
            padded([e[0] for e in edges], asked, CUgraphNode),
            padded([e[1] for e in edges], asked, CUgraphNode),
            [CUgraphEdgeData() for _ in range(asked)],
            len(edges),
        )

    def cuGraphNodeGetDependencies(self, hNode, numDependencies=0):
        node = self._graph_node(hNode)
        if node is None:
            return (INVALID_VALUE, None, None, None)
        asked = size_t(numDependencies)
        return (
            OK,
            padded([d.handle for d in node.deps], asked, CUgraphNode),
            [CUgraphEdgeData() for _ in range(asked)],
            len(node.deps),
        )

    def cuGraphNodeGetType(self, hNode):
        node = self._graph_node(hNode)
        return (INVALID_VALUE, None) if node is None else (OK, node.type)

    def cuGraphChildGraphNodeGetGraph(self, hNode):
        node = self._graph_node(hNode)
        if node is None or node.type != T.CU_GRAPH_NODE_TYPE_GRAPH:
            return (INVALID_VALUE, None)
        return (OK, CUgraph(node.work.graph.handle))

    def cuGraphKernelNodeGetParams(self, hNode):
        node = self._graph_node(hNode)
        if node is None or node.type != T.CU_GRAPH_NODE_TYPE_KERNEL:
            return (INVALID_VALUE, None)
        return (OK, node.work.params())


MEMORY_NODES = (T.CU_GRAPH_NODE_TYPE_MEM_ALLOC, T.CU_GRAPH_NODE_TYPE_MEM_FREE)


def host_work(params: CUDA_HOST_NODE_PARAMS):
    if not isinstance(params, CUDA_HOST_NODE_PARAMS):
        raise TypeError(
            f"Argument 'nodeParams' has incorrect type (expected "
            f"cuda.bindings.driver.CUDA_HOST_NODE_PARAMS, got "
            f"{type(params).__name__})"
        )
    if not int(params.fn or 0):
        return INVALID_VALUE, None  # calling it would crash the interpreter
    return OK, HostWork(int(params.fn), int(params.userData or 0))
