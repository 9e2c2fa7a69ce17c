"""The sim's CUDA graphs, called as cuda.bindings' driver functions: explicit graphs and their
nodes, executables launched through the stream engine, per-node updates, whole-graph updates,
conditional and memory nodes. Stream capture: test_sim_graphs_capture.py; the GPU transcript:
test_sim_graphs_parity.py. (cuctx's own graph API is tested in tests/graphs.)"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from cuda.bindings import driver as d
from probe_graphs_common import NodeParams, put_twin  # (scripts/: the GPU probe's builders)

T = d.CUgraphNodeType
OK = d.CUresult.CUDA_SUCCESS
INVALID_VALUE = d.CUresult.CUDA_ERROR_INVALID_VALUE

PTX = b"""
.version 8.0
.target sm_90
.address_size 64
.visible .entry put(.param .u64 p, .param .u32 v) {
  .reg .b64 %rd<3>; .reg .b32 %r<2>;
  ld.param.u64 %rd1, [p]; ld.param.u32 %r1, [v];
  cvta.to.global.u64 %rd2, %rd1; st.global.u32 [%rd2], %r1; ret;
}
.visible .entry step(.param .u64 counter, .param .u64 handle) { ret; }
"""


class Rig:
    """A context, a kernel ``put(p, v)`` (``*p = v``), a stream and helpers, on the sim."""

    def __init__(self, backend):
        self.backend = backend
        self.drv = drv = backend.driver
        assert drv.cuInit(0) == (OK,)
        _, self.ctx = drv.cuDevicePrimaryCtxRetain(d.CUdevice(0))
        assert drv.cuCtxPushCurrent(self.ctx) == (OK,)
        _, mod = drv.cuModuleLoadData(PTX)
        _, self.fn = drv.cuModuleGetFunction(mod, b"put")
        backend.sim.set_kernel_twin(self.fn, put_twin)
        _, self.stream = drv.cuStreamCreate(1)
        self.nodes = NodeParams()

    def close(self):
        self.drv.cuCtxSynchronize()
        self.drv.cuCtxPopCurrent()

    def alloc(self, nbytes: int = 64) -> int:
        err, ptr = self.drv.cuMemAlloc(nbytes)
        assert not err
        assert self.drv.cuMemsetD8Async(ptr, 0, nbytes, 0) == (OK,)
        assert self.drv.cuCtxSynchronize() == (OK,)
        return int(ptr)

    def read(self, ptr: int, count: int = 4) -> list[int]:
        assert self.drv.cuCtxSynchronize() == (OK,)
        out = np.zeros(count, np.uint32)
        assert self.drv.cuMemcpyDtoH(out.ctypes.data, ptr, out.nbytes) == (OK,)
        return out.tolist()

    def kernel(self, ptr: int, value: int) -> d.CUDA_KERNEL_NODE_PARAMS:
        return self.nodes.kernel(self.fn, ptr, value)

    memset = staticmethod(NodeParams.memset)
    copy = staticmethod(NodeParams.copy)

    def graph(self):
        err, graph = self.drv.cuGraphCreate(0)
        assert not err
        return graph

    def add(self, graph, kind: str, *args, after=()):
        err, node = getattr(self.drv, f"cuGraphAdd{kind}Node")(
            graph, list(after), len(after), *args
        )
        assert err == OK, err
        return node

    def run(self, graph, flags: int = 0):
        err, exe = self.drv.cuGraphInstantiate(graph, flags)
        assert err == OK, err
        assert self.drv.cuGraphLaunch(exe, self.stream) == (OK,)
        assert self.drv.cuStreamSynchronize(self.stream) == (OK,)
        return exe


@pytest.fixture
def rig(sim):
    rig = Rig(sim)
    yield rig
    rig.close()


# -- explicit graphs ----------------------------------------------------------------------


def test_a_graph_runs_its_nodes_in_dependency_order_on_the_stream(rig):
    a, b = rig.alloc(), rig.alloc()
    g = rig.graph()
    fill = rig.add(g, "Memset", rig.memset(a, 5, 4), rig.ctx)
    put_ = rig.add(g, "Kernel", rig.kernel(a + 4, 9), after=[fill])
    rig.add(g, "Memcpy", rig.copy(b, a, 16), rig.ctx, after=[put_])
    rig.run(g)
    assert rig.read(b) == [5, 9, 5, 5]


def test_launches_are_asynchronous_and_ordered_with_the_streams_other_work(rig):
    a = rig.alloc()
    g = rig.graph()
    rig.add(g, "Kernel", rig.kernel(a, 1))
    _, exe = rig.drv.cuGraphInstantiate(g, 0)
    assert rig.drv.cuGraphLaunch(exe, rig.stream) == (OK,)
    assert rig.drv.cuMemsetD32Async(a, 2, 1, rig.stream) == (OK,)
    assert rig.drv.cuStreamQuery(rig.stream)[0] == d.CUresult.CUDA_ERROR_NOT_READY
    assert rig.read(a, 1) == [2]  # the memset after the launch ran after it


def test_parameters_are_copied_when_the_node_is_added(rig):
    a = rig.alloc()
    g = rig.graph()
    params = rig.kernel(a, 3)
    rig.add(g, "Kernel", params)
    ctypes.c_uint32.from_address(
        ctypes.c_void_p.from_address(params.kernelParams + 8).value
    ).value = 4
    rig.run(g)
    assert rig.read(a, 1) == [3]


def test_nodes_and_edges_come_back_as_cuda_bindings_returns_them(rig):
    g = rig.graph()
    x = rig.add(g, "Empty")
    y = rig.add(g, "Empty", after=[x])
    assert rig.drv.cuGraphGetNodes(g) == (OK, [], 2)
    err, nodes, count = rig.drv.cuGraphGetNodes(g, 3)
    assert [int(n) for n in nodes] == [int(x), int(y), 0] and count == 2
    err, src, dst, data, count = rig.drv.cuGraphGetEdges(g, 1)
    assert (int(src[0]), int(dst[0]), count) == (int(x), int(y), 1)
    assert rig.drv.cuGraphNodeGetType(y) == (OK, T.CU_GRAPH_NODE_TYPE_EMPTY)


def test_roots_and_edges_come_in_the_h100s_order(rig):
    g = rig.graph()
    x = rig.add(g, "Empty")
    y = rig.add(g, "Empty", after=[x])
    z = rig.add(g, "Empty")
    w = rig.add(g, "Empty", after=[x, z])
    assert [int(n) for n in rig.drv.cuGraphGetRootNodes(g, 2)[1]] == [int(z), int(x)]
    _, src, dst, _, _ = rig.drv.cuGraphGetEdges(g, 3)  # by source, then as added
    assert [(int(a), int(b)) for a, b in zip(src, dst)] == [
        (int(x), int(y)),
        (int(x), int(w)),
        (int(z), int(w)),
    ]


def test_child_graphs_are_cloned_when_added(rig):
    a = rig.alloc()
    child = rig.graph()
    rig.add(child, "Kernel", rig.kernel(a, 6))
    g = rig.graph()
    node = rig.add(g, "ChildGraph", child)
    rig.add(child, "Kernel", rig.kernel(a + 4, 7))  # after the clone: not in g
    err, inner = rig.drv.cuGraphChildGraphNodeGetGraph(node)
    assert rig.drv.cuGraphGetNodes(inner)[2] == 1
    assert rig.drv.cuGraphDestroy(inner) == (INVALID_VALUE,)  # the node owns it
    rig.run(g)
    assert rig.read(a, 2) == [6, 0]


def test_event_nodes_order_work_across_streams(rig):
    a = rig.alloc()
    _, event = rig.drv.cuEventCreate(0)
    g = rig.graph()
    k = rig.add(g, "Kernel", rig.kernel(a, 8))
    rig.add(g, "EventRecord", event, after=[k])
    _, exe = rig.drv.cuGraphInstantiate(g, 0)
    assert rig.drv.cuGraphLaunch(exe, rig.stream) == (OK,)
    _, other = rig.drv.cuStreamCreate(1)
    assert rig.drv.cuStreamWaitEvent(other, event, 0) == (OK,)
    out = np.zeros(1, np.uint32)
    host = rig.drv.cuMemHostAlloc(4, 0)[1]
    assert rig.drv.cuMemcpyDtoHAsync(host, a, 4, other) == (OK,)
    assert rig.drv.cuStreamSynchronize(other) == (OK,)
    ctypes.memmove(out.ctypes.data, host, 4)
    assert out.tolist() == [8]


def test_host_nodes_call_their_function(rig):
    seen = []
    callback = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(lambda data: seen.append(data))
    params = d.CUDA_HOST_NODE_PARAMS()
    params.fn = ctypes.cast(callback, ctypes.c_void_p).value
    params.userData = 42
    g = rig.graph()
    rig.add(g, "Host", params)
    rig.run(g)
    assert seen == [42]


def test_bad_handles_and_dependencies_are_invalid_values(rig):
    g, other = rig.graph(), rig.graph()
    foreign = rig.add(other, "Empty")
    assert rig.drv.cuGraphAddEmptyNode(g, [foreign], 1) == (INVALID_VALUE, None)
    x = rig.add(g, "Empty")
    assert rig.drv.cuGraphAddEmptyNode(g, [x, x], 2) == (INVALID_VALUE, None)
    with pytest.raises(RuntimeError):
        rig.drv.cuGraphAddEmptyNode(g, [x], 2)
    assert rig.drv.cuGraphAddEmptyNode(d.CUgraph(0), None, 0) == (INVALID_VALUE, None)
    assert rig.drv.cuGraphLaunch(d.CUgraphExec(0), rig.stream) == (INVALID_VALUE,)
    assert rig.drv.cuGraphAddMemsetNode(g, None, 0, rig.memset(12345, 0, 4), rig.ctx) == (
        INVALID_VALUE,
        None,
    )
    assert rig.drv.cuGraphDestroy(g) == (OK,)
    assert rig.drv.cuGraphDestroy(g) == (INVALID_VALUE,)
    assert rig.drv.cuGraphNodeGetType(x) == (INVALID_VALUE, None)


# -- executables --------------------------------------------------------------------------


def test_set_params_and_disabled_nodes_change_later_launches_only(rig):
    a = rig.alloc()
    g = rig.graph()
    k = rig.add(g, "Kernel", rig.kernel(a, 1))
    m = rig.add(g, "Memset", rig.memset(a + 4, 2, 1), rig.ctx, after=[k])
    e = rig.add(g, "Empty", after=[m])
    _, exe = rig.drv.cuGraphInstantiate(g, 0)
    assert rig.drv.cuGraphLaunch(exe, rig.stream) == (OK,)
    assert rig.drv.cuGraphExecKernelNodeSetParams(exe, k, rig.kernel(a, 10)) == (OK,)
    assert rig.drv.cuGraphNodeSetEnabled(exe, m, 0) == (OK,)
    assert rig.drv.cuGraphNodeSetEnabled(exe, e, 0) == (INVALID_VALUE,)  # kernel, memset,
    assert rig.drv.cuGraphNodeGetEnabled(exe, e) == (INVALID_VALUE, None)  # memcpy only
    assert rig.drv.cuGraphNodeGetEnabled(exe, m) == (OK, 0)
    assert rig.read(a, 2) == [1, 2]  # the queued launch kept its parameters
    assert rig.drv.cuMemsetD32Async(a, 0, 2, rig.stream) == (OK,)
    assert rig.drv.cuGraphLaunch(exe, rig.stream) == (OK,)
    assert rig.read(a, 2) == [10, 0]


def test_memset_set_params_keep_the_shape(rig):
    a = rig.alloc()
    g = rig.graph()
    m = rig.add(g, "Memset", rig.memset(a, 2, 4), rig.ctx)
    _, exe = rig.drv.cuGraphInstantiate(g, 0)
    assert rig.drv.cuGraphExecMemsetNodeSetParams(exe, m, rig.memset(a, 3, 8), rig.ctx) == (
        OK,
    )  # a wider 1D memset fits (H100)
    assert rig.drv.cuGraphExecMemsetNodeSetParams(exe, m, rig.memset(a + 16, 3, 4), rig.ctx) == (
        OK,
    )
    assert rig.drv.cuGraphExecMemsetNodeSetParams(
        exe, m, rig.memset(a, 3, 2, height=2, pitch=16), rig.ctx
    ) == (INVALID_VALUE,)
    assert rig.drv.cuGraphLaunch(exe, rig.stream) == (OK,)
    assert rig.read(a, 8) == [0, 0, 0, 0, 3, 3, 3, 3]


# -- whole-graph updates ------------------------------------------------------------------

UPDATE = d.CUgraphExecUpdateResult
R = d.CUresult


def test_an_update_with_the_same_structure_takes_the_new_parameters(rig):
    drv = rig.drv
    a, b = rig.alloc(), rig.alloc()

    def build(ptr, value):
        g = rig.graph()
        k = rig.add(g, "Kernel", rig.kernel(ptr, value))
        rig.add(g, "Memset", rig.memset(ptr + 4, value, 3), rig.ctx, after=[k])
        return g

    exe = rig.run(build(a, 1))
    err, info = drv.cuGraphExecUpdate(exe, build(b, 2))
    assert (err, info.result) == (OK, UPDATE.CU_GRAPH_EXEC_UPDATE_SUCCESS)
    assert drv.cuGraphLaunch(exe, rig.stream) == (OK,)
    assert rig.read(b) == [2, 2, 2, 2] and rig.read(a) == [1, 1, 1, 1]


def test_a_refused_update_changes_nothing_and_comes_back_without_result_info(rig):
    drv = rig.drv
    a = rig.alloc()
    g = rig.graph()
    rig.add(g, "Memset", rig.memset(a, 1, 4), rig.ctx)
    _, exe = drv.cuGraphInstantiate(g, 0)
    two = rig.graph()
    rig.add(two, "Memset", rig.memset(a, 1, 4), rig.ctx)
    rig.add(two, "Empty")
    other = rig.graph()
    rig.add(other, "Kernel", rig.kernel(a, 1))
    shape = rig.graph()
    rig.add(shape, "Memset", rig.memset(a, 1, 2, height=2, pitch=16), rig.ctx)
    for graph in (two, other, shape):  # cuda.bindings gives the info only on success (H100)
        assert drv.cuGraphExecUpdate(exe, graph) == (R.CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE, None)
    assert drv.cuGraphExecUpdate(exe, d.CUgraph(0)) == (INVALID_VALUE, None)
    assert drv.cuGraphLaunch(exe, rig.stream) == (OK,)  # unchanged by the refusals
    assert rig.read(a) == [1, 1, 1, 1]


# -- conditional nodes, memory nodes, dot files -------------------------------------------

COND = d.CUgraphConditionalNodeType


def conditional(rig, graph, kind, size: int = 1, default: int = 0, flags: int = 0, after=()):
    err, handle = rig.drv.cuGraphConditionalHandleCreate(graph, rig.ctx, default, flags)
    assert err == OK
    params = d.CUgraphNodeParams()
    params.type = T.CU_GRAPH_NODE_TYPE_CONDITIONAL
    params.conditional.handle, params.conditional.type = handle, kind
    params.conditional.size, params.conditional.ctx = size, rig.ctx
    err, node = rig.drv.cuGraphAddNode(graph, list(after), None, len(after), params)
    assert err == OK, err
    return handle, params.conditional.phGraph_out


def stepper(rig):
    """A kernel ``step(counter, handle)`` whose twin decrements *counter and sets the
    condition to whether it is still above zero (as cudaGraphSetConditional would)."""
    _, mod = rig.drv.cuModuleLoadData(PTX)
    _, fn = rig.drv.cuModuleGetFunction(mod, b"step")

    def step(grid, block, counter, handle: int):
        view = counter.view(np.uint32, 1)
        view[0] -= 1
        rig.backend.sim.set_conditional(handle, int(view[0] > 0))

    rig.backend.sim.set_kernel_twin(fn, step)
    return fn


def test_a_while_node_runs_its_body_while_a_kernel_keeps_the_condition_set(rig):
    drv = rig.drv
    counter, out = rig.alloc(), rig.alloc()
    fn = stepper(rig)
    g = rig.graph()
    handle, bodies = conditional(
        rig, g, COND.CU_GRAPH_COND_TYPE_WHILE, default=1, flags=d.CU_GRAPH_COND_ASSIGN_DEFAULT
    )
    body = bodies[0]
    values = (ctypes.c_uint64 * 2)(counter, int(handle))
    array = (ctypes.c_void_p * 2)(ctypes.addressof(values), ctypes.addressof(values) + 8)
    params = rig.kernel(0, 0)
    params.func, params.kernelParams = fn, ctypes.addressof(array)
    k = rig.add(body, "Kernel", params)
    rig.add(body, "Memset", rig.memset(out, 9, 1), rig.ctx, after=[k])
    assert drv.cuMemsetD32Async(counter, 3, 1, rig.stream) == (OK,)
    rig.run(g)
    assert rig.read(counter, 1) == [0] and rig.read(out, 1) == [9]


def test_an_if_node_runs_its_else_body_when_the_condition_is_zero(rig):
    a = rig.alloc()
    g = rig.graph()
    _, bodies = conditional(
        rig, g, COND.CU_GRAPH_COND_TYPE_IF, size=2, default=0, flags=d.CU_GRAPH_COND_ASSIGN_DEFAULT
    )
    rig.add(bodies[0], "Memset", rig.memset(a, 1, 1), rig.ctx)
    rig.add(bodies[1], "Memset", rig.memset(a + 4, 2, 1), rig.ctx)
    rig.run(g)
    assert rig.read(a, 2) == [0, 2]


@pytest.mark.parametrize("value, expect", [(0, [1, 0, 0]), (2, [0, 0, 3]), (3, [0, 0, 0])])
def test_a_switch_node_runs_the_body_its_value_names_and_none_past_the_last(rig, value, expect):
    a = rig.alloc()
    g = rig.graph()
    _, bodies = conditional(
        rig,
        g,
        COND.CU_GRAPH_COND_TYPE_SWITCH,
        size=3,
        default=value,
        flags=d.CU_GRAPH_COND_ASSIGN_DEFAULT,
    )
    assert len(bodies) == 3
    for i, body in enumerate(bodies):
        rig.add(body, "Memset", rig.memset(a + 4 * i, i + 1, 1), rig.ctx)
    rig.run(g)
    assert rig.read(a, 3) == expect


@pytest.mark.parametrize(
    "kind, size",
    [
        (COND.CU_GRAPH_COND_TYPE_SWITCH, 0),
        (COND.CU_GRAPH_COND_TYPE_IF, 3),
        (COND.CU_GRAPH_COND_TYPE_WHILE, 2),
    ],
)
def test_a_conditional_of_a_size_its_type_does_not_take_is_refused(rig, kind, size):
    g = rig.graph()
    _, handle = rig.drv.cuGraphConditionalHandleCreate(g, rig.ctx, 0, 0)
    params = d.CUgraphNodeParams()
    params.type = T.CU_GRAPH_NODE_TYPE_CONDITIONAL
    params.conditional.handle, params.conditional.type = handle, kind
    params.conditional.size, params.conditional.ctx = size, rig.ctx
    assert rig.drv.cuGraphAddNode(g, None, None, 0, params) == (INVALID_VALUE, None)


def test_a_kernel_added_first_sets_the_handle_which_drives_one_node_only(rig):
    """The handle is made before its node; a kernel ahead of it sets it (through its twin,
    as cudaGraphSetConditional would), and the node reads the value. A second node with the
    same handle is refused (H100: tests/driver/graphs_transcript.json)."""
    a, counter = rig.alloc(), rig.alloc()
    fn = stepper(rig)  # counter 2 -> 1: sets the condition to 1
    g = rig.graph()
    _, handle = rig.drv.cuGraphConditionalHandleCreate(g, rig.ctx, 0, 0)
    values = (ctypes.c_uint64 * 2)(counter, int(handle))
    array = (ctypes.c_void_p * 2)(ctypes.addressof(values), ctypes.addressof(values) + 8)
    params = rig.kernel(0, 0)
    params.func, params.kernelParams = fn, ctypes.addressof(array)
    k = rig.add(g, "Kernel", params)
    answers = []
    for _ in range(2):
        node = d.CUgraphNodeParams()
        node.type = T.CU_GRAPH_NODE_TYPE_CONDITIONAL
        node.conditional.handle, node.conditional.type = handle, COND.CU_GRAPH_COND_TYPE_IF
        node.conditional.size, node.conditional.ctx = 1, rig.ctx
        err, _ = rig.drv.cuGraphAddNode(g, [k], None, 1, node)
        answers.append(err)
        if not err:
            rig.add(node.conditional.phGraph_out[0], "Memset", rig.memset(a, 5, 1), rig.ctx)
    assert answers == [OK, INVALID_VALUE] and rig.drv.cuGraphGetNodes(g)[2] == 2
    assert rig.drv.cuMemsetD32Async(counter, 2, 1, rig.stream) == (OK,)
    rig.run(g)
    assert rig.read(a, 1) == [5] and rig.read(counter, 1) == [1]


def test_a_host_node_in_a_body_is_added_but_refused_at_instantiation(rig):
    g = rig.graph()
    _, bodies = conditional(rig, g, COND.CU_GRAPH_COND_TYPE_IF)
    callback = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(lambda data: None)
    params = d.CUDA_HOST_NODE_PARAMS()
    params.fn = ctypes.cast(callback, ctypes.c_void_p).value
    assert rig.drv.cuGraphAddHostNode(bodies[0], None, 0, params)[0] == OK  # as the H100
    assert rig.drv.cuGraphInstantiate(g, 0) == (INVALID_VALUE, None)  # not a body's kind


def test_a_graph_with_a_conditional_node_is_refused_as_a_child(rig):
    g = rig.graph()
    conditional(rig, g, COND.CU_GRAPH_COND_TYPE_IF)
    assert rig.drv.cuGraphAddChildGraphNode(rig.graph(), None, 0, g) == (
        d.CUresult.CUDA_ERROR_NOT_SUPPORTED,
        None,
    )  # an H100, driver 580


def test_the_per_node_calls_of_an_executable_take_the_nodes_of_bodies(rig):
    a = rig.alloc()
    g = rig.graph()
    _, bodies = conditional(
        rig, g, COND.CU_GRAPH_COND_TYPE_IF, default=1, flags=d.CU_GRAPH_COND_ASSIGN_DEFAULT
    )
    k = rig.add(bodies[0], "Kernel", rig.kernel(a, 1))
    m = rig.add(bodies[0], "Memset", rig.memset(a + 4, 2, 1), rig.ctx)
    _, inner = conditional(
        rig, bodies[0], COND.CU_GRAPH_COND_TYPE_IF, default=1, flags=d.CU_GRAPH_COND_ASSIGN_DEFAULT
    )
    deep = rig.add(inner[0], "Memset", rig.memset(a + 8, 3, 1), rig.ctx)
    exe = rig.run(g)
    assert rig.read(a, 3) == [1, 2, 3]
    drv = rig.drv
    assert drv.cuGraphExecKernelNodeSetParams(exe, k, rig.kernel(a, 10)) == (OK,)
    assert drv.cuGraphExecMemsetNodeSetParams(exe, m, rig.memset(a + 4, 20, 1), rig.ctx) == (OK,)
    assert drv.cuGraphNodeSetEnabled(exe, deep, 0) == (OK,)
    assert drv.cuMemsetD32Async(a, 0, 3, rig.stream) == (OK,)
    assert drv.cuGraphLaunch(exe, rig.stream) == (OK,)
    assert rig.read(a, 3) == [10, 20, 0]


def test_a_while_node_that_never_ends_is_stopped_and_named(rig):
    """Where a GPU would loop for ever the sim stops after MAX_ROUNDS rounds, failing the
    launch as a watchdog would, and says which node it stopped (by the name cuctx gave)."""
    from cuctx._driver.sim._graph_conditional import MAX_ROUNDS

    sim, drv = rig.backend.sim, rig.drv
    g = rig.graph()
    handle, bodies = conditional(
        rig, g, COND.CU_GRAPH_COND_TYPE_WHILE, default=1, flags=d.CU_GRAPH_COND_ASSIGN_DEFAULT
    )
    node = drv.cuGraphGetNodes(g, 1)[1][0]
    assert sim.name_node(node, "the loop at my.py:3") == (OK,)
    empty = rig.add(bodies[0], "Empty")
    assert sim.name_node(empty, "not a conditional node") == (INVALID_VALUE,)
    _, exe = drv.cuGraphInstantiate(g, 0)
    assert drv.cuGraphLaunch(exe, rig.stream) == (OK,)
    assert drv.cuStreamSynchronize(rig.stream) == (d.CUresult.CUDA_ERROR_LAUNCH_TIMEOUT,)
    _, cause, text = sim.fault_cause(rig.ctx)
    assert cause is None
    assert text.startswith(f"the sim stopped the loop at my.py:3 after {MAX_ROUNDS} rounds")


def test_an_unused_conditional_handle_fails_instantiation(rig):
    g = rig.graph()
    assert rig.drv.cuGraphConditionalHandleCreate(g, rig.ctx, 0, 0)[0] == OK
    assert rig.drv.cuGraphInstantiate(g, 0) == (INVALID_VALUE, None)


def test_explicit_memory_nodes_and_relaunching_an_unfreed_allocation(rig):
    drv = rig.drv
    params = d.CUDA_MEM_ALLOC_NODE_PARAMS()
    params.poolProps.allocType = d.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    params.poolProps.location.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    params.poolProps.location.id = 0
    params.bytesize = 64
    g = rig.graph()
    alloc = rig.add(g, "MemAlloc", params)
    ptr = int(params.dptr)
    rig.add(g, "Memset", rig.memset(ptr, 5, 16), rig.ctx, after=[alloc])
    exe = rig.run(g)
    assert rig.read(ptr, 2) == [5, 5]  # not freed in the graph: usable after it
    assert drv.cuGraphLaunch(exe, rig.stream) == (INVALID_VALUE,)  # still unfreed
    assert drv.cuMemFreeAsync(ptr, rig.stream) == (OK,)
    assert drv.cuGraphLaunch(exe, rig.stream) == (OK,)
    assert drv.cuStreamSynchronize(rig.stream) == (OK,)
    drv.cuGraphExecDestroy(exe)
    rig.run(g, flags=d.CUgraphInstantiate_flags.CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH)
    assert drv.cuGraphAddChildGraphNode(rig.graph(), None, 0, g) == (
        d.CUresult.CUDA_ERROR_NOT_SUPPORTED,
        None,
    )  # memory nodes stay at the top (H100)
    free = rig.graph()
    rig.add(free, "MemFree", ptr)
    assert drv.cuGraphAddMemFreeNode(free, None, 0, ptr) == (INVALID_VALUE, None)  # twice


def test_a_dot_file_describes_the_graph(rig, tmp_path):
    a = rig.alloc()
    g = rig.graph()
    k = rig.add(g, "Kernel", rig.kernel(a, 1))
    rig.add(g, "Memset", rig.memset(a, 1, 1), rig.ctx, after=[k])
    path = tmp_path / "g.dot"
    assert rig.drv.cuGraphDebugDotPrint(g, str(path).encode(), 0) == (OK,)
    text = path.read_text()
    assert "KERNEL" in text and "put" in text and "MEMSET" in text and "n0 -> n1" in text
