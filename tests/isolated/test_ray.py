"""IsolatedExecutor(engine="ray") on a local Ray cluster with sim devices: the same API,
errors and timeouts as worker processes; arrays by value. One cluster for the whole run
(starting one takes seconds), kept light: two CPUs, no dashboard. Under pytest -n a test
process that runs these starts its own (ray.init() without an address starts a new local
cluster, on free ports); --dist loadfile keeps this module in one process."""

from __future__ import annotations

import os

import numpy as np
import pytest

import cuctx

import calls

ray = pytest.importorskip("ray", reason="needs Ray: pip install -e '.[test]' (or 'cuctx[ray]')")

pytestmark = pytest.mark.usefixtures("sim")


@pytest.fixture(scope="session")
def ray_cluster():
    if not ray.is_initialized():
        ray.init(num_cpus=2, num_gpus=0, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def ex(ray_cluster):
    cuctx.set_backend("sim")
    with cuctx.IsolatedExecutor(engine="ray") as executor:
        yield executor


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


def test_device_arrays_travel_by_value(ex):
    array = cuctx.to_device(np.arange(4.0))
    assert ex.submit(lambda a: a.to_host().tolist(), array).result() == [0.0, 1.0, 2.0, 3.0]
    ex.submit(calls.fill, array, 7.0).result()
    assert array.to_host().tolist() == [0.0, 1.0, 2.0, 3.0]  # the actor wrote its own copy
