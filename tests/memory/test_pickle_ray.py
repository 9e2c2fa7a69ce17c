"""Pickling by descriptor into a Ray task on this machine: an array of an ipc pool passed to a
task is the same memory there (Ray pickles its arguments; the task's process fetches the
pool's descriptor from this one), and an ipc event orders the task's stream after this
process's work. A local cluster for the module, kept light (two CPUs, no dashboard)."""

from __future__ import annotations

import gc
import os
from pathlib import Path

import numpy as np
import pytest

import cuctx
from cuctx import Device, MemoryPool

ray = pytest.importorskip("ray", reason="needs Ray: pip install -e '.[test]' (or 'cuctx[ray]')")

pytestmark = [pytest.mark.xdist_group("ray")]  # one worker runs the Ray tests (test_ray.py)


@pytest.fixture(scope="module")
def ray_cluster():
    """A local cluster for this module (one already running is used and left running)."""
    started = not ray.is_initialized()
    if started:  # as tests/isolated/test_ray.py starts its own: two CPUs, the GPUs there are
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    if started:
        ray.shutdown()


@pytest.fixture
def cluster(backend, ray_cluster):
    """The options of a task on ``backend``: a GPU task gets the GPU (Ray's num_gpus), a sim
    task none; the task's process runs this cuctx on the same backend."""
    gpus = 0 if backend.sim is not None else 1
    if ray.cluster_resources().get("GPU", 0) < gpus:
        pytest.skip("the Ray cluster of this run has no GPU")
    # This cuctx first, then this process's own PYTHONPATH (where the packages of a machine
    # without an index live, Ray's included: replaced, the task's worker never started).
    path = [
        str(Path(cuctx.__file__).resolve().parents[1]),
        *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep)),
    ]
    yield {
        "num_gpus": gpus,
        "runtime_env": {
            "env_vars": {"CUCTX_BACKEND": backend.name, "PYTHONPATH": os.pathsep.join(path)}
        },
    }
    gc.collect()
    cuctx.synchronize()


def test_an_ipc_array_is_the_same_memory_in_a_ray_task(cluster):
    @ray.remote
    def add_one(array, ready):
        with array.device:
            stream = cuctx.Stream()
            stream.wait(ready)
            array.copy_from(array.to_host(stream=stream) + 1, stream)
            stream.synchronize()
        return os.getpid()

    with Device(0):
        pool = MemoryPool(0, ipc=True)
        stream = cuctx.Stream()
        array = cuctx.empty(6, pool=pool, stream=stream)
        source = cuctx.pinned_empty(6)
        source[:] = np.arange(6.0)
        array.copy_from(source, stream)  # ordered for the task by the event alone
        ready = cuctx.Event(ipc=True)
        ready.record(stream)
        pid = ray.get(add_one.options(**cluster).remote(array[1:5], ready), timeout=300)
        assert pid != os.getpid()
        cuctx.current_stream().wait(stream)
        assert array.to_host().tolist() == [0.0, 2.0, 3.0, 4.0, 5.0, 5.0]
