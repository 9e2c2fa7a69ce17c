"""IsolatedExecutor(engine="ray") with sim devices, on a local Ray cluster this process starts
and on one that already runs (a head started apart, as `ray start --head` starts one, which
the executor joins by its address): the same API, errors and timeouts as worker processes;
arrays by value. Each cluster kept light: two CPUs, no dashboard, its own ports and
temporary directory, so that test runs beside this one do not meet it (under pytest -n,
--dist loadfile keeps this module in one test process)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest

import cuctx

import calls

ray = pytest.importorskip("ray", reason="needs Ray: pip install -e '.[test]' (or 'cuctx[ray]')")

# One worker of pytest -n takes every test of a Ray cluster (--dist loadgroup): the modules
# that start one, and the tests of each module, share it.
pytestmark = [pytest.mark.usefixtures("sim"), pytest.mark.xdist_group("ray")]

HEAD_PORTS = (
    "port",
    "node-manager-port",
    "object-manager-port",
    "dashboard-port",
    "dashboard-agent-listen-port",
    "dashboard-agent-grpc-port",
    "metrics-export-port",
    "runtime-env-agent-port",
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_head(temp_dir: str) -> tuple[subprocess.Popen, str]:
    """`ray start --head --block` on free ports: (its process, the head's address) once the
    head answers. SIGTERM to the process stops the whole cluster (and nothing else)."""
    ports = {name: free_port() for name in HEAD_PORTS}
    head = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from ray.scripts.scripts import main; main()",
            "start",
            "--head",
            "--block",
            "--num-cpus=2",
            "--num-gpus=0",
            "--include-dashboard=false",
            "--disable-usage-stats",
            "--node-ip-address=127.0.0.1",
            f"--temp-dir={temp_dir}",
            *(f"--{name}={port}" for name, port in ports.items()),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    give_up = time.monotonic() + 120
    while True:
        try:
            socket.create_connection(("127.0.0.1", ports["port"]), timeout=1).close()
            return head, f"127.0.0.1:{ports['port']}"
        except OSError:
            if head.poll() is not None or time.monotonic() > give_up:
                stop_head(head)
                pytest.fail(f"ray start --head did not start:\n{head.stdout.read()}")
            time.sleep(0.2)


def stop_head(head: subprocess.Popen) -> None:
    head.send_signal(signal.SIGTERM)
    try:
        head.wait(timeout=60)
    except subprocess.TimeoutExpired:
        head.kill()
        head.wait()


@pytest.fixture(scope="module")
def no_token_auth():
    """Ray's token authentication off, in this process and the heads it starts: Ray turns it
    on where ~/.ray/auth_token exists (a local cluster writes it), and a driver whose first
    cluster had it on cannot create actors on a later one that has it off."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RAY_AUTH_MODE", "disabled")
        yield


@pytest.fixture(scope="module", params=["local", "joined"])
def ex(request, no_token_auth):
    """An executor on a local cluster that ray.init starts here, or joined to a cluster that
    runs already (address=)."""
    cuctx.set_backend("sim")
    if ray.is_initialized():
        ray.shutdown()
    if request.param == "local":
        ray.init(num_cpus=2, num_gpus=0, include_dashboard=False, log_to_driver=False)
        with cuctx.IsolatedExecutor(engine="ray") as executor:
            yield executor
        ray.shutdown()
        return
    with tempfile.TemporaryDirectory(prefix="cuctx-ray-") as temp_dir:  # short: Ray's
        head, address = start_head(temp_dir)  # sockets live in it
        try:
            with cuctx.IsolatedExecutor(engine="ray", address=address) as executor:
                assert ray.get_runtime_context().gcs_address.endswith(address.split(":")[1])
                yield executor
        finally:
            ray.shutdown()
            stop_head(head)


def settled(ex) -> dict[int, int]:
    for device in ex.devices:
        ex.options(device=device).submit(calls.where).result()
    return {w.device: w.pid for w in ex.workers}


def test_calls_run_in_actors_with_their_device_current(ex):
    for device in (0, 1):
        pid, current = ex.options(device=device).submit(calls.where).result()
        assert pid != os.getpid() and current == device
    assert list(ex.map(calls.square, range(4))) == [0, 1, 4, 9]
    assert ex.submit(lambda x: -x, 5).result() == -5


def test_an_exception_propagates_and_costs_no_actor(ex):
    before = settled(ex)
    with pytest.raises(ValueError, match="from ray") as info:
        ex.options(device=1).submit(calls.raise_value_error, "from ray").result()
    assert "raise_value_error" in str(info.value.__cause__)
    assert settled(ex) == before


def test_a_fault_costs_one_actor_which_ray_restarts(ex):
    before = settled(ex)
    with pytest.raises(cuctx.WorkerFaultError) as info:
        ex.options(device=0).submit(calls.store_to, 0).result()
    assert info.value.name == "CUDA_ERROR_ILLEGAL_ADDRESS"
    assert (info.value.device, info.value.worker) == (0, before[0])
    pid, device = ex.options(device=0).submit(calls.where).result()
    assert pid != before[0] and device == 0
    assert settled(ex)[1] == before[1]
    assert ex.workers[0].replaced == 1


def test_timeouts_and_deaths_cost_one_actor(ex):
    before = settled(ex)
    with pytest.raises(cuctx.WorkerTimeoutError) as info:
        ex.options(device=1, timeout=0.5).submit(calls.sleep, 60).result()
    assert info.value.worker == before[1]
    with pytest.raises(cuctx.WorkerDiedError):
        ex.options(device=1).submit(calls.exit_with, 3).result()
    assert ex.options(device=1).submit(calls.square, 7).result() == 49


def test_an_actor_killed_mid_call_costs_that_call_only(ex):
    """Its process gone (SIGKILL): the connection to it ends, the call raises, and Ray's
    restart serves the next call."""
    before = settled(ex)
    with pytest.raises(cuctx.WorkerDiedError, match="Ray: "):
        ex.options(device=0).submit(calls.kill_self).result()
    assert ex.options(device=0).submit(calls.square, 6).result() == 36
    assert settled(ex)[0] != before[0]


def test_calls_go_as_ray_actor_calls_where_the_actors_node_cannot_be_reached(ex, monkeypatch):
    """Ray Client from outside the cluster's network, say: no connection to an actor's
    channel, so each call is a Ray actor call, with the same results, errors and timeouts."""
    from cuctx.isolated import _channel, _ray

    engine = ex._engine
    slot = next(s for s in engine.core.slots if s.device == 0)

    def unreachable(address, authkey, timeout):
        raise ConnectionRefusedError(f"{address} cannot be reached")

    monkeypatch.setattr(_channel, "connect", unreachable)
    with pytest.raises(cuctx.WorkerDiedError):  # its next incarnation cannot be reached
        ex.options(device=0).submit(calls.kill_self).result()
    assert ex.options(device=0).submit(calls.square, 5).result() == 25
    assert isinstance(engine._calls[id(slot)], _ray.RayCalls)
    with pytest.raises(ValueError, match="by ray calls"):
        ex.options(device=0).submit(calls.raise_value_error, "by ray calls").result()
    with pytest.raises(cuctx.WorkerTimeoutError):
        ex.options(device=0, timeout=0.5).submit(calls.sleep, 60).result()
    assert ex.options(device=0).submit(calls.square, 4).result() == 16
    monkeypatch.undo()  # reachable again: the next incarnation has its channel
    with pytest.raises(cuctx.WorkerDiedError):
        ex.options(device=0).submit(calls.kill_self).result()
    assert ex.options(device=0).submit(calls.square, 3).result() == 9
    assert isinstance(engine._calls[id(slot)], _ray.ChannelCalls)


def test_device_arrays_travel_by_value(ex):
    array = cuctx.to_device(np.arange(4.0))
    assert ex.submit(lambda a: a.to_host().tolist(), array).result() == [0.0, 1.0, 2.0, 3.0]
    ex.submit(calls.fill, array, 7.0).result()
    assert array.to_host().tolist() == [0.0, 1.0, 2.0, 3.0]  # the actor wrote its own copy


def test_an_executor_cannot_join_another_cluster_than_the_one_this_process_is_on(ex):
    with pytest.raises(
        ValueError,
        match=r"connected to the Ray cluster at \S+ already, and "
        r"address='127\.0\.0\.1:1' names another",
    ):
        cuctx.IsolatedExecutor(engine="ray", address="127.0.0.1:1")
