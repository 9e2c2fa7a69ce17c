"""Managed memory (cuctx.managed_empty) on both backends: the array's host view and its device
pointer are the same bytes (the pointer is the host address), device work is seen by the host
after a synchronize and host writes by work enqueued after them; the memory lives as long as
the array or any host view. Bad input is refused."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import cuctx
from cuctx import Device

from scenarios import ADD_SOURCE, add, library_fixture

pytestmark = [pytest.mark.usefixtures("nvrtc_cache"), pytest.mark.paths("python", "native")]

lib = library_fixture(ADD_SOURCE, add=add)


def test_host_and_device_share_the_bytes(lib):
    m = cuctx.managed_empty(8, np.float32)
    assert m.ptr == m.host.__array_interface__["data"][0]  # one address for both
    m.host[:] = np.arange(8)  # the host writes, then enqueues work that reads
    lib["add"][1, 8](m, m, 10.0, 8)
    cuctx.synchronize()  # the host reads what the kernel wrote once it has run
    assert m.host.tolist() == [float(i + 10) for i in range(8)]
    assert m.to_host().tolist() == m.host.tolist()


def test_views_copies_and_fills_of_managed_arrays(lib):
    m = cuctx.managed_empty((2, 4), np.int32)
    m.fill(7)
    cuctx.synchronize()
    m[1, 1:3].host[:] = 0  # a view's host view is the same part of the memory
    assert m.host.tolist() == [[7, 7, 7, 7], [7, 0, 0, 7]]
    assert m.T.host.tolist() == m.host.T.tolist()
    cuctx.copy(m[0], cuctx.to_device(np.array([1, 2, 3, 4], np.int32)))
    cuctx.synchronize()
    assert m.host[0].tolist() == [1, 2, 3, 4]
    assert m.pool is None and m.context is Device(0).primary_context
    m.record_stream(cuctx.Stream())  # nothing to do: its free waits for all work


def test_a_host_view_keeps_the_memory(backend):
    with Device(0):
        m = cuctx.managed_empty(1000, np.uint8)
        m.fill(5)
        cuctx.synchronize()
        host = m.host
        del m
        gc.collect()
        assert host.sum() == 5000  # still the managed memory, not freed under the view
        del host
        gc.collect()


def test_the_sim_frees_managed_memory_with_its_last_array(sim):
    with Device(0):
        before = Device(0).mem_info().free
        m = cuctx.managed_empty((256, 256), np.float64)
        assert sim.driver._managed == {m.ptr}
        assert Device(0).mem_info().free == before  # not counted (an H100 shows none yet)
        del m
        gc.collect()
        assert sim.driver._managed == set()


def test_an_empty_managed_array_has_an_empty_host_view(backend):
    with Device(0):
        m = cuctx.managed_empty((0, 3), np.int16)
        assert m.host.shape == (0, 3) and m.host.dtype == np.int16 and m.ptr == 0


def test_bad_requests_are_refused(backend):
    with Device(0):
        with pytest.raises(TypeError, match="device arrays hold bool, integer"):
            cuctx.managed_empty(4, object)
        with pytest.raises(ValueError):
            cuctx.managed_empty(-1)
        with pytest.raises(TypeError, match="cuctx.managed_empty for a host view"):
            _ = cuctx.zeros(4).host
        with pytest.raises(cuctx.InvalidDeviceError):
            cuctx.managed_empty(4, device=99)


def test_more_than_the_machine_holds_is_out_of_memory(backend):
    """The driver answers CUDA_ERROR_OUT_OF_MEMORY for 4 EiB; the sim too, not an OSError
    of its host mapping. Past sys.maxsize no size_t holds it: a ValueError naming it."""
    with Device(0):
        with pytest.raises(cuctx.OutOfMemoryError, match="asked for 4611686018427387904 bytes"):
            cuctx.managed_empty(2**62, np.uint8)
        with pytest.raises(ValueError, match="more than any array can address"):
            cuctx.managed_empty(2**62, np.float64)
        m = cuctx.managed_empty(4, np.uint8)  # nothing was left broken
        m.host[:] = 3
        assert m.to_host().tolist() == [3, 3, 3, 3]
