"""The race checker (cuctx.racecheck) on both backends: the missing wait is named with both
streams, both lines and the fix; ordered work (waits, events, synchronize, disjoint slices)
is not reported; frees, graph launches and other libraries' arrays count. Racy cases assert
only on findings, never on data (on the sim streams really run out of order)."""

from __future__ import annotations

import inspect
import warnings
from contextlib import nullcontext

import numpy as np
import pytest

import cuctx
from scenarios import library_fixture, retire_history

pytestmark = pytest.mark.usefixtures("nvrtc_cache")

SOURCE = r"""
extern "C" __global__ void total(const float* x, float* out, int n) {
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        float s = 0;
        for (int i = 0; i < n; ++i) s += x[i];
        *out = s;
    }
}
extern "C" __global__ void init(float* x, float value, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = value;
}
"""


def total(grid, block, x, out, n):
    out.view(np.float32, 1)[0] = x.view(np.float32, n).sum()


def init(grid, block, x, value, n):
    x.view(np.float32, n)[:] = np.float32(value)


lib = library_fixture(SOURCE, total=total, init=init)
N = 1024


def here() -> int:
    return inspect.currentframe().f_back.f_lineno


def test_the_missing_wait_as_pytorch_writes_it(lib):
    s = cuctx.Stream()
    a = cuctx.empty(N, np.float32)
    b = cuctx.zeros(1, np.float32)
    cuctx.synchronize()
    with cuctx.racecheck("raise"):
        line_a = here() + 1
        a.fill(1.0)  # normal_() on the default stream
        with s:
            line_b = here() + 2
            with pytest.raises(cuctx.RaceError) as info:
                lib["total"][1, 1](a, b, N)  # sum() on the side stream, no wait
    [finding] = info.value.findings
    assert finding.kind == "read-after-write"
    assert finding.first.stream is cuctx.legacy_stream() and finding.second.stream is s
    assert finding.first.site[:2] == (__file__, line_a)
    assert finding.second.site[:2] == (__file__, line_b)
    assert finding.fix == f"s.wait(cuctx.legacy_stream()) before line {line_b}"
    message = str(info.value)
    assert f"{__file__}:{line_a}" in message and f"{__file__}:{line_b}" in message
    assert "launch of 'total'" in message and "fill" in message
    s.synchronize()


def test_the_missing_wait_with_raw_kernels(lib):
    s1, s2 = cuctx.Stream(), cuctx.Stream()
    out = cuctx.zeros(1, np.float32, stream=s2)
    cuctx.synchronize()
    with cuctx.racecheck() as rc:
        x = cuctx.empty(N, np.float32, stream=s1)
        line_a = here() + 1
        lib["init"][N // 256, 256, 0, s1](x, 2.0, N)
        line_b = here() + 2
        with pytest.raises(cuctx.RaceError, match=rf"fix: s2.wait\(s1\) before line {line_b}"):
            lib["total"][1, 1, 0, s2](x, out, N)
    [finding] = rc.findings
    assert (finding.first.stream, finding.second.stream) == (s1, s2)
    assert (finding.first.site[1], finding.second.site[1]) == (line_a, line_b)
    assert "allocated at " + __file__ in finding.array
    cuctx.synchronize()


def test_with_the_wait_nothing_is_reported_and_the_data_is_right(lib):
    s1, s2 = cuctx.Stream(), cuctx.Stream()
    x = cuctx.empty(N, np.float32, stream=s1)
    out = cuctx.zeros(1, np.float32, stream=s2)
    cuctx.synchronize()
    with cuctx.racecheck() as rc:
        lib["init"][N // 256, 256, 0, s1](x, 2.0, N)
        s2.wait(s1)
        lib["total"][1, 1, 0, s2](x, out, N)
        s1.wait(s2)  # the next write of x waits for the read
        x.fill(0.0, stream=s1)
        s2.synchronize()
    assert rc.findings == []
    assert out.to_host()[0] == 2.0 * N


def test_disjoint_slices_on_two_streams_are_no_race(lib):
    s1, s2 = cuctx.Stream(), cuctx.Stream()
    x = cuctx.empty(N, np.float32)
    cuctx.synchronize()
    with cuctx.racecheck() as rc:
        x[: N // 2].fill(1.0, stream=s1)
        x[N // 2 :].fill(2.0, stream=s2)
        lib["init"][2, 256, 0, s1](x[: N // 2], 3.0, N // 2)
        lib["init"][2, 256, 0, s2](x[N // 2 :], 4.0, N // 2)
        cuctx.synchronize()
        host = x.to_host()
    assert rc.findings == []
    assert host.tolist() == [3.0] * (N // 2) + [4.0] * (N // 2)


def test_events_and_synchronize_order_work(lib):
    s1, s2 = cuctx.Stream(), cuctx.Stream()
    x = cuctx.empty(N, np.float32, stream=s1)
    out = cuctx.zeros(1, np.float32, stream=s2)
    cuctx.synchronize()
    with cuctx.racecheck() as rc:
        x.fill(1.0, stream=s1)
        s2.wait(s1.record())  # an event recorded after the write
        lib["total"][1, 1, 0, s2](x, out, N)
        s2.synchronize()  # the host saw the read finish
        x.fill(2.0, stream=s1)
        event = s1.record()
        event.synchronize()
        lib["total"][1, 1, 0, s2](x, out, N)
        cuctx.synchronize()  # the context: everything
        x.fill(3.0, stream=s1)
        s1.synchronize()
        assert x.to_host(stream=s2)[0] == 3.0  # a copy to pageable memory: done on return
        x.fill(4.0, stream=s1)
    assert rc.findings == []
    cuctx.synchronize()


def test_an_event_recorded_before_the_write_does_not_order_it(lib):
    s1, s2 = cuctx.Stream(), cuctx.Stream()
    x = cuctx.empty(N, np.float32, stream=s1)
    out = cuctx.zeros(1, np.float32, stream=s2)
    cuctx.synchronize()
    with cuctx.racecheck("collect") as rc:
        early = s1.record()
        x.fill(1.0, stream=s1)
        s2.wait(early)
        lib["total"][1, 1, 0, s2](x, out, N)
    assert [f.kind for f in rc.findings] == ["read-after-write"]
    cuctx.synchronize()


def test_blocking_streams_and_the_legacy_stream_order_each_other(lib):
    blocking = cuctx.Stream(non_blocking=False)
    x = cuctx.empty(N, np.float32)
    out = cuctx.zeros(1, np.float32)
    cuctx.synchronize()
    with cuctx.racecheck() as rc:
        x.fill(1.0, stream=cuctx.legacy_stream())
        lib["total"][1, 1, 0, blocking](x, out, N)  # waits for the legacy stream's work
        x.fill(2.0, stream=cuctx.legacy_stream())  # which waits for the blocking stream's
        cuctx.synchronize()
    assert rc.findings == []


def test_a_free_racing_a_use_is_reported(lib):
    s1, s2 = cuctx.Stream(), cuctx.Stream()
    x = cuctx.empty(N, np.float32, stream=s1)
    out = cuctx.zeros(1, np.float32, stream=s2)
    x.fill(1.0, stream=s1)
    cuctx.synchronize()
    with pytest.raises(cuctx.RaceError) as info:
        with cuctx.racecheck():
            line = here() + 3
            # (n = 0: the kernel reads nothing, so the sim's bounds checks stay quiet; the
            # checker sees the whole array passed, as it would for any n)
            lib["total"][1, 1, 0, s2](x, out, 0)
            del x  # freed on s1 while s2 may still read it
    [finding] = info.value.findings
    assert finding.kind == "free while in use"
    assert finding.first.site[1] == line and finding.first.stream is s2
    assert finding.second.stream is s1
    assert "record_stream(s2)" in finding.fix
    cuctx.synchronize()


def test_record_stream_orders_the_free(lib):
    s1, s2 = cuctx.Stream(), cuctx.Stream()
    x = cuctx.empty(N, np.float32, stream=s1)
    out = cuctx.zeros(1, np.float32, stream=s2)
    cuctx.synchronize()
    with cuctx.racecheck() as rc:
        lib["total"][1, 1, 0, s2](x, out, N)
        x.record_stream(s2)
        del x
        y = cuctx.empty(N, np.float32, stream=s1)  # the pool may hand the same bytes back
        y.fill(0.0, stream=s1)
        cuctx.synchronize()
    assert rc.findings == []


@pytest.mark.parametrize("retired", [False, True], ids=["", "after-retiring"])
def test_a_use_after_free_through_another_librarys_array(lib, retired):
    s = cuctx.Stream()
    x = cuctx.empty(N, np.float32, stream=s)
    out = cuctx.zeros(1, np.float32, stream=s)

    class Foreign:  # another library's view of x's memory (CUDA Array Interface)
        __cuda_array_interface__ = {
            "version": 3,
            "shape": (N,),
            "typestr": "<f4",
            "data": (x.ptr, False),
            "strides": None,
            "stream": None,
        }

    view = cuctx.asarray(Foreign())  # does not keep x's memory alive
    cuctx.synchronize()
    with cuctx.racecheck("collect") as rc:
        x.fill(1.0, stream=s)
        del x
        s.synchronize()
        if retired:  # the free has run: what it freed is still known
            retire_history()
        lib["total"][1, 1, 0, s](view, out, 0)  # (n = 0: it reads nothing, see above)
        s.synchronize()
    assert [f.kind for f in rc.findings] == ["use after free"]


def test_annotations_per_kernel_and_per_launch(lib):
    kernel = lib["total"]
    assert kernel.access == ("r", "rw", "rw")  # const float* x: read
    s1, s2 = cuctx.Stream(), cuctx.Stream()
    x = cuctx.zeros(N, np.float32)
    o1, o2 = cuctx.zeros(1, np.float32), cuctx.zeros(1, np.float32)
    cuctx.synchronize()
    with cuctx.racecheck("collect") as rc:
        kernel[1, 1, 0, s1](x, o1, N)  # two readers of x on two streams: no race
        kernel[1, 1, 0, s2](x, o2, N)
        cuctx.launch(lib["init"], 1, 1, x, 1.0, N, stream=s1, access={"x": "r"})  # (a lie)
    assert rc.findings == []
    with pytest.raises(ValueError, match="no parameter called 'y'"):
        kernel.set_access(y="r")
    with pytest.raises(ValueError, match="use 'r', 'w' or 'rw'"):
        kernel.set_access({0: "read"})
    cuctx.synchronize()


def test_a_graph_launch_racing_an_eager_kernel(lib):
    s1, s2 = cuctx.Stream(), cuctx.Stream()
    x = cuctx.empty(N, np.float32)
    out = cuctx.zeros(1, np.float32)
    graph = cuctx.Graph()
    node_line = here() + 1
    graph.launch(lib["init"], N // 256, 256, x, 5.0, N)
    exe = graph.instantiate()
    cuctx.synchronize()
    with cuctx.racecheck("collect") as rc:
        exe.launch(s1)
        lib["total"][1, 1, 0, s2](x, out, N)
        s2.wait(s1)
        exe.launch(s1)  # the next write of x is not ordered after that read
    kinds = [(f.kind, f.first.stream, f.second.stream) for f in rc.findings]
    assert kinds == [("read-after-write", s1, s2), ("write-after-read", s2, s1)]
    assert f"{__file__}:{node_line}" in rc.findings[0].first.what
    cuctx.synchronize()


def test_unordered_nodes_of_one_graph_touching_the_same_bytes(lib):
    x = cuctx.empty(N, np.float32)
    graph = cuctx.Graph()
    first = graph.fill(x, 1.0)
    graph.fill(x, 2.0)  # no after=: the two writes may run in any order
    graph.fill(x[:1], 3.0, after=first)
    exe = graph.instantiate()
    cuctx.synchronize()
    with cuctx.racecheck("collect") as rc:
        exe.launch()
    assert [f.kind for f in rc.findings] == ["unordered nodes of one graph"] * 2
    cuctx.synchronize()


def test_warn_mode_warns_once_per_pair_of_lines(lib):
    s1, s2 = cuctx.Stream(), cuctx.Stream()
    x = cuctx.empty(N, np.float32)
    cuctx.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with cuctx.racecheck("warn") as rc:
            for _ in range(3):
                x.fill(1.0, stream=s1)
                x.fill(2.0, stream=s2)
    races = [w for w in caught if issubclass(w.category, cuctx.RaceWarning)]
    assert len(races) == len(rc.findings) == 2  # s2 after s1, and s1 after s2
    assert "write-after-write" in str(races[0].message)
    cuctx.synchronize()


def test_a_block_lists_nothing_after_it_ends(lib, backend):
    s1, s2 = cuctx.Stream(), cuctx.Stream()
    x = cuctx.empty(N, np.float32)
    with cuctx.racecheck("collect") as rc:
        pass
    # (on the sim the checker watches the whole run: it warns)
    with pytest.warns(cuctx.RaceWarning) if backend.sim is not None else nullcontext():
        x.fill(1.0, stream=s1)
        x.fill(2.0, stream=s2)
    assert rc.findings == []
    cuctx.synchronize()


def test_event_nodes_order_graph_launches(lib):
    """A graph's event wait nodes order its launch after the recording work, its record
    nodes order later waits after its launch."""
    s1, s2 = cuctx.Stream(), cuctx.Stream()
    x, out = cuctx.zeros(N, np.float32), cuctx.zeros(1, np.float32)
    cuctx.synchronize()
    done = cuctx.Event()
    producer, consumer, unordered = cuctx.Graph(), cuctx.Graph(), cuctx.Graph()
    producer.record(done, after=producer.fill(x, 1.0))
    consumer.launch(lib["total"], 1, 1, x, out, N, after=consumer.wait(done))
    unordered.launch(lib["total"], 1, 1, x, out, N)
    produce, consume, race = (g.instantiate() for g in (producer, consumer, unordered))
    with cuctx.racecheck() as rc:
        produce.launch(s1)
        consume.launch(s2)
        s2.synchronize()
        assert out.to_host()[0] == N
    assert rc.findings == []
    with cuctx.racecheck("collect") as rc:
        produce.launch(s1)
        race.launch(s2)
    assert [f.kind for f in rc.findings] == ["read-after-write"]
    cuctx.synchronize()


@pytest.mark.parametrize("wait", ["stream", "event", "context"])
def test_work_queued_while_a_synchronize_waits_is_not_counted_as_seen(lib, wait, monkeypatch):
    """Another thread can queue work while a synchronize waits (the driver call releases the
    GIL): the host has not seen that work finish, so a read unordered after it is a race."""
    s1, s2 = cuctx.Stream(), cuctx.Stream()
    x = cuctx.zeros(N, np.float32, stream=s1)
    out = cuctx.zeros(1, np.float32, stream=s2)
    cuctx.synchronize()
    event = s1.record()
    owner, name, synchronize = {
        "stream": (s1, "_sync", s1.synchronize),
        "event": (cuctx.backend().driver, "cuEventSynchronize", event.synchronize),
        "context": (cuctx.backend().driver, "cuCtxSynchronize", cuctx.synchronize),
    }[wait]
    real = getattr(owner, name)

    def waiting_while_another_thread_writes(*args):
        result = real(*args)
        lib["init"][4, 256, 0, s1](x, 2.0, N)
        s1.record(event)  # (recorded again, after that write)
        return result

    with cuctx.racecheck("collect") as rc:
        monkeypatch.setattr(owner, name, waiting_while_another_thread_writes)
        synchronize()
        monkeypatch.undo()
        lib["total"][1, 1, 0, s2](x, out, N)  # unordered after the write
    assert [f.kind for f in rc.findings] == ["read-after-write"]
    cuctx.synchronize()


def test_memory_another_thread_is_given_while_a_free_runs_is_its_own(lib, monkeypatch):
    """The driver may hand freed memory to another thread's allocation as soon as the free
    is queued; the free is announced before, so the checker does not take the new array's
    memory for the freed one (a use after free on every use of it)."""
    from cuctx.memory import _alloc

    s = cuctx.Stream()
    x = cuctx.zeros(N, np.float32, stream=s)
    freed, given = x.ptr, {}
    real = _alloc._driver_free

    def freeing_while_another_thread_allocates(*args):
        err = real(*args)
        given["y"] = cuctx.empty(N, np.float32, stream=s)
        return err

    with cuctx.racecheck("collect") as rc:
        monkeypatch.setattr(_alloc, "_driver_free", freeing_while_another_thread_allocates)
        del x
        monkeypatch.undo()
        y = given["y"]
        lib["init"][4, 256, 0, s](y, 1.0, N)
        assert y.to_host(stream=s).tolist() == [1.0] * N
    assert y.ptr == freed  # (the memory was handed on, as the driver does on one stream)
    assert rc.findings == []
