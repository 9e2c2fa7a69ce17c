"""@cuctx.autograph's per-call path: compiled where the backend has it (the call, the
structure and value comparison, the arena's lease for a temporary, the patches, the launch
and the bookkeeping: cuctx/csrc/autograph_call.c, arrays.c), the Python path its reference.
Both take the same decisions and give the same results; these tests show the compiled one
really serves the calls it is made for. Sim and GPU."""

from __future__ import annotations

import ctypes
import gc
import weakref
from typing import Callable

import numpy as np
import pytest

import cuctx
from cuctx import _record
from cuctx._driver import native
from cuctx.graphs import _autograph, _autograph_arena, _autograph_build, _autograph_record
from cuctx.memory import _alloc

from scenarios import ADD_SOURCE, add, library_fixture, python_paths

pytestmark = [
    pytest.mark.usefixtures("nvrtc_cache", "graphs_pay"),
    pytest.mark.paths("python", "native"),
]

lib = library_fixture(ADD_SOURCE, add=add)
N = 8


def arange(start: float = 0) -> cuctx.DeviceArray:
    return cuctx.to_device(np.arange(start, start + N, dtype=np.float32))


def token(k: cuctx.Kernel, middle: int = 3) -> Callable:
    """The docs' form: kernel[grid, block](...) inside the function, a temporary, a new
    output and scalar every call; ``middle`` kernels between the first and the last."""

    def step(out, x, a):
        tmp = cuctx.empty(N, np.float32)
        k[1, 32](tmp, x, np.float32(a), N)
        for _ in range(middle):
            k[1, 32](tmp, tmp, np.float32(1), N)
        k[1, 32](out, tmp, np.float32(a), N)

    return step


def decisions(fn: cuctx.AutoGraph) -> tuple:
    s = fn.stats()
    return (
        {k: s[k] for k in ("calls", "replays", "updates", "builds", "eager")},
        s["patched_nodes"],
        [(r["call"], r["action"], r["reason"]) for r in s["reasons"]],
    )


def test_graph_calls_and_temporaries_are_served_by_the_compiled_path_where_built(
    lib, backend, monkeypatch
):
    """After the first calls, a graph call of a structure of kernels goes through neither
    AutoGraph._run nor Arena.lend nor Recording.launch (its first launch included) on the
    compiled path; on the Python path it goes through all three. Results are the function's
    own either way."""
    step = cuctx.autograph(token(lib["add"]))
    outs = [cuctx.empty(N, np.float32) for _ in range(8)]
    for i in range(3):  # eager, built, then a graph call
        step(outs[i], arange(i), float(i))
    runs, lends, launches = [], [], []
    run, lend = _autograph.AutoGraph._run, _autograph_arena.Arena.lend
    launch = _autograph_record.Recording.launch
    monkeypatch.setattr(
        _autograph.AutoGraph, "_run", lambda self, rec: runs.append(1) or run(self, rec)
    )
    monkeypatch.setattr(
        _autograph_arena.Arena, "lend", lambda self, *a: lends.append(1) or lend(self, *a)
    )
    monkeypatch.setattr(
        _autograph_record.Recording,
        "launch",
        lambda self, *a: launches.append(1) or launch(self, *a),
    )
    for i in range(3, 8):
        step(outs[i], arange(i), float(i))
    compiled = backend.native is not None
    assert (runs, lends, launches) == (([], [], []) if compiled else ([1] * 5, [1] * 5, [1] * 25))
    assert step._last.compiled == compiled
    for i, out in enumerate(outs):
        np.testing.assert_array_equal(out.to_host(), np.arange(i, i + N) + 2 * i + 3)
    s = step.stats()
    assert (s["builds"], s["updates"], s["patched_nodes"]) == (1, 6, 2 * 6)


def test_an_output_the_caller_keeps_is_not_lent_again_and_the_next_comes_from_the_pool(
    lib, backend, monkeypatch
):
    """A function returning a new array each call: while the caller holds an output, the
    memory of its arena slot is not lent to the next call, whose output comes from the
    device's pool instead; on the compiled path without Arena.lend or from_pool running in
    Python. Every output keeps its own values."""
    k = lib["add"]

    @cuctx.autograph
    def step(x, a):
        out = cuctx.empty(N, np.float32)
        k[1, 32](out, x, np.float32(a), N)
        return out

    x = arange()
    out = None
    for i in range(3):  # eager, built, then a graph call
        out = step(x, float(i))
    lends, pools = [], []
    lend, from_pool = _autograph_arena.Arena.lend, _alloc.from_pool

    def lending(self, *args):
        lent = lend(self, *args)
        lends.append(lent is not None)
        return lent

    monkeypatch.setattr(_autograph_arena.Arena, "lend", lending)
    monkeypatch.setattr(_alloc, "from_pool", lambda *a: pools.append(1) or from_pool(*a))
    kept = []
    for i in range(3, 7):  # the last output held while the next call runs, as `out = f()`
        out = step(x, float(i))
        kept.append((i, out.ptr, out.to_host()))
    for i in range(7, 10):  # every output held
        out = step(x, float(i))
        kept.append((i, out.ptr, out))
    compiled = backend.native is not None
    assert len(lends) == (0 if compiled else 7)
    assert len(pools) == lends.count(False)  # the calls whose slot was held
    assert compiled or 0 < lends.count(False) < 7
    held = [ptr for i, ptr, _ in kept[4:]]
    assert len(set(held)) == len(held)  # none lent again while held
    for i, _, values in kept:
        host = values if isinstance(values, np.ndarray) else values.to_host()
        np.testing.assert_array_equal(host, np.arange(N) + i)
    s = step.stats()
    assert (s["calls"], s["builds"]) == (10, 1)


def test_both_paths_take_the_same_decisions(lib, backend, costs_decide):
    """The same loop on each path: the same counts, patched nodes and reasons (on the sim,
    where the modelled costs decide; a GPU measures its own)."""
    if backend.sim is None:
        pytest.skip("on a GPU each path measures its own costs")
    k = lib["add"]

    def run() -> tuple:
        step = cuctx.autograph(token(k))
        for n in range(40):
            if n == 20:  # a new structure (its cache and history kept): one kernel more
                step._fn = token(k, middle=4)
            step(cuctx.empty(N, np.float32), arange(n), float(n))
        return decisions(step)

    compiled = run()
    with python_paths(backend):
        python = run()
    assert compiled == python


def test_keyword_arguments_reach_the_function(lib):
    k = lib["add"]

    @cuctx.autograph
    def step(out, x, *, a=0.0, b):
        k[1, 32](out, x, np.float32(a + b), N)

    outs = [cuctx.empty(N, np.float32) for _ in range(4)]
    for i, out in enumerate(outs):
        step(out, x=arange(i), b=1.0) if i % 2 else step(out, arange(i), a=1.0, b=2.0)
    for i, out in enumerate(outs):
        np.testing.assert_array_equal(out.to_host(), np.arange(i, i + N) + (1 if i % 2 else 3))
    with pytest.raises(TypeError, match="missing 1 required keyword-only argument: 'b'"):
        step(outs[0], arange())


def test_an_error_of_the_function_propagates_and_its_work_runs(lib):
    k = lib["add"]

    class Stop(Exception):
        pass

    @cuctx.autograph
    def step(out, x, stop):
        k[1, 32](out, x, np.float32(1), N)
        if stop:
            raise Stop("stopped")

    out = cuctx.zeros(N, np.float32)
    for _ in range(3):
        step(out, arange(), False)
    with pytest.raises(Stop, match="stopped"):
        step(out, arange(10), True)
    np.testing.assert_array_equal(out.to_host(), np.arange(10, 10 + N) + 1.0)
    assert "raised Stop" in step.stats()["reasons"][-1]["reason"]
    step(out, arange(20), False)  # and the next call is a graph call again
    np.testing.assert_array_equal(out.to_host(), np.arange(20, 20 + N) + 1.0)
    s = step.stats()
    assert (s["replays"] + s["updates"], s["builds"], s["eager"]) == (2, 1, 2)


def test_the_launches_of_a_call_run_eagerly_are_enqueued_by_the_compiled_path(
    lib, backend, monkeypatch
):
    """A call that runs eagerly enqueues what it recorded, in order: its launches from their
    packed bytes in C where the backend has it (Launcher._enqueue is the Python path's),
    around what only Python enqueues (a host function here)."""
    from cuctx.kernels._launcher import Launcher

    k = lib["add"]
    ran = []

    @cuctx.autograph
    def step(out, x):
        k[1, 32](out, x, np.float32(1), N)
        cuctx.current_stream().launch_host_func(ran.append, len(ran))
        k[1, 32](out, out, np.float32(1), N)

    enqueued = []
    python = Launcher._enqueue
    monkeypatch.setattr(
        Launcher, "_enqueue", lambda self, *a: enqueued.append(1) or python(self, *a)
    )
    out = cuctx.zeros(N, np.float32)
    step(out, arange())  # a structure seen for the first time: run eagerly
    np.testing.assert_array_equal(out.to_host(), np.arange(N) + 2.0)
    assert ran == [0] and step.stats()["eager"] == 1
    assert enqueued == ([] if backend.native is not None else [1, 1])


def test_a_gpu_build_adds_its_kernel_nodes_from_c(lib, backend):
    """On a GPU the compiled path adds a build's kernel nodes from the recorded bytes in C,
    its struct's layout checked against cuda.bindings' when the backend loaded; the graph is
    the same as one built through cuda.bindings (the sim's driver takes cuda.bindings'
    structs, so there they are always used). Its patches use structs of its own too: the
    executable makes no update slot (a cuda.bindings struct and buffer) for them."""
    if backend.sim is not None or backend.native is None:
        pytest.skip("kernel nodes are added from C on a GPU's compiled path only")
    assert backend.native.builds, "the kernel node struct's layout differs from cuda.bindings'"
    step = cuctx.autograph(token(lib["add"]))
    outs = [cuctx.empty(N, np.float32) for _ in range(6)]
    for i, out in enumerate(outs):
        step(out, arange(i), float(i))
    graph = step._last.exe.graph
    assert [n.kind for n in graph.nodes] == ["kernel"] * 5
    assert len(graph.edges) == 4  # a chain, as the stream ordered the launches
    assert step.stats()["patched_nodes"] > 0 and not step._last.exe._held.slots
    for i, out in enumerate(outs):
        np.testing.assert_array_equal(out.to_host(), np.arange(i, i + N) + 2 * i + 3)


class _KernelNodeParams(ctypes.Structure):
    """csrc/native.h's kernel_node_params (CUDA_KERNEL_NODE_PARAMS_v2)."""

    _fields_ = [
        ("func", ctypes.c_void_p),
        ("grid", ctypes.c_uint * 3),
        ("block", ctypes.c_uint * 3),
        ("shared", ctypes.c_uint),
        ("params", ctypes.POINTER(ctypes.c_void_p)),
        ("extra", ctypes.c_void_p),
        ("kern", ctypes.c_void_p),
        ("ctx", ctypes.c_void_p),
    ]


def test_a_build_of_kernels_on_one_stream_is_made_in_c_as_python_makes_it(lib, backend):
    """The compiled build of a one-stream recording of launches (`kernel_chain`: the nodes
    added in one call, then their GraphNodes in one; what a GPU's builds use) against a
    stand-in for cuGraphAddKernelNode, on any backend: each node follows the one before and
    takes its launch's recorded parameter bytes; each GraphNode is the one `kernel_node`
    makes (the call's line, the description, the kernel and configuration, keeping the
    library and the arguments: a temporary's block, not its lease). A refusal names the
    kernel it came at."""
    module, why = native.extension()
    if module is None:
        pytest.skip(f"no compiled extension: {why}")
    added = []  # (graph, deps, grid, block, the first parameter's 8 bytes)
    refuse_at = []

    @ctypes.CFUNCTYPE(
        ctypes.c_int,
        ctypes.POINTER(ctypes.c_void_p),
        ctypes.c_void_p,
        ctypes.POINTER(ctypes.c_void_p),
        ctypes.c_size_t,
        ctypes.POINTER(_KernelNodeParams),
    )
    def add_kernel_node(node, graph, deps, count, params):
        if refuse_at and len(added) == refuse_at[0]:
            return 1  # CUDA_ERROR_INVALID_VALUE
        p = params.contents
        added.append(
            (
                graph,
                [deps[i] for i in range(count)],
                tuple(p.grid),
                tuple(p.block),
                ctypes.string_at(p.params[0], 8),
            )
        )
        node[0] = 0x1000 + len(added)
        return 0

    address = ctypes.cast(add_kernel_node, ctypes.c_void_p).value
    builder = module.Driver({name: address for name in native.FUNCTIONS})  # (only one runs)
    builder.builds = True
    fn = cuctx.autograph(token(lib["add"], middle=2))
    out, x = cuctx.empty(N, np.float32), arange()
    recording = _autograph_record.Recording(fn._arena)
    _record.start(recording)
    try:
        fn._fn(out, x, 2.0)
    finally:
        _record.stop()
    site = ("step.py", 7, "step")
    with recording.ctx:
        graph = cuctx.Graph()
        nodes = _autograph_build.kernel_chain(graph, recording, site, builder)
    handles = [0x1001 + i for i in range(4)]
    assert [a[1] for a in added] == [[]] + [[h] for h in handles[:-1]]  # a chain
    assert {a[0] for a in added} == {graph._key}
    assert all(a[2] == (1, 1, 1) and a[3] == (32, 1, 1) for a in added)
    assert [a[4] for a in added] == [v[:8] for v in recording.values]  # the output pointer
    assert list(graph.nodes) == nodes and [int(n._handle) for n in nodes] == handles
    for node, launcher, (args, _) in zip(nodes, recording.keys, recording.items):
        assert (node.graph, node.kind, node.site) == (graph, "kernel", site)
        assert node.description == _autograph_build.node_spec(launcher).description
        assert node._kernel is launcher.kernel and node._config is launcher.config
        assert node._keep[0] is launcher.kernel._owner and len(node._keep) == 1 + len(args)
        for kept, arg in zip(node._keep[1:], args):
            if (
                isinstance(arg, cuctx.DeviceArray)
                and arg._alloc.__class__ is _autograph_arena.Lease
            ):  # the temporary: its block, not its lease
                assert kept is not arg and kept.ptr == arg.ptr
                assert kept._alloc is arg._alloc.block
            else:
                assert kept is arg
    added.clear()
    refuse_at.append(2)
    with recording.ctx:
        refused = cuctx.Graph()
        with pytest.raises(cuctx.CudaError, match="adding kernel 'add'"):
            _autograph_build.kernel_chain(refused, recording, site, builder)
    assert len(refused.nodes) == 0 and len(added) == 2


def test_a_graph_autograph_lets_go_is_freed_at_once_not_by_the_garbage_collector(lib):
    """A graph and its nodes refer to each other. An AutoGraph's graph is its own (never
    handed out), so once its executable is destroyed (clear, eviction, a rebuild) the nodes
    let go of it: the graph, and its driver graph, are freed when the streams it ran on are
    known idle (synchronized), with the garbage collector off, not at its next pass inside
    whatever runs then; so are those of a function dropped. A graph of the user's keeps its
    nodes' ``graph`` after its executable is gone."""
    step = cuctx.autograph(token(lib["add"]))
    outs = [cuctx.empty(N, np.float32) for _ in range(3)]
    for i, out in enumerate(outs):
        step(out, arange(i), float(i))
    assert step.stats()["builds"] == 1
    graph = weakref.ref(step._last.exe.graph)
    dropped = cuctx.autograph(token(lib["add"]))
    for i in range(3):
        dropped(cuctx.empty(N, np.float32), arange(i), float(i))
    dropped_graph = weakref.ref(dropped._last.exe.graph)
    gc.disable()
    try:
        step.clear()
        del dropped
        cuctx.current_stream().synchronize()
        assert graph() is None and dropped_graph() is None
    finally:
        gc.enable()
    for i, out in enumerate(outs):  # what the calls made is unchanged
        np.testing.assert_array_equal(out.to_host(), np.arange(i, i + N) + 2 * i + 3)

    mine = cuctx.Graph()
    node = mine.launch(lib["add"], 1, 32, outs[0], outs[1], np.float32(1), N)
    exe = mine.instantiate()
    exe.destroy()
    assert node.graph is mine
