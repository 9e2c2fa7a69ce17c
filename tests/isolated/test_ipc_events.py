"""Events across processes with IsolatedExecutor, on both backends: an ``Event(ipc=True)``
passed to a worker call pickles into the worker (opened there, as an ipc event), whose stream
waits on the caller's record of it; the worker records the caller's other event, and the
caller's stream waits on that. (Today `submit` also synchronizes the context of the arrays a
call shares, and the worker its device after the call; tests/memory/test_pickle.py shows the
events alone ordering two processes.)"""

from __future__ import annotations

import gc

import numpy as np
import pytest

import cuctx
from cuctx import Device, Event, MemoryPool, Stream


def wait_add_one_record(array: cuctx.DeviceArray, ready: Event, done: Event) -> bool:
    """In the worker: after ``ready``, add one to ``array``; then record ``done``."""
    stream = Stream()
    stream.wait(ready)
    array.copy_from(array.to_host(stream=stream) + 1, stream)
    done.record(stream)
    return ready.ipc and done.ipc and not done.timing


@pytest.fixture
def ex(backend, monkeypatch):
    monkeypatch.setenv("CUCTX_BACKEND", backend.name)
    with Device(0), cuctx.IsolatedExecutor(devices=[0]) as executor:
        yield executor
    gc.collect()


def test_a_worker_and_the_caller_order_their_work_by_ipc_events(ex, backend):
    if backend.sim is None and not Device(0).properties.ipc_event_supported:
        pytest.skip(
            "this device does not support ipc events (CU_DEVICE_ATTRIBUTE_IPC_EVENT_SUPPORTED is 0)"
        )
    pool = MemoryPool(0, ipc=True)
    stream = Stream()
    array = cuctx.empty(4, np.float32, pool=pool, stream=stream)
    source = cuctx.pinned_empty(4, np.float32)
    source[:] = [1, 2, 3, 4]
    array.copy_from(source, stream)  # asynchronous: the worker is ordered after it by `ready`
    ready, done = Event(ipc=True), Event(ipc=True)
    ready.record(stream)
    assert ex.submit(wait_add_one_record, array, ready, done).result()
    stream.wait(done)  # the worker's writes, ordered by the event it recorded
    assert array.to_host(stream=stream).tolist() == [2.0, 3.0, 4.0, 5.0]


def same(array: cuctx.DeviceArray) -> cuctx.DeviceArray:
    return array


def test_an_ipc_array_a_worker_returns_is_the_callers_own(ex):
    array = cuctx.to_device(np.arange(4.0), pool=MemoryPool(0, ipc=True))
    back = ex.submit(same, array[1:3]).result()
    assert back._alloc is array._alloc and back.ptr == array.ptr + 8
    assert back.to_host().tolist() == [1.0, 2.0]


def record_warnings() -> None:
    """In the worker, for the calls after this one: every warning goes to a list."""
    import warnings

    seen = warnings.__dict__.setdefault("_cuctx_test_seen", [])
    warnings.showwarning = lambda message, category, *rest, **kw: seen.append(str(message))
    warnings.simplefilter("always")


def fill_on_its_own_stream(array: cuctx.DeviceArray) -> None:
    array.fill(7.0, stream=Stream())  # queued; the call returns before it may have run


def warnings_seen() -> list[str]:
    import warnings

    return list(warnings._cuctx_test_seen)


def test_a_calls_shared_arrays_outlive_the_work_it_queued_on_its_own_streams(backend, monkeypatch):
    """The worker frees (unmaps) a call's shared arrays on the stream they were imported on,
    which is not ordered after a stream the call made: only once the call's work is done.
    Freed before, a fill still queued read unmapped memory (CUDA_ERROR_LAUNCH_FAILED on an
    H200, now and then), and the race checker named the free."""
    monkeypatch.setenv("CUCTX_BACKEND", backend.name)
    monkeypatch.setenv("CUCTX_RACECHECK", "warn")
    with Device(0), cuctx.IsolatedExecutor(devices=[0]) as ex:
        array = cuctx.zeros(1 << 16, np.float32, pool=MemoryPool(0, ipc=True))
        ex.submit(record_warnings).result()
        for _ in range(3):
            ex.submit(fill_on_its_own_stream, array).result()
        assert ex.submit(warnings_seen).result() == []
        assert (array.to_host() == 7.0).all()  # the worker's writes, done before the answer
    gc.collect()
