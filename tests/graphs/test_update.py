"""Updating executables: a whole graph of the same structure (exe.update), one node
(exe.update_node: kernel arguments and configuration, copies, fills), nodes turned off and on
(exe.enable). A refusal raises GraphUpdateError naming the node, the user's line that added it
and the reason in words; the executable still runs as before. Sim and GPU."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import cuctx
from cuctx import GraphUpdateError, KernelArgumentError, LaunchConfigError

from scenarios import ADD_SOURCE, add, library_fixture

pytestmark = pytest.mark.usefixtures("nvrtc_cache")

lib = library_fixture(ADD_SOURCE, add=add)
N = 8


def arange(n: int = N) -> cuctx.DeviceArray:
    return cuctx.to_device(np.arange(n, dtype=np.float32))


def launch(exe: cuctx.GraphExec) -> None:
    exe.launch()
    cuctx.current_stream().synchronize()


@pytest.fixture
def whole(backend):
    if not hasattr(backend.driver, "cuGraphExecUpdate"):
        pytest.skip("this backend has no whole-graph update")


def adding(lib, out, x, a: float, extra: bool = False) -> cuctx.Graph:
    g = cuctx.Graph()
    node = g.launch(lib["add"], 1, N, out, x, a, N)
    if extra:
        g.fill(x, 0.0, after=node)
    return g


# -- whole graphs ---------------------------------------------------------------------------


def test_update_takes_the_new_graphs_parameters(lib, whole):
    x, out, out2 = arange(), cuctx.zeros(N, np.float32), cuctx.zeros(N, np.float32)
    exe = adding(lib, out, x, 1.0).instantiate()
    exe.update(adding(lib, out2, x, 5.0))  # new pointer, new scalar
    launch(exe)
    assert out2.to_host().tolist() == [i + 5.0 for i in range(N)]
    assert out.to_host().tolist() == [0.0] * N


def test_update_keeps_the_new_graphs_arrays_alive(lib, whole):
    out = cuctx.pinned_empty(N, np.float32)
    exe = adding(lib, cuctx.zeros(N, np.float32), arange(), 0.0).instantiate()
    x, y = arange(), cuctx.zeros(N, np.float32)
    g = cuctx.Graph()
    g.launch(lib["add"], 1, N, y, x, 3.0, N)
    exe.update(g)
    tail = cuctx.Graph()
    tail.copy(out, y)
    copy_exe = tail.instantiate()
    del g, x  # the executable holds the new input now
    gc.collect()
    launch(exe)
    launch(copy_exe)
    assert out.tolist() == [i + 3.0 for i in range(N)]


def test_a_graph_of_another_structure_is_refused_naming_the_node_and_line(lib, whole):
    x, out = arange(), cuctx.zeros(N, np.float32)
    exe = adding(lib, out, x, 1.0).instantiate()
    bigger = adding(lib, out, x, 2.0, extra=True)
    with pytest.raises(GraphUpdateError) as info:
        exe.update(bigger)
    assert "2 nodes" in str(info.value) and "1)" in str(info.value)
    assert "structure changed" in str(info.value)

    other = cuctx.Graph()
    node = other.fill(out, 7.0)  # a fill where the kernel was
    with pytest.raises(GraphUpdateError) as info:
        exe.update(other)
    assert info.value.node is node
    assert f"test_update.py:{node.site[1]}" in str(info.value)
    assert "another kind" in str(info.value) and "unchanged" in str(info.value)
    launch(exe)  # still the first graph
    assert out.to_host().tolist() == [i + 1.0 for i in range(N)]


def test_changed_dependencies_are_refused_naming_the_node(lib, whole):
    x, y = arange(), cuctx.zeros(N, np.float32)

    def build(chained: bool) -> tuple[cuctx.Graph, cuctx.GraphNode]:
        g = cuctx.Graph()
        a = g.fill(y, 1.0)
        b = g.launch(lib["add"], 1, N, x, x, 1.0, N, after=a if chained else ())
        return g, b

    exe = build(False)[0].instantiate()
    g, b = build(True)
    with pytest.raises(GraphUpdateError) as info:
        exe.update(g)
    assert info.value.node is b and "'add'" in str(info.value)


def test_update_accepts_only_graphs_of_its_context(lib, whole):
    exe = adding(lib, cuctx.zeros(N, np.float32), arange(), 1.0).instantiate()
    with pytest.raises(TypeError, match="cuctx.Graph"):
        exe.update("graph")


# -- one node -------------------------------------------------------------------------------


def test_update_node_changes_a_kernels_arguments(lib):
    x, out, other = arange(), cuctx.zeros(N, np.float32), cuctx.zeros(N, np.float32)
    g = adding(lib, out, x, 1.0)
    node = g.nodes[0]
    exe = g.instantiate()
    exe.update_node(node, other, x, 4.0, N)
    launch(exe)
    assert other.to_host().tolist() == [i + 4.0 for i in range(N)]
    assert out.to_host().tolist() == [0.0] * N
    exe.update_node(node, out, x, 1.0, N)  # the same node again, other values
    launch(exe)
    assert out.to_host().tolist() == [i + 1.0 for i in range(N)]


def test_update_node_changes_the_configuration(lib):
    x, out = arange(2 * N), cuctx.zeros(2 * N, np.float32)
    g = cuctx.Graph()
    node = g.launch(lib["add"], 1, N, out, x, 1.0, 2 * N)  # one block of 8: half the array
    exe = g.instantiate()
    exe.update_node(node, out, x, 1.0, 2 * N, grid=2)
    launch(exe)
    assert out.to_host().tolist() == [i + 1.0 for i in range(2 * N)]
    with pytest.raises(LaunchConfigError, match="block"):
        exe.update_node(node, out, x, 1.0, N, block=4096)


def test_update_node_checks_arguments_as_launch_does(lib):
    x, out = arange(), cuctx.zeros(N, np.float32)
    g = adding(lib, out, x, 1.0)
    exe = g.instantiate()
    with pytest.raises(KernelArgumentError) as graphed:
        exe.update_node(g.nodes[0], out, x, 1.0)
    with pytest.raises(KernelArgumentError) as eager:
        cuctx.launch(lib["add"], 1, N, out, x, 1.0)
    assert str(graphed.value) == str(eager.value)
    launch(exe)  # unchanged
    assert out.to_host().tolist() == [i + 1.0 for i in range(N)]


def test_update_node_keeps_the_new_arguments_alive(lib):
    result = cuctx.pinned_empty(N, np.float32)
    out = cuctx.zeros(N, np.float32)
    g = cuctx.Graph()
    node = g.launch(lib["add"], 1, N, out, arange(), 0.0, N)
    g.copy(result, out, after=node)
    exe = g.instantiate()
    exe.update_node(node, out, arange(), 6.0, N)  # a new input nobody else holds
    gc.collect()
    launch(exe)
    assert result.tolist() == [i + 6.0 for i in range(N)]


def test_update_node_changes_copies_and_fills(lib):
    a, b, dst = arange(), cuctx.to_device(np.full(N, 9, np.float32)), cuctx.zeros(N, np.float32)
    filled = cuctx.zeros(N, np.int32)
    g = cuctx.Graph()
    copy = g.copy(dst, a)
    fill = g.fill(filled, 1)
    exe = g.instantiate()
    exe.update_node(copy, dst, b)
    exe.update_node(fill, filled, 42)
    launch(exe)
    assert dst.to_host().tolist() == [9.0] * N
    assert filled.to_host().tolist() == [42] * N
    with pytest.raises(TypeError, match=r"\(dst, src\)"):
        exe.update_node(copy, dst)
    with pytest.raises(TypeError, match="kernel nodes"):
        exe.update_node(fill, filled, 1, grid=2)
    with pytest.raises(ValueError, match="pageable"):
        exe.update_node(copy, dst, np.zeros(N, np.float32))


def test_update_node_names_what_it_cannot_change(lib):
    g = cuctx.Graph()
    host = g.host(print)
    exe = g.instantiate()
    with pytest.raises(TypeError, match="host node"):
        exe.update_node(host, print)
    with pytest.raises(ValueError, match="not a node"):
        exe.update_node(cuctx.Graph().empty())


def test_update_node_after_an_update_takes_the_new_graphs_nodes(lib, whole):
    x, out = arange(), cuctx.zeros(N, np.float32)
    exe = adding(lib, out, x, 1.0).instantiate()
    g2 = adding(lib, out, x, 2.0)
    exe.update(g2)
    exe.update_node(g2.nodes[0], out, x, 3.0, N)
    launch(exe)
    assert out.to_host().tolist() == [i + 3.0 for i in range(N)]


def test_enable_turns_a_node_off_and_on(lib):
    x = arange()
    g = cuctx.Graph()
    node = g.launch(lib["add"], 1, N, x, x, 1.0, N)
    join = g.empty(after=node)
    exe = g.instantiate()
    exe.enable(node, False)
    launch(exe)
    assert x.to_host().tolist() == list(range(N))
    exe.enable(node)
    launch(exe)
    assert x.to_host().tolist() == [i + 1.0 for i in range(N)]
    with pytest.raises(TypeError, match="empty node"):
        exe.enable(join, False)
