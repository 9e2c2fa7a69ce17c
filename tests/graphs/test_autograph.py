"""@cuctx.autograph: results are those of the function run eagerly, whatever AutoGraph does
(eager first call, a build when the structure repeats, replays, patches for new arrays and
scalars, eager calls for what a graph cannot hold); stats and explain say what happened and
where. Sim and GPU."""

from __future__ import annotations

import linecache

import numpy as np
import pytest

import cuctx
from cuctx import KernelArgumentError
from cuctx.graphs import _autograph, _autograph_policy

from scenarios import ADD_SOURCE, add, library_fixture

pytestmark = [pytest.mark.usefixtures("nvrtc_cache", "graphs_pay"), pytest.mark.paths()]

lib = library_fixture(ADD_SOURCE, add=add)
N = 8


def arange(start: float = 0, n: int = N) -> cuctx.DeviceArray:
    return cuctx.to_device(np.arange(start, start + n, dtype=np.float32))


def counts(fn) -> dict:
    s = fn.stats()
    assert s["calls"] == s["replays"] + s["updates"] + s["builds"] + s["eager"]
    return {k: s[k] for k in ("calls", "replays", "updates", "builds", "eager")}


def line(site: str) -> str:
    filename, number = site.rsplit(":", 1)
    assert filename == __file__
    return linecache.getline(filename, int(number)).strip()


def test_new_arrays_each_call_give_eager_results_in_the_callers_arrays(lib):
    k = lib["add"]

    @cuctx.autograph
    def step(out, x, a):
        tmp = cuctx.empty(N, np.float32)  # allocated inside: its address is a value
        k[1, 32](tmp, x, np.float32(a), N)
        k[1, 32](out, tmp, np.float32(a), N)

    outs = []
    for i in range(6):
        out = cuctx.zeros(N, np.float32)
        step(out, arange(10 * i), 0.5)
        outs.append(out)
    for i, out in enumerate(outs):  # every call's result, in the array the caller passed
        np.testing.assert_array_equal(out.to_host(), np.arange(10 * i, 10 * i + N) + 1.0)
    c = counts(step)
    assert c["eager"] == 1 and c["builds"] == 1 and c["replays"] + c["updates"] == 4


def test_eager_first_build_second_replays_after(lib):
    k = lib["add"]
    out, x = cuctx.zeros(N, np.float32), arange()

    @cuctx.autograph
    def step():
        k[1, 32](out, x, np.float32(1), N)
        k[1, 32](out, out, np.float32(1), N)

    step()
    assert counts(step) == dict(calls=1, replays=0, updates=0, builds=0, eager=1)
    step()
    assert counts(step) == dict(calls=2, replays=0, updates=0, builds=1, eager=1)
    step()
    step()
    assert counts(step) == dict(calls=4, replays=2, updates=0, builds=1, eager=1)
    np.testing.assert_array_equal(out.to_host(), np.arange(N) + 2.0)
    reasons = step.stats()["reasons"]
    assert [r["action"] for r in reasons] == ["eager", "build"]
    assert "not seen before" in reasons[0]["reason"]
    assert line(reasons[0]["site"]) == "step()"


def test_a_changed_scalar_patches_the_executable(lib):
    k = lib["add"]
    out, x = cuctx.zeros(N, np.float32), arange()

    @cuctx.autograph
    def step(a):
        k[1, 32](out, x, np.float32(a), N)

    for a in (1, 1, 2, 3):
        step(a)
        np.testing.assert_array_equal(out.to_host(), np.arange(N) + a)
    assert counts(step) == dict(calls=4, replays=0, updates=2, builds=1, eager=1)


def test_a_structure_change_runs_eagerly_then_builds(lib):
    k = lib["add"]
    out, x = cuctx.zeros(N, np.float32), arange()

    @cuctx.autograph
    def step(twice):
        k[1, 32](out, x, np.float32(1), N)
        if twice:
            k[1, 32](out, out, np.float32(1), N)

    step(False)
    step(False)
    step(True)
    assert counts(step) == dict(calls=3, replays=0, updates=0, builds=1, eager=2)
    np.testing.assert_array_equal(out.to_host(), np.arange(N) + 2.0)
    assert "operations, was 1" in step.stats()["reasons"][-1]["reason"]
    step(True)
    step(False)  # its graph is still cached
    assert counts(step) == dict(calls=5, replays=1, updates=0, builds=2, eager=2)
    np.testing.assert_array_equal(out.to_host(), np.arange(N) + 1.0)
    assert step.stats()["graphs"] == 2


@pytest.mark.parametrize("breaker", ["to_host", "synchronize"])
def test_what_a_graph_cannot_hold_runs_the_call_eagerly(lib, breaker):
    k = lib["add"]
    x = arange()

    @cuctx.autograph
    def step(out):
        k[1, 32](out, x, np.float32(1), N)
        if breaker == "to_host":
            host = out.to_host()  # control flow on a device value: a host read
            a = 10.0 if host[0] > 0 else 20.0
        else:
            cuctx.current_stream().synchronize()
            a = 10.0
        k[1, 32](out, out, np.float32(a), N)

    for _ in range(3):
        out = cuctx.zeros(N, np.float32)
        step(out)
        np.testing.assert_array_equal(out.to_host(), np.arange(N) + 11.0)
    assert counts(step) == dict(calls=3, replays=0, updates=0, builds=0, eager=3)
    reason = step.stats()["reasons"][-1]
    expected = {
        "to_host": "host = out.to_host()  # control flow on a device value: a host read",
        "synchronize": "cuctx.current_stream().synchronize()",
    }[breaker]
    assert line(reason["site"]) == expected
    assert ("pageable" if breaker == "to_host" else "Stream.synchronize") in reason["reason"]


def test_forked_and_joined_streams(lib):
    k = lib["add"]
    main, side = cuctx.Stream(), cuctx.Stream()
    x = arange()

    @cuctx.autograph
    def step(left, right, other):
        k[1, 32, 0, main](left, x, np.float32(1), N)
        side.wait(main)  # fork
        k[1, 32, 0, side](right, left, np.float32(1), N)
        k[1, 32, 0, main](other, x, np.float32(10), N)  # concurrent with side's launch
        main.wait(side)  # join
        k[1, 32, 0, main](right, right, np.float32(100), N)

    for _ in range(4):
        left, right, other = (cuctx.zeros(N, np.float32) for _ in range(3))
        main.wait(cuctx.current_stream())  # after the arrays' zero fill
        step(left, right, other)
        main.synchronize()
        np.testing.assert_array_equal(right.to_host(), np.arange(N) + 102.0)
        np.testing.assert_array_equal(other.to_host(), np.arange(N) + 10.0)
    c = counts(step)
    assert c["builds"] == 1 and c["updates"] + c["replays"] == 2


def test_recorded_events_copies_fills_and_host_functions(lib):
    k = lib["add"]
    seen = []
    stream = cuctx.Stream()
    done = cuctx.Event()

    @cuctx.autograph
    def step(out, x):
        scratch = cuctx.empty(N, np.float32, stream=stream)
        scratch.fill(5, stream=stream)
        k[1, 32, 0, stream](scratch, scratch, np.float32(1), N)
        cuctx.copy(out, scratch, stream)
        k[1, 32, 0, stream](out, out, np.float32(0), N)
        out[:2].copy_from(x[:2], stream)
        stream.launch_host_func(seen.append, "ran")
        stream.record(done)

    x = arange(100)
    stream.wait(cuctx.current_stream())  # after x's upload
    for _ in range(4):
        out = cuctx.zeros(N, np.float32, stream=stream)
        step(out, x)
        done.synchronize()
        np.testing.assert_array_equal(out.to_host(stream=stream), [100, 101] + [6] * (N - 2))
    assert seen == ["ran"] * 4
    assert counts(step)["builds"] == 1


def test_the_cache_keeps_at_most_max_graphs(lib):
    k = lib["add"]
    out = cuctx.zeros(N, np.float32)

    @cuctx.autograph(max_graphs=2)
    def step(times):
        for _ in range(times):
            k[1, 32](out, out, np.float32(1), N)

    total = 0
    for times in (1, 1, 2, 2, 3, 3, 1, 1):
        step(times)
        total += times
        assert step.stats()["graphs"] <= 2
    np.testing.assert_array_equal(out.to_host(), np.full(N, total, np.float32))
    assert counts(step)["builds"] == 4  # the first structure was evicted and came back


def test_argument_errors_are_those_of_eager_launches_at_the_users_line(lib):
    k = lib["add"]
    out, x = cuctx.zeros(N, np.float32), arange()

    def step(bad):
        k[1, 32](out, x, np.float32(1), N)
        k[1, 32](out, x, np.float32(1), N, *bad)

    graphed = cuctx.autograph(step)
    graphed(())
    graphed(())
    with pytest.raises(KernelArgumentError) as eager:
        step((1,))
    with pytest.raises(KernelArgumentError) as recorded:
        graphed((1,))
    assert str(recorded.value) == str(eager.value)
    site = graphed.stats()["reasons"][-1]["site"]
    assert line(site) == "k[1, 32](out, x, np.float32(1), N, *bad)"
    assert "raised KernelArgumentError" in graphed.stats()["reasons"][-1]["reason"]
    cuctx.current_stream().synchronize()  # the launch before the error ran, as eagerly
    np.testing.assert_array_equal(out.to_host(), np.arange(N) + 1.0)


def test_graphs_that_cost_more_than_eager_give_way_and_come_back(lib, monkeypatch):
    k = lib["add"]
    out, x = cuctx.zeros(N, np.float32), arange()

    @cuctx.autograph
    def step(a):
        k[1, 32](out, x, np.float32(a), N)

    step(1)
    step(1)  # built
    entry = step._last
    # Measurements decide; make eager calls look free, then expensive.
    monkeypatch.setattr(_autograph, "SWITCH_AFTER", 3)
    monkeypatch.setattr(_autograph_policy, "mean", lambda old, new: new if old is None else old)
    entry.eager_s = 0.0
    for _ in range(_autograph.SWITCH_AFTER):
        step(2)
    assert entry.mode == _autograph.EAGER
    assert "cost more than eager" in step.stats()["reasons"][-1]["reason"]
    eager_before = counts(step)["eager"]
    step(3)
    assert counts(step)["eager"] == eager_before + 1
    entry.eager_s = 1.0  # a second per eager call: graphs pay again
    for _ in range(_autograph.SWITCH_AFTER):
        step(4)
    assert entry.mode == _autograph.GRAPH
    assert any("back to the graph" in r["reason"] for r in step.stats()["reasons"])
    np.testing.assert_array_equal(out.to_host(), np.arange(N) + 4.0)


def test_explain_prints_the_table(lib, capsys):
    k = lib["add"]
    out, x = cuctx.zeros(N, np.float32), arange()

    @cuctx.autograph
    def step():
        k[1, 32](out, x, np.float32(1), N)

    step()
    step()
    text = step.explain()
    assert capsys.readouterr().out == text + "\n"
    assert "autograph" in text and "2 calls" in text and "build" in text
    assert __file__ in text


def test_nested_autograph_records_into_the_outer_call(lib):
    k = lib["add"]
    out, x = cuctx.zeros(N, np.float32), arange()

    @cuctx.autograph
    def inner():
        k[1, 32](out, x, np.float32(1), N)

    @cuctx.autograph
    def outer():
        inner()
        k[1, 32](out, out, np.float32(1), N)

    for _ in range(3):
        outer()
    np.testing.assert_array_equal(out.to_host(), np.arange(N) + 2.0)
    assert counts(inner)["calls"] == 0
    assert counts(outer) == dict(calls=3, replays=1, updates=0, builds=1, eager=1)


def test_a_changed_host_function_argument_updates_the_whole_graph(lib):
    k = lib["add"]
    out, x = cuctx.zeros(N, np.float32), arange()
    seen = []

    @cuctx.autograph
    def step(tag):
        k[1, 32](out, x, np.float32(1), N)
        cuctx.current_stream().launch_host_func(seen.append, tag)

    for tag in ("a", "a", "b", "c"):
        step(tag)
    cuctx.current_stream().synchronize()
    assert seen == ["a", "a", "b", "c"]
    assert counts(step) == dict(calls=4, replays=0, updates=2, builds=1, eager=1)


def test_handing_an_array_to_another_library_runs_the_call_eagerly(lib):
    k = lib["add"]
    out, x = cuctx.zeros(N, np.float32), arange()

    @cuctx.autograph
    def step():
        k[1, 32](out, x, np.float32(1), N)
        return out.__cuda_array_interface__["data"][0]  # what torch.as_tensor(out) reads

    for _ in range(2):
        assert step() == out.ptr
    assert counts(step)["eager"] == 2
    assert "another library" in step.stats()["reasons"][-1]["reason"]
    np.testing.assert_array_equal(out.to_host(), np.arange(N) + 1.0)


# -- temporaries: the memory a call allocates and drops keeps its address ------------------


def test_a_temporary_keeps_its_address_on_every_call(lib):
    k = lib["add"]
    addresses = []

    @cuctx.autograph
    def step(out, x):
        tmp = cuctx.empty(N, np.float32)
        addresses.append(tmp.ptr)
        k[1, 32](tmp, x, np.float32(1), N)
        k[1, 32](out, tmp, np.float32(1), N)

    outs = [cuctx.zeros(N, np.float32) for _ in range(5)]
    for i, out in enumerate(outs):
        step(out, arange(10 * i))
    assert len(set(addresses)) == 1
    for i, out in enumerate(outs):
        np.testing.assert_array_equal(out.to_host(), np.arange(10 * i, 10 * i + N) + 2.0)
    assert step.stats()["temp_bytes"] == N * 4


def fifty_kernel_step(k: cuctx.Kernel) -> cuctx.AutoGraph:
    """The issue's step: 50 kernels, a new input and output array each call, one temporary
    inside (out = x + 50)."""

    @cuctx.autograph
    def step(out, x):
        tmp = cuctx.empty(N, np.float32)
        k[1, 32](tmp, x, np.float32(1), N)
        for _ in range(48):
            k[1, 32](tmp, tmp, np.float32(1), N)
        k[1, 32](out, tmp, np.float32(1), N)

    return step


@pytest.mark.host_timing
def test_a_step_with_a_new_input_output_and_temporary_patches_only_their_nodes(lib):
    """The issue's 50-kernel step: a new input and a new output array each call and one
    temporary inside: the graph calls patch the first and the last node, never the 48
    between them that touch only the temporary. (Patching rather than updating the whole
    graph is a decision from measured costs: on an H100 shared by 16 test processes, the
    checked Python paths updated the whole graph instead, 252 nodes for 6 updates.)"""
    step = fifty_kernel_step(lib["add"])

    kept = []  # every call's input and output stay alive: each has a new address
    for i in range(8):
        out, x = cuctx.empty(N, np.float32), arange(i)
        step(out, x)
        kept.append((out, x))
    s = step.stats()
    assert s["builds"] == 1 and s["updates"] >= 4
    assert s["patched_nodes"] == 2 * s["updates"]
    for i, (out, _) in enumerate(kept):
        np.testing.assert_array_equal(out.to_host(), np.arange(i, i + N) + 50.0)


def test_memory_that_outlives_the_call_is_new_each_call(lib):
    k = lib["add"]
    stored = []

    @cuctx.autograph
    def step(x, a):
        result = cuctx.empty(N, np.float32)  # returned: the caller keeps it
        k[1, 32](result, x, np.float32(a), N)
        scratch = cuctx.empty(N, np.float32)  # stored: outlives the call too
        k[1, 32](scratch, result, np.float32(a), N)
        stored.append(scratch)
        return result

    x = arange()
    results = [step(x, float(a)) for a in range(6)]
    assert len({r.ptr for r in results} | {s.ptr for s in stored}) == 12
    for a, (result, scratch) in enumerate(zip(results, stored)):
        np.testing.assert_array_equal(result.to_host(), np.arange(N) + a)
        np.testing.assert_array_equal(scratch.to_host(), np.arange(N) + 2 * a)


def test_a_returned_array_dropped_by_the_caller_is_lent_again(lib):
    k = lib["add"]

    @cuctx.autograph
    def step(x):
        result = cuctx.empty(N, np.float32)
        k[1, 32](result, x, np.float32(1), N)
        return result

    x = arange()
    first = step(x)
    ptr = first.ptr
    second = step(x)  # `first` is alive: new memory
    assert second.ptr != ptr
    np.testing.assert_array_equal(first.to_host(), np.arange(N) + 1.0)
    del first
    third = step(x)  # its memory came back to the function when the caller dropped it
    assert third.ptr == ptr
    np.testing.assert_array_equal(third.to_host(), np.arange(N) + 1.0)
    np.testing.assert_array_equal(second.to_host(), np.arange(N) + 1.0)


def test_clear_gives_the_memory_of_temporaries_back(lib):
    k = lib["add"]

    @cuctx.autograph
    def step(out, x):
        tmp = cuctx.empty(1024, np.float32)
        k[1, 32](tmp, x, np.float32(1), N)
        k[1, 32](out, tmp, np.float32(1), N)

    out, x = cuctx.zeros(N, np.float32), arange()
    for _ in range(3):
        step(out, x)
    assert step.stats()["temp_bytes"] == 4096
    step.clear()
    assert step.stats()["temp_bytes"] == 0
    step(out, x)  # and a call after it works
    np.testing.assert_array_equal(out.to_host(), np.arange(N) + 2.0)


def test_a_temporary_used_on_a_second_stream_is_right_under_the_race_checker(lib):
    k = lib["add"]
    side = cuctx.Stream()

    @cuctx.autograph
    def step(out, x):
        tmp = cuctx.empty(N, np.float32)
        k[1, 32](tmp, x, np.float32(1), N)
        side.wait(cuctx.current_stream())
        k[1, 32, 0, side](out, tmp, np.float32(1), N)
        tmp.record_stream(side)  # its memory is not lent again before side's work ran
        cuctx.current_stream().wait(side)

    outs = []
    with cuctx.racecheck("raise"):
        for i in range(6):
            out = cuctx.zeros(N, np.float32)
            step(out, arange(i))
            outs.append(out)
        cuctx.synchronize()
    for i, out in enumerate(outs):
        np.testing.assert_array_equal(out.to_host(), np.arange(i, i + N) + 2.0)
    assert counts(step)["builds"] == 1


# -- the policy: modelled costs on the sim decide as an H100's measured ones ----------------


def decoding_like(k):
    """The issue's decoding-like loop: 5-8 small kernels, a temporary inside, a scalar and
    the output array new every call, a new structure every 16 calls."""

    @cuctx.autograph
    def token(out, x, n):
        tmp = cuctx.empty(N, np.float32)
        k[1, 32](tmp, x, np.float32(n), N)
        for _ in range(3 + (n // 16) % 4):
            k[1, 32](tmp, tmp, np.float32(1), N)
        k[1, 32](out, tmp, np.float32(n), N)

    x, outs = arange(), []
    for n in range(64):
        out = cuctx.empty(N, np.float32)
        token(out, x, n)
        outs.append(out)
    for n, out in enumerate(outs):
        np.testing.assert_array_equal(out.to_host(), np.arange(N) + 2 * n + 3 + (n // 16) % 4)
    return token.stats()


def decisions(stats: dict) -> tuple:
    return (
        counts_of(stats),
        stats["patched_nodes"],
        [(r["call"], r["action"], r["reason"]) for r in stats["reasons"]],
    )


def mostly_graphed(stats: dict, backend) -> None:
    """More calls served by graphs than eagerly. On a GPU the policy decides from the costs
    this process measured, and in a test process the builds of the tests before estimate a
    small build at about 330 us (two H200s; the benchmark's own fit: 180 us and 5 us a node,
    1.7x the C program's capture + instantiate of a long chain). At that, graphs pay for
    these loops only just, or not yet: an expected failure until builds are as fast as the
    AutoGraph issue asks."""
    if stats["replays"] + stats["updates"] + stats["builds"] > stats["eager"]:
        return
    if backend.sim is None:
        pytest.xfail(
            "the builds this process measured do not pay for this loop (issue 22, "
            f"item 2: builds at most 1.5x the C program's)\n{said(stats)}"
        )
    raise AssertionError(said(stats))


def said(stats: dict) -> str:
    """The counts and each decision's reason, for a failure's message (on a GPU they come
    from the costs measured there)."""
    return "\n".join(
        [str(counts_of(stats))]
        + [f"call {r['call']}: {r['action']}: {r['reason']}" for r in stats["reasons"]]
    )


def counts_of(stats: dict) -> dict:
    return {k: stats[k] for k in ("calls", "replays", "updates", "builds", "eager")}


@pytest.mark.host_timing
def test_a_decoding_like_loop_runs_mostly_as_graph_calls(lib, backend, costs_decide):
    s = decoding_like(lib["add"])
    mostly_graphed(s, backend)
    if backend.sim is not None:  # modelled costs: an H100's decisions, the same every run
        # The first structure (5 kernels): 8 eager calls (with nothing learnt yet it is
        # expected to last as long as it has so far, and a graph saving about 21 us a call
        # pays its build of about 188 us from the 9th: an H100's costs), then a build and
        # 7 calls patching it; each later one: 1 eager call, then (this function's structures
        # last 16 calls) a build at its 2nd and 14 calls patching the 2 nodes that take the
        # scalar and the output.
        assert counts_of(s) == dict(calls=64, replays=0, updates=49, builds=4, eager=11)
        assert s["patched_nodes"] == 2 * 49
        assert decisions(decoding_like(lib["add"])) == decisions(s)


@pytest.mark.host_timing
def test_the_50_kernel_step_runs_mostly_as_graph_calls(lib, backend, costs_decide):
    step = fifty_kernel_step(lib["add"])

    kept = []
    for i in range(20):
        out, x = cuctx.empty(N, np.float32), arange(i)
        step(out, x)
        kept.append((out, x))
    s = step.stats()
    mostly_graphed(s, backend)
    if backend.sim is not None:  # a graph saves ~176 us a call, its build takes ~479 us (an
        # H100's costs): it pays over the 3 calls seen at the 3rd
        assert counts_of(s) == dict(calls=20, replays=0, updates=17, builds=1, eager=2)
        assert s["patched_nodes"] == 2 * 17
    np.testing.assert_array_equal(kept[-1][0].to_host(), np.arange(19, 19 + N) + 50.0)


def test_the_decoding_example_prints_the_same_short_output_on_every_run(sim, capsys, costs_decide):
    from cuctx.examples import decoding_loop

    decoding_loop.main(tokens=70)
    first = capsys.readouterr().out
    decoding_loop.main(tokens=70)
    assert capsys.readouterr().out == first
    assert len(first.splitlines()) <= 16
    assert "outputs of eager and AutoGraph: equal" in first
    # The first structure is built at its 3rd call (a graph of 32 small kernels saves ~116 us
    # a call and its build takes ~340 us, an H100's costs), the second at its 2nd call, for
    # the first lasted 64.
    assert "AutoGraph: 70 calls: 65 patched (8 nodes each), 0 replayed, 2 builds, 3 eager" in first


# -- the per-call path: compiled where the backend has it, the Python path its reference -----


def test_graph_calls_patch_and_launch_through_the_compiled_path_where_there_is_one(lib, backend):
    k = lib["add"]

    @cuctx.autograph
    def step(out, x):
        k[1, 32](out, x, np.float32(1), N)
        k[1, 32](out, out, np.float32(1), N)

    outs = [cuctx.zeros(N, np.float32) for _ in range(4)]
    for i, out in enumerate(outs):
        step(out, arange(i))
    patcher = step._last.patcher
    assert (type(patcher).__name__ == "Patcher") == (backend.native is not None)
    for i, out in enumerate(outs):
        np.testing.assert_array_equal(out.to_host(), np.arange(i, i + N) + 2.0)
    assert step.stats()["patched_nodes"] == 2 * 2  # both nodes take the new arrays


def test_a_refused_patch_rebuilds_the_graph_on_both_paths(lib, backend, monkeypatch):
    from cuctx._driver.sim._common import INVALID_VALUE
    from cuctx._driver.sim._graph_exec import GraphExecModel

    if backend.sim is None:
        pytest.skip("the sim's driver is made to refuse a patch")
    k = lib["add"]

    @cuctx.autograph
    def step(out, x):
        k[1, 32](out, x, np.float32(1), N)

    outs = [cuctx.zeros(N, np.float32) for _ in range(4)]
    step(outs[0], arange(0))
    step(outs[1], arange(1))  # built
    set_work = GraphExecModel._set_exec_work
    refusals = []

    def refuse_once(self, *args):
        if not refusals:
            refusals.append(args)
            return (INVALID_VALUE,)
        return set_work(self, *args)

    monkeypatch.setattr(GraphExecModel, "_set_exec_work", refuse_once)
    step(outs[2], arange(2))  # the patch is refused: a new graph
    step(outs[3], arange(3))  # and the next call patches that one
    assert refusals and "rebuilt: the update was refused" in step.stats()["reasons"][-1]["reason"]
    assert counts(step) == dict(calls=4, replays=0, updates=1, builds=2, eager=1)
    for i, out in enumerate(outs):
        np.testing.assert_array_equal(out.to_host(), np.arange(i, i + N) + 1.0)


# -- inside a stream capture ------------------------------------------------------------------


def test_a_call_inside_a_capture_puts_its_work_into_the_capture(lib):
    k = lib["add"]
    s = cuctx.Stream()

    @cuctx.autograph
    def step(out, x):
        tmp = cuctx.empty(N, np.float32, stream=s)
        k[1, 32, 0, s](tmp, x, np.float32(1), N)
        k[1, 32, 0, s](out, tmp, np.float32(1), N)

    x = cuctx.to_device(np.arange(N, dtype=np.float32), stream=s)
    for _ in range(3):  # built, and served by its graph
        step(cuctx.zeros(N, np.float32, stream=s), x)
    out = cuctx.zeros(N, np.float32, stream=s)
    with s.capture() as graph:
        step(out, x)
    assert [n.kind for n in graph.nodes].count("kernel") == 2
    assert "being captured" in step.stats()["reasons"][-1]["reason"]
    exe = graph.instantiate()
    for _ in range(2):
        exe.launch(s)
    s.synchronize()
    np.testing.assert_array_equal(out.to_host(), np.arange(N) + 2.0)
    step(out, x)  # and after the capture, its graph again
    assert counts(step)["replays"] + counts(step)["updates"] >= 2


@pytest.mark.parametrize("mode", ["thread_local", "global", "relaxed"])
def test_no_graph_is_built_while_a_capture_forbids_instantiating_one(lib, mode):
    """The call's streams are not captured, but this thread captures another one: building
    a graph would instantiate it, which a "thread_local" or "global" capture forbids (on a
    GPU the driver would invalidate the capture). The call runs eagerly and the capture
    goes on; a "relaxed" capture allows the build."""
    k = lib["add"]
    s, captured = cuctx.Stream(), cuctx.Stream()

    @cuctx.autograph
    def step(out, x):
        k[1, 32, 0, s](out, x, np.float32(1), N)

    x = cuctx.to_device(np.arange(N, dtype=np.float32), stream=s)
    outs = [cuctx.zeros(N, np.float32, stream=s) for _ in range(3)]
    y = cuctx.zeros(N, np.float32, stream=captured)
    step(outs[0], x)  # a structure seen for the first time: eager
    with captured.capture(mode) as graph:
        k[1, 32, 0, captured](y, y, np.float32(1), N)
        step(outs[1], x)  # it repeats: a build, unless the capture forbids it
    builds = counts(step)["builds"]
    assert builds == (1 if mode == "relaxed" else 0)
    if not builds:
        assert "forbids instantiating" in step.stats()["reasons"][-1]["reason"]
    step(outs[2], x)  # after the capture
    assert counts(step)["builds"] == 1
    graph.instantiate().launch(captured)  # the capture made its graph
    captured.synchronize()
    s.synchronize()
    assert y.to_host().tolist() == [1.0] * N
    for out in outs:
        np.testing.assert_array_equal(out.to_host(), np.arange(N) + 1.0)


def test_a_function_that_enqueues_nothing_runs_as_itself(lib):
    calls = []

    @cuctx.autograph
    def nothing(value):
        calls.append(value)
        return value

    assert [nothing(i) for i in range(4)] == [0, 1, 2, 3] == calls
    assert counts(nothing)["eager"] == 4
    assert "enqueues no work" in nothing.stats()["reasons"][-1]["reason"]


def test_generator_and_async_functions_are_refused_at_decoration():
    """Their bodies run after the call returns, outside what AutoGraph records."""

    def steps():
        yield

    async def step():
        pass

    async def stream_of_steps():
        yield

    for fn, what in (
        (steps, "a generator function"),
        (step, "an async function"),
        (stream_of_steps, "an async generator function"),
    ):
        refused = f"autograph: '{fn.__qualname__}' is {what}: calling it returns"
        with pytest.raises(TypeError, match=refused.replace(".", r"\.")):
            cuctx.autograph(fn)
        with pytest.raises(TypeError, match=what):
            cuctx.autograph(max_graphs=2)(fn)


def test_threads_calling_one_function_get_their_own_results(lib):
    import threading

    k = lib["add"]

    @cuctx.autograph
    def step(out, x, stream):
        tmp = cuctx.empty(N, np.float32, stream=stream)  # both threads' calls borrow memory
        k[1, 32, 0, stream](tmp, x, np.float32(1), N)
        k[1, 32, 0, stream](out, tmp, np.float32(1), N)

    results: dict[int, list] = {}
    ctx = cuctx.current_context()

    def work(t: int) -> None:
        with ctx:
            stream = cuctx.Stream()
            outs, inputs = [], []  # inputs made on another stream: kept until the work ran
            for i in range(8):
                out = cuctx.zeros(N, np.float32, stream=stream)
                inputs.append(arange(100 * t + i))
                stream.wait(cuctx.current_stream())  # after its upload
                step(out, inputs[-1], stream)
                outs.append(out)
            stream.synchronize()
            results[t] = [o.to_host() for o in outs]

    threads = [threading.Thread(target=work, args=(t,)) for t in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for t in range(2):
        for i, host in enumerate(results[t]):
            np.testing.assert_array_equal(host, np.arange(100 * t + i, 100 * t + i + N) + 2.0)
