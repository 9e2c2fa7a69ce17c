"""Graph executables: launches on streams of their context (another context or device is
refused, naming both), uploads, instantiation options; an executable keeps alive what its
nodes use until it is destroyed, and raises the context's error once its context is gone.
Sim and GPU."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import cuctx
from cuctx import ContextDestroyedError

from conftest import busy
from scenarios import ADD_SOURCE, add, library_fixture

pytestmark = pytest.mark.usefixtures("nvrtc_cache")

lib = library_fixture(ADD_SOURCE, add=add)
N = 8


def arange(n: int = N) -> cuctx.DeviceArray:
    return cuctx.to_device(np.arange(n, dtype=np.float32))


def increment(lib, arr: cuctx.DeviceArray) -> cuctx.Graph:
    """A graph adding 1 to ``arr`` in place."""
    g = cuctx.Graph()
    g.launch(lib["add"], 1, N, arr, arr, 1.0, N)
    return g


def test_each_launch_runs_the_graph_again(lib):
    x = arange()
    exe = increment(lib, x).instantiate()
    stream = cuctx.Stream()
    stream.wait(cuctx.current_stream())
    for _ in range(3):
        exe.launch(stream)
    stream.synchronize()
    assert x.to_host().tolist() == [i + 3.0 for i in range(N)]
    assert "GraphExec" in repr(exe) and exe.context is x.context and exe.handle


def test_launch_without_a_stream_uses_the_current_stream(lib):
    x = arange()
    exe = increment(lib, x).instantiate()
    stream = cuctx.Stream()
    stream.wait(cuctx.current_stream())
    with stream:
        exe.launch()
    stream.synchronize()
    assert x.to_host().tolist() == [i + 1.0 for i in range(N)]


def test_upload_and_instantiation_options(lib):
    x = arange()
    g = increment(lib, x)
    stream = cuctx.Stream()
    stream.wait(cuctx.current_stream())
    exe = g.instantiate(auto_free=True, priority=True)
    exe.upload(stream)
    exe.launch(stream)
    g.instantiate(upload=stream).launch(stream)
    stream.synchronize()
    assert x.to_host().tolist() == [i + 2.0 for i in range(N)]


def test_an_executable_keeps_what_its_nodes_use_alive(lib):
    out = cuctx.pinned_empty(N, np.float32)
    x = arange()
    y = cuctx.zeros(N, np.float32)
    g = cuctx.Graph()
    node = g.launch(lib["add"], 1, N, y, x, 2.0, N)
    g.copy(out, y, after=node)
    exe = g.instantiate()
    del g, node, x, y  # only the executable holds the arrays now
    gc.collect()
    cuctx.synchronize()  # their memory would be freed by now if nothing held it
    exe.launch()
    cuctx.current_stream().synchronize()
    assert out.tolist() == [i + 2.0 for i in range(N)]


def test_a_destroyed_executable_refuses_launches(lib):
    x = arange()
    with increment(lib, x).instantiate() as exe:
        exe.launch()
    assert exe.handle == 0 and "destroyed" in repr(exe)
    with pytest.raises(RuntimeError, match="destroyed"):
        exe.launch()
    exe.destroy()  # twice is fine
    cuctx.current_stream().synchronize()
    assert x.to_host().tolist() == [i + 1.0 for i in range(N)]


def test_launches_still_queued_keep_their_arrays_after_destroy(lib):
    out = cuctx.pinned_empty(N, np.float32)
    stream = cuctx.Stream()
    stream.wait(cuctx.current_stream())
    busy(stream, 5)  # the launch waits behind this, so it runs after destroy()
    x = arange()
    g = cuctx.Graph()
    g.copy(out, x)
    exe = g.instantiate()
    stream.wait(cuctx.current_stream())
    exe.launch(stream)
    del g, x
    exe.destroy()
    gc.collect()
    stream.synchronize()
    assert out.tolist() == list(range(N))


def test_after_its_context_is_destroyed_everything_raises_context_destroyed(lib):
    ctx = cuctx.Context.create(0)
    try:
        x = arange()
        g = increment(lib, x)
        exe = g.instantiate()
        node = g.nodes[0]
    finally:
        cuctx.Context.pop()
    ctx.destroy()
    for use in (
        exe.launch,
        lambda: exe.update_node(node, x, x, 1.0, N),
        exe.upload,
        lambda: exe.update(g),
        lambda: exe.enable(node, False),
        g.empty,
        lambda: g.edges,
        g.instantiate,
    ):
        with pytest.raises(ContextDestroyedError):
            use()
    exe.destroy()  # no driver call for a destroyed context: nothing raises


def test_a_stream_of_another_context_is_refused_naming_both(lib):
    x = arange()
    exe = increment(lib, x).instantiate()
    other = cuctx.Context.create(0)
    try:
        foreign = cuctx.Stream()
    finally:
        cuctx.Context.pop()
    with pytest.raises(ValueError) as info:
        exe.launch(foreign)
    assert repr(exe.context) in str(info.value) and repr(other) in str(info.value)
    with pytest.raises(ValueError, match="own context"):
        exe.upload(foreign)
    del foreign
    other.destroy()


def test_a_launch_after_the_library_was_unloaded_raises(backend):
    library = cuctx.Library.from_source(ADD_SOURCE, sim_kernels={"add": add})
    with cuctx.Device(0):
        x = arange()
        exe = increment(library, x).instantiate()
        library.unload()
        with pytest.raises(RuntimeError, match="unloaded"):
            exe.launch()


def test_a_launch_waits_for_the_executables_earlier_launch_on_another_stream(sim):
    """cuGraphLaunch: each launch is ordered behind the executable's earlier launches, on
    any stream, so synchronizing the second stream waits for the first launch too."""
    from cuctx.sim import stream_busy

    ran = []
    with cuctx.Device(0):
        a, b = cuctx.Stream(), cuctx.Stream()
        graph = cuctx.Graph()
        graph.host(ran.append, "run")
        exe = graph.instantiate()
        stream_busy(a, 10_000_000)
        a.launch_host_func(ran.append, "a busy done")
        exe.launch(a)
        exe.launch(b)
        b.synchronize()
        assert ran == ["a busy done", "run", "run"]
