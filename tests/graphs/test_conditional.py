"""Conditional nodes: "if", "if_else", "while" and "switch" nodes run their bodies by a
condition a kernel sets; conditions are checked where they are made and used. What CUDA
refuses around them is refused where the user adds it, naming the body, the node and what to
do: a node a body cannot run (a host node, event nodes), a conditional node in a child
graph, a made-up number where a kernel takes a condition, a second node driven by one
condition. The nodes of bodies can be updated
in an executable. A "while" node that never ends stops on the sim at a documented cap,
naming the node. Sim and GPU (the cap: the sim alone; a GPU would loop for ever)."""

from __future__ import annotations

import ctypes
import linecache
import re

import numpy as np
import pytest
from cuda.bindings import driver as d

import cuctx
from cuctx import Context, StickyFaultError

from scenarios import ADD_SOURCE, SRC, add, library_fixture, run_graph as run

pytestmark = [pytest.mark.usefixtures("nvrtc_cache"), pytest.mark.paths("python", "native")]

lib = library_fixture(ADD_SOURCE, add=add)
N = 8


def arange(n: int = N) -> cuctx.DeviceArray:
    return cuctx.to_device(np.arange(n, dtype=np.float32))


def has_conditionals(backend, version: int = 12040) -> None:
    """Skip on a driver older than ``version``: conditional nodes came with CUDA 12.4,
    "if_else" and "switch" nodes with 12.8."""
    if backend.driver.cuDriverGetVersion()[1] < version:
        pytest.skip(
            f"the driver lacks these conditional nodes (CUDA {version // 1000}."
            f"{version % 1000 // 10}+)"
        )


def test_an_if_node_runs_its_body_by_its_default_condition(lib, backend):
    has_conditionals(backend)
    x, out = arange(), cuctx.zeros(N, np.float32)
    g = cuctx.Graph()
    taken = g.conditional("if", default=True)
    skipped = g.conditional("if", default=False)
    assert isinstance(taken.body, cuctx.Graph) and taken.bodies == (taken.body,)
    assert taken.condition.default == 1 and "True" not in repr(taken.condition)
    taken.body.launch(lib["add"], 1, N, out, out, 1.0, N)
    skipped.body.launch(lib["add"], 1, N, out, x, 100.0, N)
    run(g, times=2)
    assert out.to_host().tolist() == [2.0] * N
    assert "2 conditional" in repr(g) and "conditional if" in taken.description


# Kernels that set a condition, in CUDA C as a user writes them: cuctx declares
# cudaGraphSetConditional for NVRTC. On the sim the twins below do the same steps.
SETTER_SOURCE = r"""
extern "C" __global__ void set_condition(cudaGraphConditionalHandle handle,
                                         unsigned int value) {
    cudaGraphSetConditional(handle, value);
}
extern "C" __global__ void countdown(unsigned int* counter, float* out,
                                     cudaGraphConditionalHandle handle) {
    out[*counter] = (float)*counter;
    *counter -= 1;
    cudaGraphSetConditional(handle, *counter > 0);
}
extern "C" __global__ void put(float* out, float value) { *out = value; }
"""


def set_condition_twin(grid, block, handle, value):
    cuctx.backend().sim.set_conditional(handle, value)


def countdown_twin(grid, block, counter, out, handle):
    c = counter.view(np.uint32, 1)
    out.view(np.float32, N)[c[0]] = float(c[0])
    c[0] -= 1
    cuctx.backend().sim.set_conditional(handle, int(c[0] > 0))


def put_twin(grid, block, out, value):
    out.view(np.float32, 1)[0] = value


@pytest.fixture
def setters(backend) -> cuctx.Library:
    """SETTER_SOURCE compiled by NVRTC alone, on both backends (no nvcc, no cudadevrt)."""
    has_conditionals(backend)
    return cuctx.Library.from_source(
        SETTER_SOURCE,
        sim_kernels={
            "set_condition": set_condition_twin,
            "countdown": countdown_twin,
            "put": put_twin,
        },
    )


def test_a_while_node_runs_its_body_until_a_kernel_clears_the_condition(setters):
    counter = cuctx.to_device(np.array([5], np.uint32))
    out = cuctx.zeros(N, np.float32)
    g = cuctx.Graph()
    loop = g.conditional("while", default=True)
    loop.body.launch(setters["countdown"], 1, 1, counter, out, loop.condition)
    run(g)
    assert counter.to_host().tolist() == [0]  # the body ran 5 times, then the kernel stopped it
    assert out.to_host().tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 0.0, 0.0]


def test_a_kernel_added_before_an_if_else_node_picks_its_body(setters, backend):
    has_conditionals(backend, 12080)
    out = cuctx.zeros(2, np.float32)
    g = cuctx.Graph()
    condition = g.condition()  # made first, so that the kernel setting it comes first
    setter = g.launch(setters["set_condition"], 1, 1, condition, 1)
    branch = g.conditional("if_else", condition=condition, after=setter)
    then, otherwise = branch.bodies
    then.launch(setters["put"], 1, 1, out[0:1], 1.0)
    otherwise.launch(setters["put"], 1, 1, out[1:2], 2.0)
    assert branch.condition == condition and condition.node is branch
    exe = g.instantiate()
    exe.launch()
    assert out.to_host().tolist() == [1.0, 0.0]
    out.fill(0.0)
    exe.update_node(setter, condition, 0)  # the kernel now sets it to zero: the else body
    exe.launch()
    assert out.to_host().tolist() == [0.0, 2.0]


def test_a_switch_runs_the_body_its_condition_names(setters, backend):
    has_conditionals(backend, 12080)
    out = cuctx.zeros(3, np.float32)
    g = cuctx.Graph()
    condition = g.condition()
    setter = g.launch(setters["set_condition"], 1, 1, condition, 0)
    switch = g.conditional("switch", condition=condition, cases=3, after=setter)
    assert len(switch.bodies) == 3 and "cases=3" in switch.description
    for i, body in enumerate(switch.bodies):
        body.launch(setters["put"], 1, 1, out[i : i + 1], 10.0 + i)
    exe = g.instantiate()
    for value, expect in ((0, [10.0, 0, 0]), (2, [0, 0, 12.0]), (3, [0, 0, 0])):  # 3: none
        out.fill(0.0)
        exe.update_node(setter, condition, value)
        exe.launch()
        assert out.to_host().tolist() == expect, value
    by_default = cuctx.Graph()  # a default picks the body at every launch
    node = by_default.conditional("switch", default=np.uint32(1), cases=2)
    for i, body in enumerate(node.bodies):
        body.launch(setters["put"], 1, 1, out[i : i + 1], 20.0 + i)
    out.fill(0.0)
    run(by_default)
    assert out.to_host().tolist() == [0.0, 21.0, 0.0]


def test_conditional_arguments_are_checked(backend):
    has_conditionals(backend, 12080)
    g, other = cuctx.Graph(), cuctx.Graph()
    for kwargs, error, words in [
        (dict(kind="else"), ValueError, "'if', 'if_else', 'while', 'switch'"),
        (dict(kind="switch"), ValueError, "needs cases=n"),
        (dict(kind="switch", cases=0), ValueError, "needs cases=n"),
        (dict(kind="switch", cases=True), ValueError, "needs cases=n"),
        (dict(kind="if", cases=2), ValueError, "cases= is for 'switch'"),
        (dict(kind="if", default="yes"), TypeError, "a bool or an int"),
        (dict(kind="if", default=1.0), TypeError, "a bool or an int"),
        (dict(kind="while", default=-1), ValueError, "unsigned 32-bit"),
        (dict(kind="switch", cases=2, default=2**32), ValueError, "unsigned 32-bit"),
        (dict(kind="if", condition=7), TypeError, "what Graph.condition() returns"),
        (
            dict(kind="if", condition=other.condition(), default=1),
            ValueError,
            "the default is the condition's",
        ),
        (dict(kind="if", condition=other.condition()), ValueError, "of another graph"),
    ]:
        with pytest.raises(error, match=re.escape(words)):
            g.conditional(**kwargs)
    with pytest.raises(TypeError, match="a bool or an int"):
        g.condition(default="1")
    outer = g.conditional("if_else", default=False)
    with pytest.raises(AttributeError, match="node.bodies"):
        assert outer.body is None  # raises first: it has two bodies
    top = g.condition(default=True)  # a body's node may take a condition of the graph above
    inner = outer.bodies[0].conditional("if", condition=top)
    with pytest.raises(ValueError, match="of another graph"):  # not the other way round
        g.conditional("if", condition=outer.bodies[0].condition())
    assert inner.condition is top and top.node is inner
    with pytest.raises(AttributeError, match="not a conditional"):
        assert g.empty().bodies is None  # raises first


def test_a_condition_drives_one_node(backend):
    """CUDA lets a condition drive one conditional node (an H100 refuses a second
    cuGraphAddNode with the same handle, CUDA_ERROR_INVALID_VALUE): cuctx refuses it where
    it is added, in the graph or in a body, naming the node the condition drives."""
    has_conditionals(backend)
    out = cuctx.zeros(2, np.float32)
    g = cuctx.Graph()
    condition = g.condition(default=True)
    first = g.conditional("if", condition=condition)
    first.body.fill(out[0:1], 1.0)
    own = g.conditional("if", default=False)  # with a condition of its own
    assert condition.node is first and own.condition.node is own
    for graph in (g, first.body):
        with pytest.raises(ValueError, match="drive one conditional node") as info:
            graph.conditional("while", condition=condition)
        assert repr(first) in str(info.value) and "g.condition()" in str(info.value)
    assert len(g.nodes) == 2 and first.body.nodes[0].kind == "fill"  # nothing was added
    run(g)  # and the graph is whole
    assert out.to_host().tolist() == [1.0, 0.0]


def test_a_condition_no_node_uses_is_named_at_instantiate(backend):
    has_conditionals(backend)
    g = cuctx.Graph()
    g.conditional("if", default=1)
    unused = g.condition()  # this line is named
    with pytest.raises(ValueError, match="drives no conditional node") as info:
        g.instantiate()
    assert f"{__file__}:{unused.site[1]}" in str(info.value)
    assert "unused = g.condition()" in linecache.getline(__file__, unused.site[1])
    g.conditional("while", condition=unused)
    g.instantiate()  # used now


def test_a_setter_compiles_with_nvrtc_alone_and_errors_keep_the_users_lines(backend):
    """cuctx declares cudaGraphSetConditional for NVRTC only where the source calls it and
    does not declare it itself; NVRTC's messages still name the user's own lines."""
    declared = (
        'extern "C" __device__ __cudart_builtin__ void CUDARTAPI '
        "cudaGraphSetConditional(cudaGraphConditionalHandle, unsigned int);\n"
    )
    source = declared + SETTER_SOURCE.split('extern "C" __global__ void countdown')[0]
    lib = cuctx.Library.from_source(source, sim_kernels={"set_condition": set_condition_twin})
    assert lib["set_condition"].name == "set_condition"
    with pytest.raises(cuctx.CompileError, match=r"\(3\): error") as info:
        cuctx.Library.from_source(
            'extern "C" __global__ void f(cudaGraphConditionalHandle h) {\n'
            "    cudaGraphSetConditional(h, 1);\n"
            "    oops;\n}\n"
        )
    assert "oops" in str(info.value)


# -- what CUDA refuses around conditional nodes, refused where it is added --------------------


def raw_host_params() -> tuple[d.CUDA_HOST_NODE_PARAMS, object]:
    """A host node's parameters for the raw driver (and the callback, to keep alive)."""
    callback = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(lambda data: None)
    params = d.CUDA_HOST_NODE_PARAMS()
    params.fn = ctypes.cast(callback, ctypes.c_void_p).value
    return params, callback


def test_a_node_a_body_cannot_run_is_refused_when_added_naming_the_body(lib, backend):
    has_conditionals(backend)
    out, event = cuctx.zeros(N, np.float32), cuctx.Event()
    g = cuctx.Graph()
    node = g.conditional("if", default=True)
    body = node.body
    inner = body.conditional("if", default=True)  # a body inside a body: the same rule
    holder = cuctx.Graph()
    holder.host(print, "never")
    where = re.escape(f"bodies[0] of {node!r}")
    for adding, words in [
        (lambda: body.host(print, "x"), "this adds a host node"),
        (lambda: body.record(event), "this adds an event record node"),
        (lambda: body.wait(event), "this adds an event wait node"),
        (lambda: body.child(holder), re.escape(f"{holder!r} holds")),
    ]:
        with pytest.raises(
            ValueError,
            match=f"{words}.*this graph is {where}: CUDA runs "
            "only kernel, copy, fill, empty, child graph and conditional "
            r"nodes.*before or after it \(after=node\)",
        ):
            adding()
    with pytest.raises(ValueError, match=re.escape(f"bodies[0] of {inner!r}")):
        inner.body.host(print, "x")
    assert body.nodes == (inner,) and inner.body.nodes == ()  # nothing was added
    inner.body.launch(lib["add"], 1, N, out, out, 1.0, N)
    g.host(print, "around the node is fine", after=node)
    run(g)
    assert out.to_host().tolist() == [1.0] * N


def test_a_host_node_added_to_a_body_through_the_raw_driver_fails_instantiation(backend):
    """Past cuctx's check the driver adds the node and refuses the graph at instantiation
    (CUDA_ERROR_INVALID_VALUE, naming nothing): the sim as an H100 with driver 580."""
    has_conditionals(backend)
    g = cuctx.Graph()
    node = g.conditional("if", default=True)
    params, _callback = raw_host_params()
    err, _ = backend.driver.cuGraphAddHostNode(node.body._handle, None, 0, params)
    assert err == d.CUresult.CUDA_SUCCESS
    with pytest.raises(cuctx.InvalidValueError, match="cuGraphInstantiate"):
        g.instantiate()


def test_a_graph_with_a_conditional_node_is_refused_as_a_child(backend):
    has_conditionals(backend)
    inner, outer = cuctx.Graph(), cuctx.Graph()
    node = inner.conditional("if", default=True)
    with pytest.raises(
        ValueError,
        match=re.escape(
            f"{inner!r} holds {node!r}, and CUDA forbids conditional nodes in child graphs"
        ),
    ):
        outer.child(inner)
    assert outer.nodes == ()
    # The raw driver refuses it too (an H100, driver 580), with the code the sim gives as well.
    err, _ = backend.driver.cuGraphAddChildGraphNode(outer._handle, None, 0, inner._handle)
    assert err == d.CUresult.CUDA_ERROR_NOT_SUPPORTED


def test_a_made_up_number_where_a_kernel_takes_a_condition_is_refused(setters, backend):
    g, other = cuctx.Graph(), cuctx.Graph()
    refused = r"parameter 0 \(cudaGraphConditionalHandle handle\) is a condition handle"
    for made_up in (12345, np.uint64(12345)):
        with pytest.raises(
            TypeError,
            match=f"{refused}, and .*12345\\)? is not a condition: "
            r"pass one made by g.condition\(\)",
        ):
            g.launch(setters["set_condition"], 1, 1, made_up, 1)
    with pytest.raises(ValueError, match=f"{refused}, and <Condition .* is of another graph"):
        g.launch(setters["set_condition"], 1, 1, other.condition(), 1)
    assert g.nodes == ()
    out = cuctx.zeros(1, np.float32)
    condition = g.condition()
    setter = g.launch(setters["set_condition"], 1, 1, condition, 1)
    node = g.conditional("if", condition=condition, after=setter)
    node.body.launch(setters["set_condition"], 1, 1, condition, 1)  # a body's kernel may too
    node.body.launch(setters["put"], 1, 1, out, 7.0)
    exe = g.instantiate()
    with pytest.raises(TypeError, match=refused):
        exe.update_node(setter, 12345, 0)
    exe.launch()  # the executable is unchanged: its setter still sets the condition to 1
    assert out.to_host().tolist() == [7.0]


def test_a_typedef_of_the_condition_handle_is_known_too(backend):
    has_conditionals(backend)
    source = (
        "typedef cudaGraphConditionalHandle Cond;\n"
        'extern "C" __global__ void set(unsigned int v, Cond h) {\n'
        "    cudaGraphSetConditional(h, v);\n}\n"
    )
    setter = cuctx.Library.from_source(
        source,
        sim_kernels={"set": lambda grid, block, v, h: cuctx.backend().sim.set_conditional(h, v)},
    )["set"]
    g = cuctx.Graph()
    with pytest.raises(TypeError, match=r"parameter 1 \(Cond h\) is a condition handle"):
        g.launch(setter, 1, 1, 1, 99)
    condition = g.condition()
    g.launch(setter, 1, 1, 1, condition)
    g.conditional("if", condition=condition)


def test_update_node_changes_nodes_inside_bodies(lib, backend):
    has_conditionals(backend)
    x, out, filled = arange(), cuctx.zeros(N, np.float32), cuctx.zeros(N, np.float32)
    copied = cuctx.zeros(N, np.float32)

    def build(scale: float) -> tuple[cuctx.Graph, list[cuctx.GraphNode]]:
        g = cuctx.Graph()
        outer = g.conditional("if", default=True)
        inner = outer.body.conditional("while", default=False)  # never runs: a placeholder
        kernel = outer.body.launch(lib["add"], 1, N, out, x, scale, N, after=inner)
        fill = outer.body.fill(filled, scale)
        nested = outer.body.conditional("if", default=True, after=kernel)
        copy = nested.body.copy(copied, x)
        return g, [kernel, fill, copy]

    g, (kernel, fill, copy) = build(1.0)
    exe = g.instantiate()
    exe.update_node(kernel, out, x, 10.0, N)
    exe.update_node(fill, filled, 3.0)
    exe.update_node(copy, copied, out)
    exe.launch()
    cuctx.current_stream().synchronize()
    assert out.to_host().tolist() == [i + 10.0 for i in range(N)]
    assert filled.to_host().tolist() == [3.0] * N
    assert copied.to_host().tolist() == [i + 10.0 for i in range(N)]  # from `out` now
    same, nodes = build(20.0)  # after a whole-graph update its body nodes name them too
    exe.update(same)
    exe.update_node(nodes[0], out, x, 30.0, N)
    exe.enable(nodes[1], False)
    filled.fill(0.0)
    exe.launch()
    cuctx.current_stream().synchronize()
    assert out.to_host().tolist() == [i + 30.0 for i in range(N)]
    assert filled.to_host().tolist() == [0.0] * N  # turned off
    assert copied.to_host().tolist() == [float(i) for i in range(N)]  # the new graph's copy
    child = cuctx.Graph()
    in_child = child.launch(lib["add"], 1, N, out, x, 1.0, N)
    with_child = cuctx.Graph()
    with_child.child(child)
    with pytest.raises(ValueError, match="nor are a child graph's nodes.*exe.update"):
        with_child.instantiate().update_node(in_child, out, x, 2.0, N)


def test_a_while_node_that_never_ends_stops_at_the_sims_cap_naming_the_node(sim):
    """A GPU would loop for ever; the sim stops after the rounds docs/graphs.md states."""
    from cuctx._driver.sim._graph_conditional import MAX_ROUNDS

    assert f"{MAX_ROUNDS:,}" in (SRC.parent / "docs" / "graphs.md").read_text()
    ctx = Context.create(0)  # its own context: the fault poisons it
    try:
        g = cuctx.Graph()
        loop = g.conditional("while", default=True)
        loop.body.empty()
        g.instantiate().launch()
        with pytest.raises(
            StickyFaultError,
            match=re.escape(
                f"the sim stopped {loop!r} after {MAX_ROUNDS} rounds with its condition "
                "still non-zero"
            ),
        ) as info:
            cuctx.synchronize()
        assert info.value.name == "CUDA_ERROR_LAUNCH_TIMEOUT"
        assert "cudaGraphSetConditional(handle, 0)" in str(info.value)
        assert f"{__file__}:{loop.site[1]}" in str(info.value)
    finally:
        Context.pop()
        ctx.destroy()
