"""Conditional nodes of the sim: cuGraphConditionalHandleCreate and cuGraphAddNode with
CU_GRAPH_NODE_TYPE_CONDITIONAL (IF with one or two bodies, WHILE with one, SWITCH with
``size``), whose body graphs the driver creates and hands back in the caller's
``conditional.phGraph_out`` (an array the node owns, as in the driver).

A condition's value is set by a kernel: on a GPU with ``cudaGraphSetConditional(handle,
value)``; in the sim, the kernel's twin (which receives the handle as its 8-byte argument)
calls ``cuctx.backend().sim.set_conditional(handle, value)`` (`SimControls`). A handle
created with CU_GRAPH_COND_ASSIGN_DEFAULT takes its default value at the start of each
launch of a graph that uses it, in stream order; without it, it keeps its last value. A
handle drives one conditional node: adding a second node with it is
CUDA_ERROR_INVALID_VALUE (H100), as is a handle of a graph the node's graph does not lie in.

A conditional node runs as one operation of the launch: when it runs, it reads the value
and runs the chosen body's nodes inline, in a dependency order, adding their cost to the
operation's. The body of a WHILE runs again while the value is non-zero; where a GPU would
loop for ever, the sim stops after `MAX_ROUNDS` rounds: the launch fails with the sticky
CUDA_ERROR_LAUNCH_TIMEOUT (as a display GPU's watchdog stops a kernel that hangs), and
``fault_cause`` names the node (by the name cuctx gave it, `SimControls.name_node`).

Bodies may hold kernel, memcpy, memset, empty, child graph and conditional nodes (the
documented list, recursively): the driver accepts any node when it is added to a body (the
H100 adds a host node), and cuGraphInstantiate refuses a graph whose bodies hold another
kind with CUDA_ERROR_INVALID_VALUE, as it refuses a handle no conditional node of the graph
uses. The nodes of bodies are the executable's too: the per-node calls
(cuGraphExec*NodeSetParams, cuGraphNodeSetEnabled) take them (`SimGraphExec.index`).
"""

from __future__ import annotations

import ctypes
import itertools

from cuda.bindings.driver import (
    CU_GRAPH_COND_ASSIGN_DEFAULT,
    CUgraphConditionalHandle,
    CUgraphConditionalNodeType,
    CUgraphNodeParams,
    CUgraphNodeType,
    CUresult,
)

from ._cargs import size_t, unsigned
from ._common import INVALID_VALUE, NOT_INITIALIZED, NOT_SUPPORTED, OK
from ._graph_nodes import ChildWork, EmptyWork
from ._graphs import order
from ._timing import LAUNCH_NS
from ._twins import remember_fault

T = CUgraphNodeType
C = CUgraphConditionalNodeType
MAX_ROUNDS = 1 << 16  # of a WHILE node's body in one run: docs/graphs.md says so too
LAUNCH_TIMEOUT = CUresult.CUDA_ERROR_LAUNCH_TIMEOUT
_OUT_OFFSET = 16  # of phGraph_out in CUDA_CONDITIONAL_NODE_PARAMS (handle, type, size, ...)
# What a conditional node's body may hold.
BODY_TYPES = (
    T.CU_GRAPH_NODE_TYPE_KERNEL,
    T.CU_GRAPH_NODE_TYPE_MEMCPY,
    T.CU_GRAPH_NODE_TYPE_MEMSET,
    T.CU_GRAPH_NODE_TYPE_EMPTY,
    T.CU_GRAPH_NODE_TYPE_GRAPH,
    T.CU_GRAPH_NODE_TYPE_CONDITIONAL,
)


class SimCondition:
    __slots__ = ("handle", "graph", "ctx", "default", "assign", "value", "node")

    def __init__(self, handle: int, graph, ctx, default: int, assign: bool):
        self.handle = handle
        self.graph = graph  # the graph it was created for
        self.ctx = ctx
        self.default = default
        self.assign = assign  # CU_GRAPH_COND_ASSIGN_DEFAULT: reset at each launch
        self.value = default
        self.node = None  # the conditional node it drives, once added


class CondWork:
    type = T.CU_GRAPH_NODE_TYPE_CONDITIONAL
    __slots__ = ("kind", "condition", "bodies", "ctx", "out", "name")

    def __init__(self, kind, condition: SimCondition, bodies: list, ctx, name: str = ""):
        self.kind = kind
        self.condition = condition
        self.bodies = bodies
        self.ctx = ctx
        self.out = None  # the phGraph_out array handed to the caller
        self.name = name  # for messages (SimControls.name_node)

    def with_bodies(self, bodies: list) -> CondWork:
        return CondWork(self.kind, self.condition, bodies, self.ctx, self.name)

    def label(self) -> str:
        return f"conditional node ({self.kind.name.removeprefix('CU_GRAPH_COND_TYPE_')})"


class ConditionalModel:
    """cuGraphConditionalHandleCreate, cuGraphAddNode (conditional and empty nodes), and
    running conditional nodes."""

    def _init_conditionals(self):
        self._condition_handles = itertools.count(0xC0_0000_0001)
        self._conditions: dict[int, SimCondition] = {}

    def cuGraphConditionalHandleCreate(self, hGraph, ctx, defaultLaunchValue, flags):
        default = unsigned(defaultLaunchValue, 32, "unsigned int")
        flags = unsigned(flags, 32, "unsigned int")
        if not self._initialized:
            return (NOT_INITIALIZED, None)
        with self._lock:
            graph, target = self._graph(hGraph), self._lookup(ctx)
            if graph is None or target is None or flags & ~CU_GRAPH_COND_ASSIGN_DEFAULT:
                return (INVALID_VALUE, None)
            err, target = self._work_context(target)
            if err:
                return (err, None)
            condition = SimCondition(
                next(self._condition_handles),
                graph,
                target,
                default,
                bool(flags & CU_GRAPH_COND_ASSIGN_DEFAULT),
            )
            self._conditions[condition.handle] = condition
        return (OK, CUgraphConditionalHandle(condition.handle))

    def cuGraphAddNode(self, hGraph, dependencies, dependencyData, numDependencies, nodeParams):
        if not isinstance(nodeParams, CUgraphNodeParams):
            raise TypeError(
                f"Argument 'nodeParams' has incorrect type (expected "
                f"cuda.bindings.driver.CUgraphNodeParams, got "
                f"{type(nodeParams).__name__})"
            )
        if any(
            int(e.type) or int(e.from_port) or int(e.to_port)
            for e in list(dependencyData or [])[: size_t(numDependencies)]
        ):
            return (NOT_SUPPORTED, None)  # the sim has default edges only
        kind = nodeParams.type
        if kind == T.CU_GRAPH_NODE_TYPE_EMPTY:
            return self._add_node(hGraph, dependencies, numDependencies, lambda: (OK, EmptyWork()))
        if kind != T.CU_GRAPH_NODE_TYPE_CONDITIONAL:
            return (NOT_SUPPORTED, None)  # the sim makes other nodes by their own functions
        params = nodeParams.conditional
        made = []

        def make():
            condition = self._conditions.get(int(params.handle))
            graph = self._graph(hGraph)
            size = int(params.size)
            fits = {
                C.CU_GRAPH_COND_TYPE_IF: size in (1, 2),
                C.CU_GRAPH_COND_TYPE_WHILE: size == 1,
                C.CU_GRAPH_COND_TYPE_SWITCH: size >= 1,
            }
            if (
                condition is None
                or condition.node is not None
                or not fits.get(params.type, False)
                or not _within(graph, condition.graph)
                or (int(params.ctx) and int(params.ctx) != condition.ctx.handle)
            ):
                return INVALID_VALUE, None
            work = CondWork(params.type, condition, [], condition.ctx)
            made.append(work)
            return OK, work

        err, handle = self._add_node(hGraph, dependencies, numDependencies, make)
        if err:
            return (err, None)
        node, work = self._graph_node(handle), made[0]
        work.condition.node = node
        work.bodies = [self._new_graph(node) for _ in range(int(params.size))]
        work.out = (ctypes.c_void_p * len(work.bodies))(*[b.handle for b in work.bodies])
        ctypes.c_void_p.from_address(params.getPtr() + _OUT_OFFSET).value = ctypes.addressof(
            work.out
        )
        return (OK, handle)

    # -- instantiation and launches ----------------------------------------------------------

    def _check_instantiable(self, graph):
        conditionals = [n.work for n in graph.walk() if isinstance(n.work, CondWork)]
        used = {id(work.condition) for work in conditionals}
        if any(c.graph is graph and id(c) not in used for c in self._conditions.values()):
            return INVALID_VALUE  # CUDA_GRAPH_INSTANTIATE_CONDITIONAL_HANDLE_UNUSED
        if any(
            n.type not in BODY_TYPES
            for work in conditionals
            for body in work.bodies
            for n in body.walk()
        ):
            return INVALID_VALUE
        return super()._check_instantiable(graph)

    def _launch_graph(self, exe, stream):
        conditions = {
            id(n.work.condition): n.work.condition
            for n in exe.graph.walk()
            if isinstance(n.work, CondWork) and n.work.condition.assign
        }
        if conditions:

            def assign():
                for condition in conditions.values():
                    condition.value = condition.default

            self._push(stream, assign, 0, "conditional defaults")
        return super()._launch_graph(exe, stream)

    def _conditional_op(self, exe, work: CondWork, stream):
        """The operation of a conditional node of ``exe`` launched on ``stream``."""

        def run():
            condition = work.condition
            if work.kind == C.CU_GRAPH_COND_TYPE_WHILE:
                for _ in range(MAX_ROUNDS):
                    if not condition.value:
                        return None
                    err = self._run_inline(exe, work.bodies[0], stream)
                    if err:
                        return err
                remember_fault(stream.ctx, None, _stopped(work))
                return LAUNCH_TIMEOUT
            if work.kind == C.CU_GRAPH_COND_TYPE_IF:
                index = 0 if condition.value else 1
            else:
                index = condition.value
            if index < len(work.bodies):
                return self._run_inline(exe, work.bodies[index], stream)
            return None

        return run

    def _run_inline(self, exe, graph, stream):
        """Run ``graph``'s nodes now, inside the running operation, adding their cost."""
        for node in order(graph.nodes):
            if id(node) in exe.disabled:
                continue
            work = node.work
            if isinstance(work, ChildWork):
                err = self._run_inline(exe, work.graph, stream)
            elif isinstance(work, CondWork):
                err = self._conditional_op(exe, work, stream)()
                stream.running.cost += LAUNCH_NS
            else:
                fn = work.op(self)
                err = fn() if fn is not None else None
                stream.running.cost += work.cost()
            if err:
                return err
        return None


def _stopped(work: CondWork) -> str:
    """The sentence for a WHILE node the sim stopped."""
    node = work.name or f"a WHILE conditional node (condition {work.condition.handle:#x})"
    return (
        f"the sim stopped {node} after {MAX_ROUNDS} rounds with its condition still "
        "non-zero, where a GPU would loop for ever: a kernel must set the condition to 0 "
        "(cudaGraphSetConditional(handle, 0)) for the loop to end"
    )


def _within(graph, home) -> bool:
    """Whether ``graph`` is ``home`` or lies inside it (child graphs, bodies)."""
    while graph is not None:
        if graph is home:
            return True
        graph = graph.owner.graph if graph.owner is not None else None
    return False
