"""Pickling by descriptor, on one machine, on both backends: arrays of an ipc pool, ipc pools
and ipc events pickle into a multiprocessing child (spawned, as CUDA needs; as its arguments
and through a queue while it runs) as the same memory and the same event: the child waits on
the parent's event, reads what the parent wrote, writes, records the parent's other event,
and the parent waits on that and reads what the child wrote, with no synchronize between
them. Duplicate imports are one mapping, dropped when the last array of it goes; an array
sent back is the parent's own. Every other resource refuses pickling, naming the object and
the way; a pool its process dropped, another backend or another machine are clear errors."""

from __future__ import annotations

import gc
import multiprocessing
import os
import pickle
import traceback

import numpy as np
import pytest

import cuctx
from cuctx import Device, MemoryPool
from cuctx.memory import _handoff, _ipc

from scenarios import ADD_SOURCE, add


SPAWN = multiprocessing.get_context("spawn")  # fork breaks CUDA
WAIT_S = 120


@pytest.fixture
def device(backend, monkeypatch):
    """Device 0, current; spawned children run the same backend (they unpickle their
    arguments before their target runs, so the environment must say it)."""
    monkeypatch.setenv("CUCTX_BACKEND", backend.name)
    with Device(0):
        yield Device(0)
    gc.collect()
    cuctx.synchronize()


def _child(arrays: list, pool, ready, done, inbox, outbox) -> None:
    """Wait on ``ready``, read the first array, write it, record ``done``; check the imports;
    take a second array from ``inbox``, write it, send the first back. (The arrays come in a
    list this function empties: the Process object holds its arguments for its whole run.)"""
    report = {}
    view, part = arrays
    arrays.clear()
    try:
        with view.device:
            stream = cuctx.Stream()
            stream.wait(ready)  # the parent's copy is done before what follows on stream
            report["read"] = view.to_host(stream=stream).tolist()
            view.copy_from(np.arange(100, 100 + view.size, dtype=view.dtype), stream)
            done.record(stream)
            report["same pool"] = view.pool is pool and part.pool is pool
            report["one mapping"] = part._alloc is view._alloc and len(pool._imports) == 1
            if len(cuctx.devices()) > 1:  # an import's access is this process's own
                report["access"] = [pool.access(1)]
                pool.set_access(1, "rw")
                report["access"].append(pool.access(1))
            second = inbox.get(timeout=WAIT_S)  # unpickled now, while this child runs
            second.fill(7, stream=stream)
            stream.synchronize()
            outbox.put(pickle.dumps(view))  # now, not in the queue's thread: dropped below
            del part
            gc.collect()
            report["after dropping one"] = view.to_host(stream=stream)[:2].tolist()
            del view, second
            gc.collect()  # frees the imports, waiting for their streams
            report["imports left"] = len(pool._imports)
    except BaseException:  # noqa: BLE001 - the parent reports it
        report["error"] = traceback.format_exc()
    outbox.put(report)


def test_ipc_arrays_pools_and_events_pickle_into_a_spawned_child(device):
    pool = MemoryPool(device, ipc=True)
    two = len(cuctx.devices()) > 1 and Device(1).can_access_peer(device)
    if two:
        pool.set_access(1, "rw")  # this process's access: the child's import has its own
    stream = cuctx.Stream()
    arr = cuctx.empty(16, np.int32, pool=pool, stream=stream)
    source = cuctx.pinned_empty(16, np.int32)
    source[:] = np.arange(16)
    arr.copy_from(source, stream)  # asynchronous: ordered for the child by `ready` alone
    ready, done = cuctx.Event(ipc=True), cuctx.Event(ipc=True)
    ready.record(stream)
    inbox, outbox = SPAWN.Queue(), SPAWN.Queue()
    child = SPAWN.Process(
        target=_child, args=([arr[4:12], arr[6:8]], pool, ready, done, inbox, outbox)
    )
    child.start()
    try:
        # From pageable memory: complete on return (no synchronize of `stream`, which only
        # `ready` orders for the child).
        second = cuctx.to_device(np.zeros(4, np.int32), pool=MemoryPool(device, ipc=True))
        inbox.put(second)  # a pool the child does not have yet, while it runs
        back = pickle.loads(outbox.get(timeout=WAIT_S))
        report = outbox.get(timeout=WAIT_S)
    finally:
        child.join(WAIT_S)
        if child.is_alive():
            child.kill()
    assert "error" not in report, report["error"]
    assert child.exitcode == 0
    assert report["read"] == list(range(4, 12))
    assert report["same pool"] and report["one mapping"]
    assert report.get("access", [None, "rw"]) == [None, "rw"] and pool.access(1 if two else 0)
    assert report["after dropping one"] == [100, 101]  # the other array keeps the mapping
    assert report["imports left"] == 0
    cuctx.current_stream().wait(ready)  # this process's copy
    cuctx.current_stream().wait(done)  # and the child's writes, ordered by its event
    assert arr.to_host().tolist() == [0, 1, 2, 3, *range(100, 108), 12, 13, 14, 15]
    assert second.to_host().tolist() == [7] * 4
    assert back.ptr == arr.ptr + 16 and back._alloc is arr._alloc  # the parent's own memory


def _add_one(array) -> int:
    """In a worker of a multiprocessing Pool: add one to ``array`` (the same memory)."""
    array.copy_from(array.to_host() + 1)  # pageable: complete on return
    return os.getpid()


def _nothing(*args) -> None:
    pass


def test_a_process_pool_maps_over_arrays_of_several_ipc_pools(device):
    pools = [MemoryPool(device, ipc=True) for _ in range(3)]
    arrays = [cuctx.to_device(np.full(4, i, np.int32), pool=pools[i % 3]) for i in range(6)]
    with SPAWN.Pool(2) as workers:  # each worker imports each pool once, when it first comes
        pids = workers.map(_add_one, arrays)
    assert os.getpid() not in pids
    assert [a.to_host().tolist() for a in arrays] == [[i + 1] * 4 for i in range(6)]


def test_handing_a_pool_to_children_leaks_no_descriptor(device):
    arr = cuctx.zeros(4, pool=MemoryPool(device, ipc=True))

    def run_child():
        child = SPAWN.Process(target=_nothing, args=(arr,))  # the child imports the pool
        child.start()
        child.join(WAIT_S)
        assert child.exitcode == 0
        child.close()

    run_child()  # the first: multiprocessing's own descriptors, the hand-off socket
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(2):
        run_child()
    assert len(os.listdir("/proc/self/fd")) == before  # each descriptor sent was closed


def test_in_the_same_process_unpickling_gives_the_originals(device):
    pool = MemoryPool(device, ipc=True)
    arr = cuctx.to_device(np.arange(6.0), pool=pool)
    view = pickle.loads(pickle.dumps(arr[1:3]))
    assert view.ptr == arr.ptr + 8 and view._alloc is arr._alloc
    assert view.to_host().tolist() == [1.0, 2.0]
    assert pickle.loads(pickle.dumps(pool)) is pool
    event = cuctx.Event(ipc=True)
    assert pickle.loads(pickle.dumps(event)) is event
    empty = pickle.loads(pickle.dumps(cuctx.empty((0, 3), pool=pool)))
    assert empty.shape == (0, 3) and empty.pool is pool


@pytest.mark.usefixtures("nvrtc_cache")
def test_everything_else_refuses_to_be_pickled_and_says_why(device):
    lib = cuctx.Library.from_source(ADD_SOURCE, sim_kernels={"add": add})
    stream = cuctx.Stream()
    with stream.capture() as graph:
        cuctx.zeros(4, stream=stream).fill(1, stream=stream)

    backing = cuctx.zeros(2)  # (alive while the foreign object's interface points at it)

    class Foreign:
        __cuda_array_interface__ = backing.__cuda_array_interface__

    for obj, why in [
        (
            cuctx.zeros(4),
            r"memory of the device's default pool; only arrays of a MemoryPool"
            r"\(device, ipc=True\) pickle .* or pickle arr\.to_host\(\)",
        ),
        (cuctx.zeros(4, pool=MemoryPool(device)), r"memory of <MemoryPool .*arr\.to_host"),
        (cuctx.managed_empty(4), r"it is managed memory; .*arr\.to_host"),
        (cuctx.asarray(Foreign()), r"another library .*arr\.to_host"),
        (MemoryPool(device), r"only a MemoryPool\(device, ipc=True\)"),
        (device.memory_pool, r"only a MemoryPool\(device, ipc=True\)"),
        (cuctx.Event(), r"only an event created with cuctx\.Event\(ipc=True\)"),
        (stream, r"make one in the other process \(cuctx\.Stream\(\)\).*Event\(ipc=True\)"),
        (cuctx.current_context(), r"use that process's own"),
        (lib, r"load the library in the other process"),
        (lib["add"], r"load the library in the other process"),
        (graph, r"build it in the other process"),
        (graph.instantiate(), r"build it in the other process"),
    ]:
        with pytest.raises(TypeError, match=rf"^cannot pickle <\w+ .*{why}"):
            pickle.dumps(obj)


def test_a_pool_dropped_by_its_process_is_a_clear_error(device):
    pool = MemoryPool(device, ipc=True)
    data = pickle.dumps(pool)
    del pool
    gc.collect()
    with pytest.raises(RuntimeError, match=r"no longer has the ipc pool .*: keep the pool"):
        pickle.loads(data)


def test_another_backend_or_machine_is_a_clear_error(device, backend):
    pool = MemoryPool(device, ipc=True)
    function, (ref,) = pool.__reduce__()
    other = "cuda" if backend.name == "sim" else "sim"
    with pytest.raises(
        ValueError,
        match=rf"of the {other} backend cannot be unpickled in a "
        rf"process running the {backend.name} backend: .*CUCTX_BACKEND",
    ):
        function(ref._replace(backend=other))
    away = ref._replace(key="not-here", origin=ref.origin._replace(machine="elsewhere"))
    with pytest.raises(ValueError, match="another machine or an earlier boot"):
        function(away)
    gone = ref._replace(key="not-here", origin=ref.origin._replace(address=b"\0nobody"))
    with pytest.raises(RuntimeError, match="must still run"):
        function(gone)
    assert function is _ipc.pool_from_pickle and ref.origin.machine == _handoff.machine_id()
