"""Stream capture: ``with stream.capture(mode) as graph:`` turns what cuctx queues on the
stream (and on streams that join it) into a Graph whose nodes carry the user's lines and keep
what they use alive; a call that would break the capture raises GraphCaptureError naming the
call and the line, ends the capture and leaves the stream usable. Sim and GPU."""

from __future__ import annotations

import gc
import linecache
import threading

import numpy as np
import pytest

import cuctx
from cuctx import GraphCaptureError

from scenarios import ADD_SOURCE, add, library_fixture

pytestmark = [pytest.mark.usefixtures("nvrtc_cache"), pytest.mark.paths("python", "native")]

lib = library_fixture(ADD_SOURCE, add=add)
N = 8


def arange(s: cuctx.Stream) -> cuctx.DeviceArray:
    """0, 1, ..., N-1 on ``s`` (the work captured on ``s`` comes after it)."""
    return cuctx.to_device(np.arange(N, dtype=np.float32), stream=s)


def zeros(s: cuctx.Stream) -> cuctx.DeviceArray:
    return cuctx.zeros(N, np.float32, stream=s)


def line_of(node: cuctx.GraphNode) -> str:
    """The source line the node was made by (its site must be in this file)."""
    assert node.site is not None and node.site[0] == __file__, node
    return linecache.getline(__file__, node.site[1])


def usable(lib, s: cuctx.Stream) -> None:
    """After a broken capture: eager work on ``s`` runs, and a new capture works."""
    out, x = zeros(s), arange(s)
    lib["add"][1, N, 0, s](out, x, 1.0, N)
    s.synchronize()
    assert out.to_host().tolist() == list(range(1, N + 1))
    with s.capture() as graph:
        lib["add"][1, N, 0, s](out, x, 2.0, N)
    graph.instantiate().launch(s)
    s.synchronize()
    assert out.to_host().tolist() == list(range(2, N + 2))


# -- what a capture holds ------------------------------------------------------------------


def test_capture_holds_launches_copies_fills_host_functions_and_a_joined_stream(lib):
    s, side = cuctx.Stream(), cuctx.Stream()
    x, mid, out = arange(s), zeros(s), zeros(s)
    scratch = zeros(s)
    host = cuctx.pinned_empty(N, np.float32)
    seen = []
    with s.capture() as graph:
        scratch.fill(7.0, stream=s)
        lib["add"][1, N, 0, s](mid, x, 1.0, N)
        side.wait(s.record())
        lib["add"][1, N, 0, side](out, mid, 10.0, N)
        s.launch_host_func(seen.append, "ran")
        s.wait(side)
        cuctx.copy(host, out, s)
    assert isinstance(graph, cuctx.Graph)
    assert sorted(node.kind for node in graph.nodes) == ["copy", "fill", "host", "kernel", "kernel"]
    assert out.to_host(stream=s).tolist() == [0.0] * N and seen == []  # nothing ran yet
    for node in graph.nodes:  # each node names the line that queued it
        text = {"fill": "scratch.fill(", "host": "launch_host_func(", "copy": "cuctx.copy("}
        assert (text.get(node.kind) or 'lib["add"]') in line_of(node)
    kernels = {line_of(n).strip() for n in graph.nodes if n.kind == "kernel"}
    assert any("side](" in k for k in kernels)  # the joined stream's launch is in the graph
    exe = graph.instantiate()
    for _ in range(2):
        host[:] = 0
        exe.launch(s)
        s.synchronize()
        assert host.tolist() == [float(i + 11) for i in range(N)]
        assert scratch.to_host().tolist() == [7.0] * N
    assert seen == ["ran", "ran"]


def test_every_captures_nodes_keep_what_they_use(backend):
    """Each capture's graph, then its executable, keeps the arrays, the library and the host
    function its nodes use: with every other reference dropped and collected, the launches
    still read and write the right memory (on the sim a use after free would fault)."""
    s = cuctx.Stream()
    results, seen = [], []
    for n in range(3):  # a stream captured again and again, each time with new objects
        lib = cuctx.Library.from_source(ADD_SOURCE, sim_kernels={"add": add})
        x, out = arange(s), zeros(s)
        host = cuctx.pinned_empty(N, np.float32)
        with s.capture() as graph:
            lib["add"][1, N](out, x, float(10 * n), N)  # s is the current stream in the block
            cuctx.copy(host, out)
            s.launch_host_func(seen.append, n)
        assert [line_of(node).strip() for node in graph.nodes][0].startswith('lib["add"]')
        results.append((graph.instantiate(), host, n))
        del lib, x, out, graph
    gc.collect()
    for exe, host, n in results:
        host[:] = -1
        exe.launch(s)
        s.synchronize()
        assert host.tolist() == [float(i + 10 * n) for i in range(N)]
    assert seen == [0, 1, 2]


def test_the_graph_keeps_what_its_nodes_use(lib):
    s = cuctx.Stream()
    out, x = zeros(s), arange(s)
    seen = []
    with s.capture() as graph:
        lib["add"][1, N, 0, s](out, x, 5.0, N)
        s.launch_host_func(seen.append, np.float32(3))
    del x  # the graph, and then its executable, are what keep the input alive
    gc.collect()
    exe = graph.instantiate()
    del graph
    gc.collect()
    exe.launch(s)
    s.synchronize()
    assert out.to_host().tolist() == [float(i + 5) for i in range(N)]
    assert seen == [3]


def test_memory_allocated_in_a_capture_freed_inside(lib):
    s = cuctx.Stream()
    x, out = arange(s), zeros(s)
    with s.capture() as graph:
        tmp = cuctx.empty(N, np.float32, stream=s)
        lib["add"][1, N, 0, s](tmp, x, 1.0, N)
        lib["add"][1, N, 0, s](out, tmp, 1.0, N)
        del tmp  # a free node: the graph frees its own memory at the end of each launch
    assert sorted(node.kind for node in graph.nodes) == ["alloc", "free", "kernel", "kernel"]
    exe = graph.instantiate()
    for _ in range(2):
        exe.launch(s)
        s.synchronize()
        assert out.to_host().tolist() == [float(i + 2) for i in range(N)]


def test_memory_allocated_in_a_capture_freed_outside(lib):
    s = cuctx.Stream()
    x = arange(s)
    with s.capture() as graph:
        made = cuctx.empty(N, np.float32, stream=s)
        lib["add"][1, N, 0, s](made, x, 3.0, N)
    assert sorted(node.kind for node in graph.nodes) == ["alloc", "kernel"]
    exe = graph.instantiate()
    exe.launch(s)
    s.synchronize()
    assert made.to_host().tolist() == [float(i + 3) for i in range(N)]  # valid after a launch
    del made  # freed on its stream, outside the graph: the executable may run again
    gc.collect()
    s.synchronize()


def test_memory_from_before_the_capture_is_freed_after_it_not_in_it(lib):
    s = cuctx.Stream()
    old = cuctx.zeros(N, np.float32, stream=s)
    x, out = arange(s), zeros(s)
    s.synchronize()
    with s.capture() as graph:
        del old  # its free waits for the end of the capture (a graph frees only its memory)
        gc.collect()
        lib["add"][1, N, 0, s](out, x, 1.0, N)
    assert [node.kind for node in graph.nodes] == ["kernel"]
    graph.instantiate().launch(s)
    s.synchronize()
    assert out.to_host().tolist() == [float(i + 1) for i in range(N)]


@pytest.mark.parametrize("mode", ["thread_local", "global", "relaxed"])
def test_modes(lib, mode):
    s = cuctx.Stream()
    x, out = arange(s), zeros(s)
    with s.capture(mode) as graph:
        lib["add"][1, N, 0, s](out, x, 4.0, N)
    graph.instantiate().launch(s)
    s.synchronize()
    assert out.to_host().tolist() == [float(i + 4) for i in range(N)]


def test_a_bad_mode_lists_the_modes(backend):
    with pytest.raises(ValueError, match="'thread_local', 'global', 'relaxed'"):
        cuctx.Stream().capture("local")


@pytest.mark.parametrize("mode", ["thread_local", "relaxed"])
def test_the_legacy_stream_beside_a_non_blocking_capture_runs_eagerly(lib, mode):
    s = cuctx.Stream()  # non-blocking: the legacy stream does not wait for it
    x, out, other = arange(s), zeros(s), zeros(s)
    legacy = cuctx.legacy_stream()
    s.synchronize()  # (the legacy stream does not wait for s)
    with s.capture(mode) as graph:
        lib["add"][1, N, 0, s](out, x, 1.0, N)
        lib["add"][1, N, 0, legacy](other, x, 2.0, N)  # not captured: runs now
    assert [node.kind for node in graph.nodes] == ["kernel"]
    assert other.to_host().tolist() == [float(i + 2) for i in range(N)]


LEGACY_WORK = {  # the call the message names -> work queued on the legacy stream
    "launch of 'add'": lambda lib, legacy, arr: lib["add"][1, N, 0, legacy](arr, arr, 2.0, N),
    "DeviceArray.fill": lambda lib, legacy, arr: arr.fill(3.0, stream=legacy),
    "Stream.record": lambda lib, legacy, arr: legacy.record(),
    "Stream.wait": lambda lib, legacy, arr: legacy.wait(cuctx.Stream()),
    "Stream.launch_host_func": lambda lib, legacy, arr: legacy.launch_host_func(print),
}


@pytest.mark.parametrize("call", list(LEGACY_WORK))
def test_the_legacy_stream_in_a_global_capture_is_refused_before_it_runs(lib, call):
    s = cuctx.Stream()
    x, other = arange(s), zeros(s)
    legacy = cuctx.legacy_stream()
    s.synchronize()
    work = LEGACY_WORK[call]
    with pytest.raises(GraphCaptureError, match="legacy default stream") as info:
        with s.capture("global"):
            lib["add"][1, N, 0, s](x, x, 1.0, N)
            work(lib, legacy, other)
    assert f"{__file__}:{work.__code__.co_firstlineno}" in str(info.value)
    assert other.to_host().tolist() == [0.0] * N  # nothing ran on the legacy stream
    usable(lib, s)


# -- calls that break a capture -------------------------------------------------------------

BREAKING = {  # the call the message names -> the call (s, an event recorded in the capture, arr)
    "Stream.synchronize": lambda s, event, arr: s.synchronize(),
    "Stream.done": lambda s, event, arr: s.done,
    "Event.synchronize": lambda s, event, arr: event.synchronize(),
    "Event.done": lambda s, event, arr: event.done,
    "cuctx.synchronize": lambda s, event, arr: cuctx.synchronize(),
    "Context.synchronize": lambda s, event, arr: s.context.synchronize(),
    "Device.synchronize": lambda s, event, arr: s.device.synchronize(),
    "cuctx.to_device": lambda s, event, arr: cuctx.to_device(np.ones(N, np.float32), stream=s),
    "DeviceArray.to_host": lambda s, event, arr: arr.to_host(stream=s),
    "cuctx.copy": lambda s, event, arr: cuctx.copy(np.empty(N, np.float32), arr, s),
    "DeviceArray.copy_from": lambda s, event, arr: arr.copy_from(np.ones(N, np.float32), s),
}


@pytest.mark.parametrize("mode", ["thread_local", "global"])
@pytest.mark.parametrize("call", list(BREAKING))
def test_a_breaking_call_raises_ends_the_capture_and_leaves_the_stream_usable(lib, call, mode):
    s = cuctx.Stream()
    arr = cuctx.zeros(N, np.float32, stream=s)
    breaking = BREAKING[call]
    with pytest.raises(GraphCaptureError) as info:
        with s.capture(mode):
            lib["add"][1, N, 0, s](arr, arr, 1.0, N)
            breaking(s, s.record(), arr)
    message = str(info.value)
    assert call in message
    assert f"{__file__}:{breaking.__code__.co_firstlineno}" in message
    assert "ended" in message
    usable(lib, s)


def test_the_legacy_stream_breaks_a_capture_of_a_blocking_stream(lib):
    s = cuctx.Stream(non_blocking=False)  # the legacy stream would wait for it
    x, out = arange(s), zeros(s)
    legacy = cuctx.legacy_stream()

    def on_legacy():
        lib["add"][1, N, 0, legacy](out, x, 2.0, N)

    with pytest.raises(GraphCaptureError, match="cuLaunchKernel") as info:
        with s.capture("thread_local"):
            lib["add"][1, N, 0, s](out, x, 1.0, N)
            on_legacy()
    line = on_legacy.__code__.co_firstlineno + 1
    assert f"{__file__}:{line}" in str(info.value) and "ended" in str(info.value)
    usable(lib, s)


def test_an_exception_in_the_block_discards_the_capture(lib):
    s = cuctx.Stream()
    x, out = arange(s), zeros(s)
    with pytest.raises(KeyError):
        with s.capture():
            lib["add"][1, N, 0, s](out, x, 1.0, N)
            raise KeyError("user code failed")
    assert out.to_host(stream=s).tolist() == [0.0] * N  # the captured launch never ran
    usable(lib, s)


def test_a_capture_broken_and_caught_inside_raises_at_the_end(lib):
    s = cuctx.Stream()
    with pytest.raises(GraphCaptureError, match="broken earlier"):
        with s.capture():
            with pytest.raises(GraphCaptureError):
                s.synchronize()
    usable(lib, s)


def test_a_fork_not_joined_back_raises_at_the_end(lib):
    s, side = cuctx.Stream(), cuctx.Stream()
    x, out = arange(s), zeros(s)
    with pytest.raises(GraphCaptureError, match="not joined back"):
        with s.capture():
            side.wait(s)
            lib["add"][1, N, 0, side](out, x, 1.0, N)
    usable(lib, s)
    usable(lib, side)


def test_another_threads_synchronize_is_refused_and_the_capture_goes_on(lib):
    s = cuctx.Stream()
    x, out = arange(s), zeros(s)
    errors = []

    def other_thread():
        try:
            with s.context:
                s.context.synchronize()
        except GraphCaptureError as exc:
            errors.append(exc)

    with s.capture("relaxed") as graph:
        lib["add"][1, N, 0, s](out, x, 1.0, N)
        thread = threading.Thread(target=other_thread)
        thread.start()
        thread.join()
    assert len(errors) == 1 and "goes on" in str(errors[0])
    graph.instantiate().launch(s)
    s.synchronize()
    assert out.to_host().tolist() == [float(i + 1) for i in range(N)]


def test_the_capturing_stream_is_current_in_the_block(lib):
    """As in torch.cuda.graph: work that names no stream goes into the capture; the stream
    current before the block is current again after it, also when the block raises."""
    s, outer = cuctx.Stream(), cuctx.Stream()
    x, out = arange(s), zeros(s)
    s.synchronize()
    with outer:
        with s.capture() as graph:
            assert cuctx.current_stream() is s
            lib["add"][1, N](out, x, 3.0, N)  # no stream named: into the capture
            out.fill(1.0)
            lib["add"][1, N](out, out, 1.0, N)
        assert cuctx.current_stream() is outer
        with pytest.raises(KeyError):
            with s.capture():
                raise KeyError("user code failed")
        assert cuctx.current_stream() is outer
    assert [node.kind for node in graph.nodes] == ["kernel", "fill", "kernel"]
    assert out.to_host().tolist() == [0.0] * N  # nothing ran eagerly
    graph.instantiate().launch(s)
    s.synchronize()
    assert out.to_host().tolist() == [2.0] * N


def test_is_capturing_says_whether_the_stream_is_captured_now(lib):
    s, side = cuctx.Stream(), cuctx.Stream()
    legacy = cuctx.legacy_stream()
    assert not s.is_capturing and not side.is_capturing and not legacy.is_capturing
    with s.capture():
        assert s.is_capturing and not side.is_capturing and not legacy.is_capturing
        side.wait(s)  # side joins the capture
        assert side.is_capturing
        s.wait(side)
    assert not s.is_capturing and not side.is_capturing
    with pytest.raises(GraphCaptureError):
        with s.capture():
            with pytest.raises(GraphCaptureError):
                s.synchronize()  # ends the capture
            assert not s.is_capturing
    blocking = cuctx.Stream(non_blocking=False)
    with blocking.capture():  # the driver answers "implicit" for the legacy stream now
        assert blocking.is_capturing and not legacy.is_capturing
    with pytest.raises(cuctx.ContextDestroyedError):
        with cuctx.Context.create(0) as ctx:
            gone = cuctx.Stream()
        ctx.destroy()
        assert gone.is_capturing is None  # raises first


def test_the_graph_used_inside_its_block_is_a_capture_error(lib):
    s = cuctx.Stream()
    x, out = arange(s), zeros(s)
    with s.capture() as graph:
        lib["add"][1, N, 0, s](out, x, 1.0, N)
        for call, use in (
            ("Graph.instantiate", lambda: graph.instantiate()),
            ("Graph.nodes", lambda: graph.nodes),
            ("Graph.launch", lambda: graph.launch(lib["add"], 1, N, out, x, 1.0, N)),
        ):
            with pytest.raises(GraphCaptureError, match="made when its `with` block ends") as info:
                use()
            assert str(info.value).startswith(f"{call} failed")
            assert f"{__file__}:{use.__code__.co_firstlineno}" in str(info.value)
        assert "not made yet" in repr(graph)
    assert len(graph) == 1  # the capture went on and made its graph
    graph.instantiate().launch(s)
    s.synchronize()
    assert out.to_host().tolist() == [float(i + 1) for i in range(N)]


@pytest.mark.parametrize("call", ["launch", "upload"])
def test_a_graph_launched_into_a_capture_is_refused_and_ends_it(lib, call):
    """CUDA does not capture graph launches (an H100 answers cuGraphLaunch on a capturing
    stream with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED): cuctx refuses before the driver."""
    s = cuctx.Stream()
    x, out = arange(s), zeros(s)
    with s.capture() as first:
        lib["add"][1, N, 0, s](out, x, 1.0, N)
    exe = first.instantiate()

    def use_it():
        getattr(exe, call)()  # on the current stream: s

    with pytest.raises(GraphCaptureError) as info:
        with s.capture():
            use_it()
    message = str(info.value)
    assert message.startswith(f"GraphExec.{call} failed")
    assert "cannot capture a graph launch" in message and "ended" in message
    assert f"{__file__}:{use_it.__code__.co_firstlineno + 1}" in message
    assert out.to_host().tolist() == [0.0] * N
    usable(lib, s)
    exe.launch(s)  # outside a capture it runs
    s.synchronize()
    assert out.to_host().tolist() == [float(i + 1) for i in range(N)]


# -- instantiating while a capture is active ------------------------------------------------


def graph_adding(lib, out: cuctx.DeviceArray, x: cuctx.DeviceArray, value: float) -> cuctx.Graph:
    """A graph of one launch, out = x + value, made before any capture."""
    g = cuctx.Graph()
    g.launch(lib["add"], 1, N, out, x, value, N)
    return g


@pytest.mark.parametrize("mode", ["thread_local", "global"])
def test_instantiating_in_a_capture_is_refused_before_the_driver_breaks_it(lib, mode):
    """CUDA counts cuGraphInstantiate among the calls a capture forbids its thread (an H100
    answers CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED in a thread-local capture and invalidates
    it): cuctx refuses first, saying what to do."""
    s = cuctx.Stream()
    x, out, made = arange(s), zeros(s), zeros(s)
    g = graph_adding(lib, made, x, 10.0)

    def make_it():
        return g.instantiate()

    with pytest.raises(GraphCaptureError) as info:
        with s.capture(mode):
            lib["add"][1, N, 0, s](out, x, 1.0, N)
            make_it()
    message = str(info.value)
    assert message.startswith("Graph.instantiate failed")
    assert f"{__file__}:{make_it.__code__.co_firstlineno + 1}" in message
    assert f"this thread captures {s!r} in {mode!r} mode" in message
    assert "before the capture begins" in message and '"relaxed" mode' in message
    assert "ended" in message
    usable(lib, s)
    g.instantiate().launch(s)  # outside a capture it is made
    s.synchronize()
    assert made.to_host().tolist() == [i + 10.0 for i in range(N)]
    assert out.to_host().tolist() == [0.0] * N  # the capture's launch never ran


def test_a_relaxed_capture_lets_a_graph_be_instantiated_in_it(lib):
    s = cuctx.Stream()
    x, out, made = arange(s), zeros(s), zeros(s)
    g = graph_adding(lib, made, x, 10.0)
    with s.capture("relaxed") as graph:
        lib["add"][1, N, 0, s](out, x, 1.0, N)
        exe = g.instantiate()
    exe.launch(s)
    graph.instantiate().launch(s)
    s.synchronize()
    assert made.to_host().tolist() == [i + 10.0 for i in range(N)]
    assert out.to_host().tolist() == [i + 1.0 for i in range(N)]


@pytest.mark.parametrize("mode", ["global", "thread_local"])
def test_another_threads_capture_forbids_instantiating_only_in_global_mode(lib, mode):
    """A "global" capture forbids every thread the unsafe calls (cuctx refuses them, and
    the capture goes on); another thread's "thread_local" capture forbids this one
    nothing."""
    s = cuctx.Stream()
    x, out, made = arange(s), zeros(s), zeros(s)
    g = graph_adding(lib, made, x, 10.0)
    results = []

    def other_thread():
        try:
            results.append(g.instantiate())
        except GraphCaptureError as exc:
            results.append(exc)

    with s.capture(mode) as graph:
        lib["add"][1, N, 0, s](out, x, 1.0, N)
        thread = threading.Thread(target=other_thread)
        thread.start()
        thread.join()
    if mode == "global":
        message = str(results[0])
        assert f"another thread captures {s!r} in 'global' mode" in message
        assert "goes on" in message and '"thread_local" or "relaxed"' in message
    else:
        results[0].launch(s)
    graph.instantiate().launch(s)  # the capture made its graph
    s.synchronize()
    assert out.to_host().tolist() == [i + 1.0 for i in range(N)]
    assert made.to_host().tolist() == (
        [0.0] * N if mode == "global" else [i + 10.0 for i in range(N)]
    )


def test_a_capture_is_entered_once(lib):
    s = cuctx.Stream()
    capture = s.capture()
    with capture as graph:
        with pytest.raises(RuntimeError, match="entered at .* already"):
            with capture:
                pass
    with pytest.raises(RuntimeError, match="call stream.capture\\(\\) again"):
        with capture:
            pass
    assert len(graph) == 0 and not s.is_capturing
    usable(lib, s)


@pytest.mark.parametrize("source", ["auto", "events"])
def test_a_timeline_inside_a_capture_and_around_one(lib, source):
    """Neither invalidates the capture: the timeline records no events into a capturing
    stream and waits only for streams not captured; the captured work shows as not run,
    and a launch of the graph later as work that ran."""
    s, other = cuctx.Stream(), cuctx.Stream()
    x, out, eager = arange(s), zeros(s), zeros(other)
    s.synchronize()
    other.synchronize()
    with s.capture() as graph:
        with cuctx.timeline(source) as inside:
            lib["add"][1, N, 0, s](out, x, 1.0, N)  # captured
            lib["add"][1, N, 0, other](eager, x, 2.0, N)  # runs now
    assert [node.kind for node in graph.nodes] == ["kernel"]
    captured, ran = [r for r in inside.records if r.kind == "launch"]
    assert captured.start_ns is None  # it runs at the graph's launches
    if not inside.approximate:  # (event pairs time nothing while a capture is active)
        assert ran.start_ns is not None and ran.stream == other.handle
    assert eager.to_host().tolist() == [float(i + 2) for i in range(N)]
    with cuctx.timeline(source) as around:
        with s.capture() as again:
            lib["add"][1, N, 0, s](out, out, 1.0, N)
        graph.instantiate().launch(s)
        again.instantiate().launch(s)
    launches = [r for r in around.records if r.kind == "graph_launch"]
    assert len(launches) == 2 and all(r.start_ns is not None for r in launches)
    assert out.to_host().tolist() == [float(i + 2) for i in range(N)]


def test_capturing_the_legacy_stream_or_a_stream_twice_is_refused(lib):
    with pytest.raises(GraphCaptureError, match="legacy default stream cannot be captured"):
        with cuctx.legacy_stream().capture():
            pass
    s = cuctx.Stream()
    with s.capture():
        with pytest.raises(ValueError, match="already being captured"):
            with s.capture():
                pass
    usable(lib, s)


def test_objects_collected_during_a_capture_are_destroyed_after_it(lib):
    """A garbage collection inside the block must not destroy an executable, a stream or an
    event then: the driver refuses some destroys in a capture and invalidates it."""
    s = cuctx.Stream()
    x = arange(s)
    with s.capture() as first:
        lib["add"][1, N, 0, s](x, x, 1.0, N)
    doomed = [first.instantiate(), cuctx.Stream(), cuctx.Event()]
    with s.capture() as graph:
        lib["add"][1, N, 0, s](x, x, 1.0, N)
        doomed.clear()
        gc.collect()
        lib["add"][1, N, 0, s](x, x, 10.0, N)
    assert [node.kind for node in graph.nodes] == ["kernel", "kernel"]
    graph.instantiate().launch(s)
    s.synchronize()
    assert x.to_host().tolist() == [float(i + 11) for i in range(N)]
