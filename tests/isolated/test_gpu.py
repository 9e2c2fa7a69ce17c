"""IsolatedExecutor on a real GPU: a kernel's illegal address costs its worker only (the
caller's own CUDA work and the next call go on), and an ipc pool's array is the same
memory in the worker."""

from __future__ import annotations

import os

import numpy as np
import pytest

import cuctx

import calls

pytestmark = pytest.mark.gpu


def test_a_real_illegal_address_costs_one_worker(gpu):
    mine = cuctx.to_device(np.arange(4.0))  # the caller's context, on the same GPU
    with cuctx.IsolatedExecutor(devices=[0]) as ex:
        before, device = ex.submit(calls.where).result()
        assert before != os.getpid() and device == 0
        with pytest.raises(cuctx.WorkerFaultError) as info:
            ex.submit(calls.store_to, 0).result()
        assert info.value.name == "CUDA_ERROR_ILLEGAL_ADDRESS" and info.value.worker == before
        after, _ = ex.submit(calls.where).result()
        assert after != before and ex.workers[0].replaced == 1
        assert ex.submit(calls.store_to, 0).exception() is not None  # and again
    assert mine.to_host().tolist() == [0.0, 1.0, 2.0, 3.0]
    cuctx.synchronize()


def test_an_ipc_array_is_the_same_memory_in_the_worker(gpu):
    pool = cuctx.MemoryPool(0, ipc=True)
    array = cuctx.to_device(np.arange(6.0), pool=pool)
    with cuctx.IsolatedExecutor(devices=[0]) as ex:
        assert ex.submit(calls.add_one, array).result() == (6,)
        assert array.to_host().tolist() == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
        with pytest.raises(cuctx.WorkerFaultError):
            ex.submit(calls.store_to, 0).result()
        assert ex.submit(calls.add_one, array[1:3]).result() == (2,)
    assert array.to_host().tolist() == [1.0, 3.0, 4.0, 4.0, 5.0, 6.0]
