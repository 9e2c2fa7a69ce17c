"""IsolatedExecutor's lifecycle on the sim: shutdown as concurrent.futures documents it, no
descriptor or process left behind after fault cycles, warm standbys, a worker that cannot
start. Each test makes its own executor (and no other is alive while it counts)."""

from __future__ import annotations

import concurrent.futures
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import cuctx
from cuctx.isolated import _spawn
from scenarios import child_env

import calls


def zombies() -> list[int]:
    return [pid for pid, state in calls.children(os.getpid()) if state == "Z"]


def alive(pid: int) -> bool:
    return os.path.exists(f"/proc/{pid}")


def state(pid: int) -> str:
    """A process's state letter (R, S, Z, ...), from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def test_shutdown_without_waiting_cancels_what_waits_and_leaves_nothing():
    cuctx.set_backend("sim")
    fds = calls.open_fds()
    ex = cuctx.IsolatedExecutor(devices=[0])
    running = ex.submit(calls.sleep, 1.5)
    while not running.running():  # handed to the worker once it has started
        time.sleep(0.01)
    waiting = [ex.submit(calls.square, i) for i in range(3)]
    ex.shutdown(wait=False, cancel_futures=True)
    assert all(f.cancelled() for f in waiting)
    with pytest.raises(RuntimeError, match="after shutdown"):
        ex.submit(calls.square, 1)
    assert running.result() == 1.5  # what ran is not cancelled
    worker = ex.workers[0].pid
    for slot in ex._core.slots:  # the workers exit by themselves once their calls are done
        slot.thread.join(timeout=60)
    assert not (worker and alive(worker)) and zombies() == []
    assert ex.workers[0].pid is None
    assert calls.open_fds() == fds


def test_fault_cycles_leave_no_descriptor_and_no_process():
    cuctx.set_backend("sim")
    fds = calls.open_fds()
    lost = []
    with cuctx.IsolatedExecutor(devices=[0]) as ex:
        for _ in range(3):
            with pytest.raises(cuctx.WorkerFaultError) as info:
                ex.submit(calls.inject_fault).result()
            lost.append(info.value.worker)
        last = ex.submit(calls.where).result()[0]
        assert ex.workers[0].replaced == 3
        # (a faulted worker is reaped once its replacement has its next call: now, or soon)
    assert not any(alive(pid) for pid in [*lost, last]) and zombies() == []
    assert calls.open_fds() == fds


def test_workers_per_device_serve_at_once_and_a_standby_replaces_a_lost_one():
    cuctx.set_backend("sim")
    with cuctx.IsolatedExecutor(devices=[0], workers_per_device=2, standby=True) as ex:
        assert [w.device for w in ex.workers] == [0, 0]
        both = [ex.submit(calls.sleep_then_where, 1.0) for _ in range(2)]
        first = {f.result()[0] for f in both}
        assert len(first) == 2  # two workers, one call each
        # Clock ticks since boot, as /proc gives process start times: the standby started
        # with the executor, long before this; a worker started cold would start after.
        before_fault = int(time.clock_gettime(time.CLOCK_BOOTTIME) * os.sysconf("SC_CLK_TCK"))
        with pytest.raises(cuctx.WorkerFaultError) as info:
            ex.submit(calls.inject_fault).result()
        assert info.value.worker in first
        new = []
        for _ in range(100):
            new = [w.pid for w in ex.workers if w.pid is not None and w.pid not in first]
            if new:
                break
            time.sleep(0.05)
        assert len(new) == 1 and calls.started_at(new[0]) < before_fault


def test_a_worker_that_cannot_start_breaks_the_executor(monkeypatch):
    cuctx.set_backend("sim")
    monkeypatch.setattr(_spawn, "_BOOT", "import sys; sys.exit(5)")
    ex = cuctx.IsolatedExecutor(devices=[0])
    future = ex.submit(calls.square, 2)
    with pytest.raises(
        cuctx.WorkerDiedError,
        match=r"could not start \(it exited before "
        r"saying why \(exit status 5",
    ):
        future.result(timeout=60)
    with pytest.raises(concurrent.futures.BrokenExecutor, match="exit status 5"):
        ex.submit(calls.square, 2)
    ex.shutdown()
    assert zombies() == []


def test_the_error_of_a_worker_that_cannot_start_is_the_workers_own(monkeypatch, tmp_path):
    # A broken environment the workers inherit: a numpy on PYTHONPATH that cannot import.
    (tmp_path / "numpy").mkdir()
    (tmp_path / "numpy" / "__init__.py").write_text("raise ImportError('a broken numpy')\n")
    cuctx.set_backend("sim")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    ex = cuctx.IsolatedExecutor(devices=[0])
    with pytest.raises(cuctx.WorkerDiedError) as info:
        ex.submit(calls.square, 2).result(timeout=60)
    error = info.value
    assert not error.started and error.how == "ImportError: a broken numpy"
    assert str(error).startswith(
        f"square did not run: the worker process {error.worker} on "
        "device 0 could not start (ImportError: a broken numpy), so "
        "the executor is broken"
    )
    assert str(tmp_path / "numpy" / "__init__.py") in str(error.__cause__)  # its traceback
    with pytest.raises(
        concurrent.futures.BrokenExecutor,
        match="no worker could start on device 0: ImportError: a broken "
        "numpy; make a new IsolatedExecutor",
    ) as broken:
        ex.submit(calls.square, 2)
    assert "raise ImportError('a broken numpy')" in str(broken.value.__cause__)
    ex.shutdown()
    assert zombies() == []


CTRL_C = """
import sys, time
import cuctx
sys.path.insert(0, {calls_dir!r})
import calls
cuctx.set_backend("sim")

def wait(ex):
    call = ex.submit(calls.sleep, 600)  # no timeout: only Ctrl-C ends it early
    while not call.running():
        time.sleep(0.01)
    print(ex.workers[0].pid, flush=True)
    call.result()

if {in_with}:
    with cuctx.IsolatedExecutor(devices=[0]) as ex:
        wait(ex)
else:
    wait(cuctx.IsolatedExecutor(devices=[0]))
"""


@pytest.mark.parametrize("in_with", [True, False], ids=["with-block", "no-with-block"])
def test_ctrl_c_while_a_call_hangs_ends_the_program_and_its_workers(in_with):
    code = CTRL_C.format(calls_dir=os.path.dirname(calls.__file__), in_with=in_with)
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(CUCTX_BACKEND="sim"),
    )
    worker = int(proc.stdout.readline())  # the call runs in it: the caller waits
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)  # not the 600 s of the call
    assert proc.returncode == -signal.SIGINT and "KeyboardInterrupt" in stderr, stderr
    assert not alive(worker) or state(worker) == "Z"  # killed (a zombie of init's, at worst)


def test_ctrl_c_in_a_with_block_ends_the_running_calls_as_cancelled():
    cuctx.set_backend("sim")
    ex = cuctx.IsolatedExecutor(devices=[0])
    running = ex.submit(calls.sleep, 600)
    waiting = ex.submit(calls.square, 2)
    while not running.running():
        time.sleep(0.01)
    worker = ex.workers[0].pid
    ex.__exit__(KeyboardInterrupt, KeyboardInterrupt(), None)  # as `with` does at Ctrl-C
    assert waiting.cancelled()
    with pytest.raises(concurrent.futures.CancelledError, match="sleep was running when Ctrl-C"):
        running.result(timeout=0)
    assert not alive(worker) and zombies() == []
    assert ex.workers[0].pid is None


def test_a_worker_has_the_callers_ipc_pools_before_its_first_call(backend):
    pool = cuctx.MemoryPool(0, ipc=True)
    array = cuctx.to_device(np.arange(4.0), pool=pool)
    with cuctx.IsolatedExecutor(devices=[0]) as ex:
        assert pool._ipc_key in ex.submit(calls.imported_pools).result()
        assert ex.submit(calls.add_one, array).result() == (4,)
    assert array.to_host().tolist() == [1.0, 2.0, 3.0, 4.0]


def test_a_pool_made_after_the_worker_started_goes_with_its_first_call(backend):
    with cuctx.IsolatedExecutor(devices=[0]) as ex:
        ex.submit(calls.where).result()  # the worker runs
        pool = cuctx.MemoryPool(0, ipc=True)
        array = cuctx.to_device(np.arange(4.0), pool=pool)
        assert pool._ipc_key not in ex.submit(calls.imported_pools).result()
        assert ex.submit(calls.add_one, array).result() == (4,)
        assert pool._ipc_key in ex.submit(calls.imported_pools).result()
    assert array.to_host().tolist() == [1.0, 2.0, 3.0, 4.0]
