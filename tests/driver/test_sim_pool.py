"""Stream-ordered pool memory reused while work queued for its old owner is still pending:
that work is checked against the allocation it was queued for, so a smaller reuse does not
fault it; a real use after free still does. Also the driver's conversion of size and value
arguments, and host addresses NumPy must never touch."""

import ctypes
import gc
import sys

import numpy as np
import pytest
from cuda.bindings.driver import CUresult

import cuctx
from cuctx import Device, Stream

OK = CUresult.CUDA_SUCCESS
INVALID_VALUE = CUresult.CUDA_ERROR_INVALID_VALUE
ILLEGAL_ADDRESS = CUresult.CUDA_ERROR_ILLEGAL_ADDRESS


def address(host: np.ndarray) -> int:
    return host.__array_interface__["data"][0]


# -- both backends ------------------------------------------------------------------------


def test_a_freed_array_reused_for_a_smaller_one_is_not_a_fault(backend):
    with Device(0):
        a = cuctx.zeros(100, np.float32)
        del a
        gc.collect()
        b = cuctx.zeros(90, np.float32)
        np.testing.assert_array_equal(b.to_host(), np.zeros(90, np.float32))
        c = cuctx.full(100, 7, np.int32)
        del c
        gc.collect()
        d = cuctx.full(60, 3, np.int32)
        np.testing.assert_array_equal(d.to_host(), np.full(60, 3, np.int32))
    assert Device(0).primary_context.state == "active"  # nothing was poisoned


def test_queued_work_of_a_freed_allocation_runs_in_stream_order_before_the_reuse(backend):
    drv = backend.driver
    with Device(0):
        stream = Stream(Device(0))
        s = stream._handle
        err, first = drv.cuMemAllocAsync(400, s)
        assert not err
        assert drv.cuMemsetD32Async(first, 1, 100, s) == (OK,)
        assert drv.cuMemFreeAsync(first, s) == (OK,)
        err, second = drv.cuMemAllocAsync(360, s)  # may reuse the block on this stream
        assert not err
        assert drv.cuMemsetD32Async(second, 2, 90, s) == (OK,)
        out = np.zeros(90, np.uint32)
        assert drv.cuMemcpyDtoHAsync(address(out), second, 360, s) == (OK,)
        assert drv.cuStreamSynchronize(s) == (OK,)
        np.testing.assert_array_equal(out, 2)
        assert drv.cuMemFreeAsync(second, s) == (OK,)
        assert drv.cuStreamSynchronize(s) == (OK,)


def test_sizes_and_values_are_converted_as_the_bindings_convert_c_arguments(backend):
    # cuda.bindings refuses these before the driver sees them; the sim must not queue them.
    drv = backend.driver
    with Device(0):
        err, ptr = drv.cuMemAlloc(64)
        assert not err
        host = np.zeros(8, np.uint8)
        for call in (
            lambda: drv.cuMemcpyHtoDAsync(ptr, address(host), -1, 0),
            lambda: drv.cuMemsetD8Async(ptr, 256, 4, 0),
            lambda: drv.cuMemsetD8Async(ptr, -1, 4, 0),
            lambda: drv.cuMemsetD16Async(ptr, 1 << 16, 4, 0),
            lambda: drv.cuMemsetD32Async(ptr, 1 << 32, 4, 0),
            lambda: drv.cuMemsetD32Async(ptr, 0, -4, 0),
            lambda: drv.cuMemAlloc(-1),
            lambda: drv.cuMemHostAlloc(-1, 0),
            lambda: drv.cuMemHostRegister(address(host), -1, 0),
        ):
            with pytest.raises(OverflowError):
                call()
        assert drv.cuMemsetD32Async(ptr, 0xFFFF_FFFF, 16, 0) == (OK,)
        assert drv.cuMemcpyDtoH(address(host), ptr, 8) == (OK,)
        assert (host == 0xFF).all()
        assert drv.cuMemFree(ptr) == (OK,)


# -- the mechanism, on the sim --------------------------------------------------------------


def alloc(drv, nbytes, stream):
    err, ptr = drv.cuMemAllocAsync(nbytes, stream)
    assert not err
    return int(ptr)


def test_old_work_covers_the_old_length_while_the_block_holds_a_smaller_allocation(sim):
    drv = sim.driver
    with Device(0):
        stream = Stream(Device(0))
        s = stream._handle
        first = alloc(drv, 400, s)
        assert drv.cuMemsetD32Async(first, 1, 100, s) == (OK,)
        assert drv.cuMemFreeAsync(first, s) == (OK,)
        second = alloc(drv, 360, s)
        assert second == first  # the same stream reuses the block at once
        # New calls are checked against the new, smaller allocation...
        assert drv.cuMemsetD32Async(second, 2, 100, s) == (INVALID_VALUE,)
        # ...while a kernel still queued for the old one may reach its end.
        assert drv._device_view(first + 396, 4)[0] == OK
        assert drv.cuStreamSynchronize(s) == (OK,)
        assert (drv._blocks[first].data[:400].view(np.uint32) == 1).all()  # all of it ran
        assert drv._device_view(first + 396, 4)[0] == ILLEGAL_ADDRESS  # the old free ran


def test_work_queued_after_the_free_still_faults(sim):
    drv = sim.driver
    with Device(0):
        stream = Stream(Device(0))
        s = stream._handle
        ptr = alloc(drv, 64, s)
        assert drv.cuMemFreeAsync(ptr, s) == (OK,)
        assert drv.cuMemsetD8Async(ptr, 1, 64, s) == (OK,)  # the free has not run yet
        assert drv.cuStreamSynchronize(s) == (ILLEGAL_ADDRESS,)
        assert drv.cuCtxSynchronize() == (ILLEGAL_ADDRESS,)  # sticky


def test_a_late_reader_past_a_smaller_reuse_faults(sim):
    drv = sim.driver
    with Device(0):
        streams = Stream(Device(0)), Stream(Device(0))
        s_alloc, s_use = (x._handle for x in streams)
        ptr = alloc(drv, 400, s_alloc)
        assert drv.cuStreamSynchronize(s_alloc) == (OK,)
        out = cuctx.pinned_empty(400, np.uint8)
        assert drv.cuMemcpyDtoHAsync(address(out), ptr, 400, s_use) == (OK,)  # runs late
        assert drv.cuMemFreeAsync(ptr, s_alloc) == (OK,)
        # A query runs the free (a synchronize would also release the block to the device,
        # as the driver does with the pool's release threshold of 0): a use after free
        assert drv.cuStreamQuery(s_alloc) == (OK,)
        assert alloc(drv, 360, s_use) == ptr  # reused, but shorter than the late read
        assert drv.cuStreamSynchronize(s_use) == (ILLEGAL_ADDRESS,)


def test_memory_released_with_its_block_faults_queued_work(sim):
    drv = sim.driver
    with Device(0):
        stream = Stream(Device(0))
        s = stream._handle
        err, ptr = drv.cuMemAlloc(64)
        assert not err
        out = cuctx.pinned_empty(64, np.uint8)
        assert drv.cuMemcpyDtoHAsync(address(out), ptr, 64, s) == (OK,)
        drv._drop_block(drv._blocks[int(ptr)])  # what unloading a module does to its variables
        assert drv.cuStreamSynchronize(s) == (ILLEGAL_ADDRESS,)


def test_a_free_dropped_with_a_faulted_context_gives_its_memory_back_at_the_reset(sim):
    """The free is queued, then the context faults: its queued work never runs, yet the
    device's memory is back once the context is reset (no block left in the pool forever)."""
    from cuctx.sim import inject_fault

    drv = sim.driver
    device = Device(0)
    with device:
        before = device.mem_info().free
        stream = Stream(device)
        err, ptr = drv.cuMemAllocAsync(4096, stream._handle)
        assert not err
        assert drv.cuStreamSynchronize(stream._handle) == (OK,)
        assert drv.cuMemFreeAsync(ptr, stream._handle) == (OK,)
        inject_fault(device.primary_context)
        with pytest.raises(cuctx.CudaError):
            stream.synchronize()
    device.reset()
    with device:
        assert device.mem_info().free == before


# -- host addresses -------------------------------------------------------------------------


def test_host_addresses_numpy_cannot_touch_are_refused_not_a_crash(sim):
    drv = sim.driver
    with Device(0):
        err, ptr = drv.cuMemAlloc(64)
        assert not err
        err, other = drv.cuMemAlloc(64)
        assert not err
        for host in (0, 0x10, 1 << 60, int(other)):  # null, unmapped, too high, device memory
            assert drv.cuMemcpyHtoD(ptr, host, 8) == (INVALID_VALUE,)
            assert drv.cuMemcpyDtoH(host, ptr, 8) == (INVALID_VALUE,)
        assert drv.cuMemcpyHtoD(ptr, 0, 0) == (OK,)  # nothing to touch
        assert drv.cuCtxSynchronize() == (OK,)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="uses mmap/munmap from libc")
def test_registered_memory_unmapped_while_a_copy_is_queued_faults_not_crashes(sim):
    libc = ctypes.CDLL(None)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = (
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_long,
    )
    libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
    size = 1 << 16
    page = libc.mmap(None, size, 0x1 | 0x2, 0x02 | 0x20, -1, 0)  # RW, PRIVATE | ANONYMOUS
    assert page not in (None, ctypes.c_void_p(-1).value)
    drv = sim.driver
    with Device(0):
        stream = Stream(Device(0))
        s = stream._handle
        err, ptr = drv.cuMemAlloc(size)
        assert not err
        assert drv.cuMemHostRegister(page, size, 0) == (OK,)
        assert drv.cuMemcpyDtoHAsync(page, ptr, size, s) == (OK,)  # page-locked: queued
        assert drv.cuMemHostUnregister(page) == (OK,)
        assert libc.munmap(page, size) == 0
        assert drv.cuStreamSynchronize(s) == (ILLEGAL_ADDRESS,)
