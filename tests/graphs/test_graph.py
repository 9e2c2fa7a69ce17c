"""Explicit graphs: each kind of node does what its eager operation does, checked the same
way (the same errors as cuctx.launch, copy and fill), ordered by ``after=``; a graph lists
its nodes and edges, says what it holds, and writes DOT. Sim and GPU."""

from __future__ import annotations

import linecache
import pathlib
import re

import numpy as np
import pytest

import cuctx
from cuctx import KernelArgumentError, LaunchConfigError

from scenarios import ADD_SOURCE, add, library_fixture, run_graph as run

pytestmark = [pytest.mark.usefixtures("nvrtc_cache"), pytest.mark.paths("python", "native")]

lib = library_fixture(ADD_SOURCE, add=add)
N = 8


def arange(n: int = N) -> cuctx.DeviceArray:
    return cuctx.to_device(np.arange(n, dtype=np.float32))


def line_of(node: cuctx.GraphNode) -> str:
    assert node.site is not None and node.site[0] == __file__, node
    return linecache.getline(__file__, node.site[1])


# -- kernels --------------------------------------------------------------------------------


def test_kernel_nodes_run_in_the_order_after_gives(lib):
    x, y, out = arange(), cuctx.zeros(N, np.float32), cuctx.zeros(N, np.float32)
    g = cuctx.Graph()
    first = g.launch(lib["add"], 1, N, y, x, 1.0, N)
    g.launch(lib["add"], 1, N, out, y, 10.0, N, after=first)  # reads what `first` wrote
    run(g)
    assert out.to_host().tolist() == [i + 11.0 for i in range(N)]


def test_nodes_edges_and_repr_describe_the_graph(lib):
    x, out = arange(), cuctx.zeros(N, np.float32)
    g = cuctx.Graph()
    a = g.launch(lib["add"], 1, N, out, x, 1.0, N)
    b = g.launch(lib["add"], (1, 1), (N, 1, 1), out, out, 1.0, N, after=[a])
    c = g.fill(x, 0.0, after=(a, b, a))  # a repeated node counts once
    assert g.nodes == (a, b, c) and len(g) == 3
    assert set(g.edges) == {(a, b), (a, c), (b, c)}
    assert [n.kind for n in g.nodes] == ["kernel", "kernel", "fill"]
    assert all(n.graph is g for n in g.nodes)
    assert 'g.launch(lib["add"], 1, N, out, x, 1.0, N)' in line_of(a)
    assert "'add'" in a.description and "block=(8, 1, 1)" in a.description
    text = repr(g)
    assert "3 nodes" in text and "2 kernel ('add' x2)" in text and "1 fill" in text
    assert "3 edges" in text
    assert "test_graph.py" in repr(a)


def test_kernel_nodes_are_checked_exactly_as_launches(lib):
    x, out = arange(), cuctx.zeros(N, np.float32)
    g = cuctx.Graph()
    for args, error in [
        ((out, x, 1.0), KernelArgumentError),  # a missing argument
        ((out, x, "1.0", N), KernelArgumentError),  # a wrong type
        ((out, x.to_host(), 1.0, N), KernelArgumentError),  # host memory
        ((out, x, 1.0, 2**40), KernelArgumentError),
    ]:  # out of range
        with pytest.raises(error) as eager:
            cuctx.launch(lib["add"], 1, N, *args)
        with pytest.raises(error) as graphed:
            g.launch(lib["add"], 1, N, *args)
        assert str(graphed.value) == str(eager.value)
    with pytest.raises(LaunchConfigError, match="block"):
        g.launch(lib["add"], 1, 4096, out, x, 1.0, N)
    with pytest.raises(TypeError, match="cuctx.Kernel"):
        g.launch("add", 1, N, out, x, 1.0, N)
    assert g.nodes == ()  # nothing refused was added


def test_after_takes_only_nodes_of_the_same_graph(lib):
    x, out = arange(), cuctx.zeros(N, np.float32)
    g, other = cuctx.Graph(), cuctx.Graph()
    foreign = other.empty()
    with pytest.raises(ValueError, match="another graph"):
        g.launch(lib["add"], 1, N, out, x, 1.0, N, after=foreign)
    with pytest.raises(TypeError, match="GraphNode"):
        g.empty(after=[1])


def test_after_says_what_it_takes_and_what_it_got(lib):
    x, out = arange(), cuctx.zeros(N, np.float32)
    g, child, event = cuctx.Graph(), cuctx.Graph(), cuctx.Event()
    first = g.empty()
    expected = r"after= takes a GraphNode or an iterable of GraphNodes \(what this graph's"
    for bad, got in (
        (0, "not int 0"),
        (1.5, "not float 1.5"),
        ("a", "not str 'a'"),
        (None, "not NoneType None; leave after= out"),
        (g, "not Graph <Graph"),
        ([first, 2], "; it holds int 2"),
    ):
        with pytest.raises(TypeError, match=f"Graph.fill: {expected}.*{got}"):
            g.fill(out, 0.0, after=bad)
    # Every method that adds a node checks after= the same way, before it changes anything:
    # the graph holds only `first` and still instantiates (no conditional handle left unused).
    adders = [
        lambda a: g.launch(lib["add"], 1, N, out, x, 1.0, N, after=a),
        lambda a: g.copy(out, x, after=a),
        lambda a: g.host(print, after=a),
        lambda a: g.record(event, after=a),
        lambda a: g.wait(event, after=a),
        lambda a: g.child(child, after=a),
        lambda a: g.empty(after=a),
        lambda a: g.conditional("if", default=0, after=a),
    ]
    for adder in adders:
        with pytest.raises(TypeError, match=expected):
            adder(0)
    assert g.nodes == (first,)
    run(g)
    second = g.fill(out, 1.0, after=(n for n in [first]))  # any iterable, a generator too
    assert g.edges == ((first, second),)


# -- copies and fills ---------------------------------------------------------------------


def test_copy_nodes_move_data_between_page_locked_host_and_device(lib):
    host_in = cuctx.pinned_empty(N, np.float32)
    host_in[:] = np.arange(N)
    host_out = cuctx.pinned_empty(N, np.float32)
    dev, dev2 = cuctx.zeros(N, np.float32), cuctx.zeros(N, np.float32)
    g = cuctx.Graph()
    up = g.copy(dev, host_in)
    kernel = g.launch(lib["add"], 1, N, dev2, dev, 1.0, N, after=up)
    across = g.copy(dev, dev2, after=kernel)
    g.copy(host_out, dev, after=across)
    assert [n.description.split()[:4] for n in g.nodes if n.kind == "copy"] == [
        ["copy", "host", "to", "device"],
        ["copy", "device", "to", "device"],
        ["copy", "device", "to", "host"],
    ]
    run(g)
    assert host_out.tolist() == [i + 1.0 for i in range(N)]


def test_copy_of_2d_views_is_one_node(lib):
    src = cuctx.to_device(np.arange(48, dtype=np.int32).reshape(6, 8))
    dst = cuctx.zeros((3, 4), np.int32)
    g = cuctx.Graph()
    g.copy(dst, src[::2, 2:6])
    run(g)
    assert dst.to_host().tolist() == np.arange(48).reshape(6, 8)[::2, 2:6].tolist()


def test_a_copy_refuses_what_a_graph_cannot_replay(lib):
    dev = cuctx.zeros(N, np.float32)
    g = cuctx.Graph()
    with pytest.raises(ValueError, match=r"pageable.*cuctx.pinned_empty"):
        g.copy(dev, np.zeros(N, np.float32))
    with pytest.raises(ValueError, match="pageable"):
        g.copy(np.zeros(N, np.float32), dev)
    with pytest.raises(ValueError, match="shapes differ"):
        g.copy(dev, cuctx.zeros(N + 1, np.float32))
    with pytest.raises(TypeError, match="dtypes differ"):
        g.copy(dev, cuctx.zeros(N, np.int32))
    with pytest.raises(ValueError, match="overlap"):
        g.copy(dev[1:], dev[:-1])
    with pytest.raises(TypeError, match="DeviceArray on at least one side"):
        g.copy(cuctx.pinned_empty(N, np.float32), cuctx.pinned_empty(N, np.float32))
    assert g.nodes == ()


def test_fill_nodes_take_the_values_fill_takes(lib):
    a, b, c = cuctx.zeros(N, np.float32), cuctx.zeros(N, np.uint8), cuctx.zeros(N, np.int64)
    g = cuctx.Graph()
    g.fill(a, 2.5)
    g.fill(b, 255)
    g.fill(c, -1)  # 8 bytes, one repeated word
    run(g)
    assert a.to_host().tolist() == [2.5] * N
    assert b.to_host().tolist() == [255] * N
    assert c.to_host().tolist() == [-1] * N
    with pytest.raises(TypeError, match="truncated"):
        g.fill(b, 1.5)
    with pytest.raises(ValueError, match="out of range"):
        g.fill(b, 256)


def test_fill_refuses_what_one_memset_cannot_do(lib):
    g = cuctx.Graph()
    with pytest.raises(ValueError, match="4-byte word"):
        g.fill(cuctx.zeros(N, np.float64), 1.0)  # two different 4-byte words
    with pytest.raises(ValueError, match="dense"):
        g.fill(cuctx.zeros(2 * N, np.float32)[::2], 1.0)
    with pytest.raises(TypeError, match="DeviceArray"):
        g.fill(np.zeros(N), 1.0)


# -- host functions, events, children ---------------------------------------------------------


def test_a_host_node_runs_at_every_launch(lib):
    calls = []
    g = cuctx.Graph()
    node = g.host(calls.append, "ran")
    assert node.kind == "host" and calls.append in node.keep
    run(g, times=3)
    assert calls == ["ran"] * 3
    with pytest.raises(TypeError, match="callable"):
        g.host(42)


def test_a_host_node_failure_is_raised_by_the_launch_streams_synchronize(lib):
    def broken():
        raise KeyError("graph host")

    g = cuctx.Graph()
    g.host(broken)
    stream = cuctx.Stream()
    g.instantiate().launch(stream)
    with pytest.raises(cuctx.HostFunctionError, match="KeyError"):
        stream.synchronize()
    stream.synchronize()  # reported once


def test_record_and_wait_nodes_order_work_across_streams(lib):
    x, y, out = arange(), cuctx.zeros(N, np.float32), cuctx.zeros(N, np.float32)
    done = cuctx.Event()
    producer = cuctx.Graph()
    node = producer.launch(lib["add"], 1, N, y, x, 1.0, N)
    producer.record(done, after=node)
    consumer = cuctx.Graph()
    waited = consumer.wait(done)
    consumer.launch(lib["add"], 1, N, out, y, 1.0, N, after=waited)
    first, second = cuctx.Stream(), cuctx.Stream()
    first.wait(cuctx.current_stream())  # after the arrays' upload
    second.wait(cuctx.current_stream())  # (it writes `out`)
    p, c = producer.instantiate(), consumer.instantiate()
    assert not done.recorded
    p.launch(first)
    assert done.recorded  # the graph records it at each launch
    c.launch(second)
    second.synchronize()
    assert out.to_host().tolist() == [i + 2.0 for i in range(N)]


def test_record_needs_an_event_of_the_graphs_context(lib):
    g = cuctx.Graph()
    other = cuctx.Context.create(0)
    try:
        foreign = cuctx.Event()
    finally:
        cuctx.Context.pop()
    with pytest.raises(ValueError, match="graph's context"):
        g.record(foreign)
    with pytest.raises(TypeError, match="Event"):
        g.wait("event")
    other.destroy()


def test_a_child_graph_runs_as_it_was_when_added(lib):
    x, out = arange(), cuctx.zeros(N, np.float32)
    child = cuctx.Graph()
    child.launch(lib["add"], 1, N, out, x, 5.0, N)
    parent = cuctx.Graph()
    node = parent.child(child)
    parent.empty(after=node)
    child.fill(out, 0.0)  # after the copy was made: not in the parent
    assert node.kind == "child" and child in node.keep
    run(parent)
    assert out.to_host().tolist() == [i + 5.0 for i in range(N)]
    with pytest.raises(ValueError, match="itself"):
        parent.child(parent)


def test_an_empty_node_joins_branches(lib):
    x, y, out = arange(), cuctx.zeros(N, np.float32), cuctx.zeros(N, np.float32)
    g = cuctx.Graph()
    a = g.fill(y, 1.0)
    b = g.launch(lib["add"], 1, N, out, x, 0.0, N)
    join = g.empty(after=(a, b))
    g.launch(lib["add"], 1, N, out, out, 0.0, N, after=join)
    assert {(a, join), (b, join)} <= set(g.edges)
    run(g)
    assert out.to_host().tolist() == list(range(N))


def test_to_dot_writes_the_graph(lib, backend, tmp_path):
    if not hasattr(backend.driver, "cuGraphDebugDotPrint"):
        pytest.skip("this backend writes no DOT files")
    x, out = arange(), cuctx.zeros(N, np.float32)
    g = cuctx.Graph()
    g.launch(lib["add"], 1, N, out, x, 1.0, N)
    path = g.to_dot(tmp_path / "graph.dot")
    text = (tmp_path / "graph.dot").read_text()
    assert path.endswith("graph.dot") and "digraph" in text


def test_to_dot_raises_the_oserror_open_raises(lib, backend, tmp_path):
    if not hasattr(backend.driver, "cuGraphDebugDotPrint"):
        pytest.skip("this backend writes no DOT files")
    g = cuctx.Graph()
    g.empty()
    missing = tmp_path / "missing" / "graph.dot"
    with pytest.raises(FileNotFoundError, match=re.escape(str(missing))):
        g.to_dot(missing)
    with pytest.raises(IsADirectoryError, match=re.escape(str(tmp_path))):
        g.to_dot(tmp_path)
    with pytest.raises(TypeError, match="os.PathLike"):
        g.to_dot(3)  # a path, not a file descriptor
    assert "digraph" in pathlib.Path(g.to_dot(str(tmp_path / "g.dot"))).read_text()
