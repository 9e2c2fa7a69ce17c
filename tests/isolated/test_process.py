"""IsolatedExecutor with worker processes on the sim: calls run in workers with their device
current; faults, hangs and deaths cost one worker, which is replaced; nothing is retried;
the caller and the other workers go on. Workers take about a second to start here, so most
tests share one executor (each leaves it with every worker ready)."""

from __future__ import annotations

import concurrent.futures
import os
import sys
import threading
import time
import warnings

import numpy as np
import pytest

import cuctx

import calls

# The module shares one executor: one worker of pytest -n runs it (--dist loadgroup).
pytestmark = [pytest.mark.usefixtures("sim"), pytest.mark.xdist_group("process")]


@pytest.fixture(scope="module")
def ex():
    cuctx.set_backend("sim")
    with cuctx.IsolatedExecutor() as executor:
        yield executor


def pids(ex) -> dict[int, int | None]:
    return {w.device: w.pid for w in ex.workers}


def settled(ex) -> dict[int, int]:
    """The workers' pids once every slot has a ready worker (a call on each device)."""
    for device in ex.devices:
        ex.options(device=device).submit(calls.where).result()
    return pids(ex)


def test_a_call_runs_in_a_worker_with_its_device_current(ex):
    for device in (0, 1):
        pid, current = ex.options(device=device).submit(calls.where).result()
        assert pid != os.getpid() and current == device
        assert pids(ex)[device] == pid
    assert list(ex.map(calls.square, range(5))) == [0, 1, 4, 9, 16]
    assert ex.submit(lambda x: x + 1, 41).result() == 42  # by value: not importable
    assert [w.device for w in ex.workers] == [0, 1]


def test_an_exception_of_the_call_propagates_and_costs_no_worker(ex):
    before = settled(ex)
    with pytest.raises(ValueError, match="bad input") as info:
        ex.options(device=0).submit(calls.raise_value_error, "bad input").result()
    remote = str(info.value.__cause__)  # the worker's traceback, as text
    assert "raise_value_error" in remote and "raise ValueError(text)" in remote
    assert pids(ex) == before and [w.replaced for w in ex.workers] == [0, 0]


def test_a_fault_costs_its_worker_only(ex):
    before = settled(ex)
    mine = cuctx.to_device(np.arange(4.0))  # the caller's own CUDA work
    with pytest.raises(cuctx.WorkerFaultError) as info:
        ex.options(device=0).submit(calls.store_to, 0).result()
    fault = info.value
    assert isinstance(fault, cuctx.StickyFaultError)
    assert fault.name == "CUDA_ERROR_ILLEGAL_ADDRESS" and fault.code == 700
    assert (fault.device, fault.worker, fault.call) == (0, before[0], "store_to")
    assert "store_to" in str(fault) and str(before[0]) in str(fault)
    assert "store" in str(fault.__cause__)  # where the worker met it
    pid, device = ex.options(device=0).submit(calls.where).result()
    assert pid not in before.values() and device == 0
    assert pids(ex)[1] == before[1]  # the other device's worker went on
    assert [w.replaced for w in ex.workers] == [1, 0]
    assert mine.to_host().tolist() == [0.0, 1.0, 2.0, 3.0]


@pytest.mark.parametrize(
    "fn", [calls.inject_fault, calls.fault_and_catch, calls.fault_in_own_context]
)
def test_a_fault_ends_the_worker_however_the_call_met_it(ex, fn):
    # at the worker's synchronize after the call; caught by the call; in a context it made
    before = settled(ex)
    with pytest.raises(cuctx.WorkerFaultError) as info:
        ex.options(device=1).submit(fn).result()
    assert info.value.sticky and info.value.device == 1
    assert ex.options(device=1).submit(calls.where).result()[0] != before[1]


def test_a_wait_with_a_timeout_gives_up_and_the_call_goes_on(ex):
    # result() reads the worker's answer in the waiting thread: it stops at its timeout
    # without a trace, and a later wait (or the slot's own thread) gets the answer.
    before = settled(ex)
    call = ex.options(device=0).submit(calls.sleep, 1.0)
    with pytest.raises(TimeoutError):
        call.result(timeout=0.05)
    with pytest.raises(TimeoutError):
        call.exception(timeout=0.05)
    assert call.result() == 1.0 and call.exception() is None and pids(ex) == before


def done_soon(future, seconds: float = 60) -> bool:
    """Whether ``future`` is done within ``seconds``, waited for without reading it."""
    deadline = time.monotonic() + seconds
    while not future.done() and time.monotonic() < deadline:
        time.sleep(0.001)
    return future.done()


def test_answers_no_caller_reads_itself_come_all_the_same(ex):
    # The slot's thread reads them, woken by the worker: at once while callers read few
    # answers themselves, after a grace once they did (a caller may be late to say so).
    settled(ex)
    on0 = ex.options(device=0)
    for _ in range(3):
        assert [on0.submit(calls.square, 3).result() for _ in range(12)] == [9] * 12
        lone = on0.submit(calls.square, 4)  # nobody reads it: polled with done()
        assert done_soon(lone) and lone.result() == 16
    futures = [on0.submit(calls.square, i) for i in range(20)]
    done = concurrent.futures.as_completed(futures, timeout=60)
    assert sorted(f.result() for f in done) == [i * i for i in range(20)]
    waited = on0.submit(calls.square, 5)
    assert waited in concurrent.futures.wait([waited], timeout=60).done


def test_a_wait_that_gives_up_leaves_the_answer_to_the_slot(ex):
    before = settled(ex)
    call = ex.options(device=0).submit(calls.sleep, 0.3)
    with pytest.raises(TimeoutError):
        call.result(timeout=0.05)
    assert done_soon(call) and call.result() == 0.3 and pids(ex) == before


def test_a_wait_for_a_call_no_worker_took_yet_reads_its_answer(ex):
    # The second call waits for the first one's worker: its waiter waits until it is sent,
    # then reads its answer itself; a timeout still counts from the wait's start.
    before = settled(ex)
    on0 = ex.options(device=0)
    first, second = on0.submit(calls.sleep, 0.3), on0.submit(calls.square, 6)
    with pytest.raises(TimeoutError):
        second.result(timeout=0.05)
    assert second.result(timeout=60) == 36 and first.result() == 0.3
    third, fourth = on0.submit(calls.sleep, 0.1), on0.submit(calls.square, 7)
    # (The fourth is sent before the third's future resolves, so that a done-callback of the
    # third may wait for another call: the fourth may be done first, by a moment.)
    assert fourth.exception() is None and fourth.result() == 49
    assert third.result(timeout=60) == 0.1
    assert pids(ex) == before


def test_a_done_callback_may_wait_for_another_call_of_the_same_worker(ex):
    settled(ex)
    on0, seen = ex.options(device=0), []
    first = on0.submit(calls.square, 2)
    first.add_done_callback(lambda f: seen.append(on0.submit(calls.square, 3).result()))
    assert first.result() == 4
    deadline = time.monotonic() + 60
    while not seen and time.monotonic() < deadline:  # the callback runs in the thread that
        time.sleep(0.01)  # resolved the call: this one, or the slot's
    assert seen == [9]


def test_a_call_past_its_timeout_kills_its_worker(ex):
    before = settled(ex)
    slow = ex.options(device=0, timeout=0.5)
    with pytest.raises(cuctx.WorkerTimeoutError) as info:
        slow.submit(calls.sleep, 60).result()
    assert isinstance(info.value, TimeoutError)
    assert (info.value.device, info.value.worker, info.value.timeout) == (0, before[0], 0.5)
    assert (before[0], "Z") not in calls.children(os.getpid())  # reaped
    assert slow.submit(calls.sleep, 0).result() == 0  # a new worker, same options
    assert pids(ex)[0] != before[0]


@pytest.mark.parametrize(
    "fn, how",
    [
        ((calls.exit_with, 3), "exit status 3"),
        ((calls.kill_self,), "signal SIGKILL"),
        # as they would end a Python program:
        ((calls.sys_exit, 4), "exit status 4"),
        ((calls.sys_exit, "a message"), "exit status 1"),
        ((calls.sys_exit, None), "exit status 0"),
        ((calls.interrupt,), "signal SIGINT"),
    ],
)
def test_any_other_death_is_worker_died_error(ex, fn, how):
    before = settled(ex)
    with pytest.raises(cuctx.WorkerDiedError) as info:
        ex.options(device=1).submit(*fn).result()
    assert info.value.how == how and info.value.worker == before[1]
    assert info.value.started and f"died ({how}): a new worker takes its place" in str(info.value)
    assert (before[1], "Z") not in calls.children(os.getpid())  # reaped
    assert ex.options(device=1).submit(calls.square, 3).result() == 9


def test_a_base_exception_that_ends_no_program_is_the_calls_exception(ex):
    before = settled(ex)
    with pytest.raises(calls.Stop, match="stopped"):
        ex.options(device=0).submit(calls.raise_stop).result()
    assert pids(ex) == before


def test_a_worker_traceback_names_the_callers_file_and_line(ex):
    def fails():  # a local function: it goes by value (cloudpickle)
        raise ValueError("where?")

    with pytest.raises(ValueError, match="where") as info:
        ex.submit(fails).result()
    line = fails.__code__.co_firstlineno + 1
    assert f'File "{__file__}", line {line}, in fails' in str(info.value.__cause__)
    assert 'raise ValueError("where?")' in str(info.value.__cause__)  # its source line too


def test_a_race_warning_in_a_worker_names_the_callers_file_and_line(ex):
    def racy():  # by value, as above
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            with cuctx.racecheck("warn"):
                s = cuctx.Stream()
                x = cuctx.zeros(64, np.float32)  # on the legacy stream
                x.fill(2.0, stream=s)  # no wait: a race
                cuctx.synchronize()
        return [(w.category.__name__, w.filename, w.lineno) for w in seen]

    line = racy.__code__.co_firstlineno + 6
    assert ex.submit(racy).result() == [("RaceWarning", __file__, line)]


def test_nothing_is_retried_and_waiting_calls_go_to_the_new_worker(ex, tmp_path):
    settled(ex)
    on0 = ex.options(device=0)
    dying = on0.submit(calls.count_then, str(tmp_path / "runs"), calls.kill_self)
    waiting = [on0.submit(calls.square, i) for i in range(3)]
    with pytest.raises(cuctx.WorkerDiedError):
        dying.result()
    assert [f.result() for f in waiting] == [0, 1, 4]
    assert (tmp_path / "runs").read_text() == "ran\n"  # once


def test_other_workers_serve_while_one_hangs(ex):
    settled(ex)
    hung = ex.options(device=0, timeout=3).submit(calls.sleep, 60)
    assert [ex.options(device=1).submit(calls.square, i).result() for i in range(3)] == [0, 1, 4]
    assert not hung.done()
    with pytest.raises(cuctx.WorkerTimeoutError):
        hung.result()


def test_results_that_cannot_go_back_are_the_calls_error(ex):
    before = settled(ex)
    with pytest.raises(TypeError, match=r"device_array returned a DeviceArray.*to_host\(\)"):
        ex.options(device=0).submit(calls.device_array).result()
    assert pids(ex) == before


def test_arguments_that_cannot_go_are_refused_by_submit(ex, sim):
    with pytest.raises(
        TypeError,
        match="cannot send argument 0 of square to a worker process: "
        "cannot pickle '_thread.lock' object",
    ):
        ex.submit(calls.square, threading.Lock())
    with pytest.raises(
        TypeError,
        match=r"argument 0 of square .*MemoryPool\(device, "
        r"ipc=True\).*to_host\(\)",
    ):
        ex.submit(calls.square, cuctx.zeros(4))
    with pytest.raises(TypeError, match="needs a callable"):
        ex.submit(42)


def test_cuctx_objects_that_cannot_go_are_named_with_the_way(ex, sim):
    library = cuctx.Library.from_bytes(calls.STORE_PTX, sim_kernels={"store": calls.store})
    kernel, stream = library["store"], cuctx.Stream()
    way = "Make such objects in the worker instead (load the Library"
    for (args, kwargs), where, what in [
        (((kernel,), {}), "argument 0 of square", "Kernel"),
        (((1, library), {}), "argument 1 of square", "Library"),
        (((), {"x": stream}), "the keyword argument x= of square", "Stream"),
        ((([1, {"a": cuctx.Event()}],), {}), "argument 0 of square", "Event"),
        (((cuctx.current_context(),), {}), "argument 0 of square", "Context"),
    ]:
        with pytest.raises(TypeError) as info:
            ex.submit(calls.square, *args, **kwargs)
        text = str(info.value)  # cuctx's words, or the object's own refusal that names it
        assert text.startswith(f"cannot send {where} to a worker process: ") and what in text
        if f"is a cuctx.{what}, which lives in this process" in text:
            assert way in text

    def launch():  # by value, with what it uses
        kernel[1, 1](0)

    with pytest.raises(TypeError, match=r"cannot send \S*launch \(it uses kernel\) .*Kernel"):
        ex.submit(launch)


def test_settings_are_checked():
    cuctx.set_backend("sim")
    for kwargs, match in [
        ({"engine": "threads"}, "engine must be one of"),
        ({"workers_per_device": 0}, "workers_per_device"),
        ({"timeout": -1}, "timeout must be"),
        ({"timeout": float("nan")}, "timeout must be"),
        ({"devices": [7]}, "there is no device 7"),
        ({"devices": [-1]}, "there is no device -1"),
        ({"devices": [0, 0]}, "twice"),
        ({"devices": []}, "none was given"),
        ({"address": "auto"}, "needs engine='ray'"),
    ]:
        with pytest.raises(ValueError, match=match):
            cuctx.IsolatedExecutor(**kwargs)
    # the wrong kind of value: what was given, and what is accepted
    for kwargs, match in [
        (
            {"devices": 0},
            r"devices is a list of ordinals or cuctx.Device objects "
            r"\(devices=\[0\] for device 0 alone\), or None for every "
            r"device; not the int 0",
        ),
        ({"devices": cuctx.Device(1)}, r"devices is a list .* not the Device <Device 1"),
        ({"devices": "01"}, r"devices is a list .* not the str '01'"),
        (
            {"devices": ["0"]},
            r"a device is a cuctx.Device or an ordinal \(int\), not the "
            r"str '0'",
        ),
        ({"devices": [True]}, "a device is .* not the bool True"),
        ({"engine": None}, "engine is 'process' or 'ray', not the NoneType None"),
        (
            {"workers_per_device": 1.5},
            "workers_per_device is a whole number >= 1, not the float 1.5",
        ),
        ({"standby": 1}, "standby is True or False, not the int 1"),
        ({"timeout": "5"}, "timeout is a number of seconds > 0, or None; not the str '5'"),
        (
            {"engine": "ray", "address": 6379},
            "address is a Ray cluster's address, a str .* not the int 6379",
        ),
    ]:
        with pytest.raises(TypeError, match=match):
            cuctx.IsolatedExecutor(**kwargs)


def test_options_are_checked_and_chain(ex):
    with pytest.raises(ValueError, match="device 5 is not one of this executor's devices"):
        ex.options(device=5)
    with pytest.raises(ValueError, match="timeout must be"):
        ex.options(timeout=0)
    view = ex.options(device=cuctx.Device(1)).options(timeout=30)
    assert (view._device, view._timeout) == (1, 30.0)
    assert list(view.map(calls.square, [2, 3])) == [4, 9]


def test_the_ray_engine_without_ray_names_the_extra(monkeypatch):
    cuctx.set_backend("sim")
    monkeypatch.setitem(sys.modules, "ray", None)  # as if it were not installed
    with pytest.raises(ImportError, match=r"pip install 'cuctx\[ray\]'"):
        cuctx.IsolatedExecutor(engine="ray")


def test_arrays_of_an_ipc_pool_are_the_same_memory_in_the_worker(ex, sim):
    pool = cuctx.MemoryPool(0, ipc=True)
    array = cuctx.to_device(np.arange(6.0), pool=pool)
    assert ex.options(device=0).submit(calls.add_one, array).result() == (6,)
    assert array.to_host().tolist() == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    # a view is its part of the same memory; another device's worker reaches it too
    assert ex.options(device=1).submit(calls.add_one, array[2:4]).result() == (2,)
    assert array.to_host().tolist() == [1.0, 2.0, 4.0, 5.0, 5.0, 6.0]


def test_a_fault_leaves_the_shared_array_usable_with_what_was_written(ex, sim):
    pool = cuctx.MemoryPool(0, ipc=True)
    array = cuctx.zeros(4, pool=pool)
    with pytest.raises(cuctx.WorkerFaultError):
        ex.options(device=0).submit(calls.write_then_fault, array, 9.0).result()
    assert array.to_host().tolist() == [9.0] * 4  # written before the fault: it stays
    array.fill(1.0)
    assert array.to_host().tolist() == [1.0] * 4
    del array
    # The executor holds the array until the faulted worker is reaped (importers free
    # first); a call served by the replacement comes after that.
    ex.options(device=0).submit(calls.square, 1).result()
    cuctx.synchronize()  # the free is stream-ordered
    assert pool.used == 0
