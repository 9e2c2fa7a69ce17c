"""Device and host memory on every backend: arrays and views, copies in every direction,
pinned vs pageable copies, stream-ordered frees kept safe by record_stream and
defer_cleanup, the missing-wait race with arrays, contexts, out-of-memory, and bad input.
What only the sim can show (stale data without a sync, illegal addresses, its address
space) is tested on the sim alone."""

import gc
import sys

import numpy as np
import pytest
from cuda.bindings.driver import CUresult
from conftest import busy

import cuctx
from cuctx import _lifetimes, _trace
from cuctx.memory import _alloc, _array
from cuctx import (
    Context,
    ContextDestroyedError,
    ContextPoisonedError,
    Device,
    DeviceArray,
    OutOfMemoryError,
    Stream,
    StickyFaultError,
)


def two_devices():
    if len(cuctx.devices()) < 2:
        pytest.skip("needs two devices")
    return Device(0), Device(1)


# -- making arrays ------------------------------------------------------------------------


def test_to_device_and_back_keeps_values_and_metadata(backend):
    host = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    arr = cuctx.to_device(host)
    assert isinstance(arr, DeviceArray)
    assert (arr.shape, arr.dtype, arr.strides) == (host.shape, host.dtype, host.strides)
    assert (arr.nbytes, arr.size, arr.ndim, len(arr)) == (96, 24, 3, 2)
    assert arr.device is Device(0) and arr.context is Device(0).primary_context
    assert arr.ptr != 0
    np.testing.assert_array_equal(arr.to_host(), host)


@pytest.mark.parametrize(
    "dtype, value",
    [
        (np.int8, -3),
        (np.uint16, 65535),
        (np.float32, 1.5),
        (np.int32, 7),
        (np.float64, 0.1),
        (np.int64, -(2**40) - 5),
        (np.complex128, 1 - 2j),
        (np.bool_, True),
        (np.complex64, 3j),
    ],
)
def test_full_zeros_and_fill_set_every_element(backend, dtype, value):
    arr = cuctx.full((5, 3), value, dtype)
    np.testing.assert_array_equal(arr.to_host(), np.full((5, 3), value, dtype))
    np.testing.assert_array_equal(cuctx.zeros(7, dtype).to_host(), np.zeros(7, dtype))
    arr.fill(0)
    assert not arr.to_host().any()


def test_empty_arrays_need_no_memory(backend):
    arr = cuctx.empty((0, 4), np.float32)
    assert arr.nbytes == 0 and arr.shape == (0, 4)
    assert arr.to_host().shape == (0, 4)
    assert cuctx.to_device(np.zeros((3, 0))).size == 0


@pytest.mark.paths("python", "native", "checked")
def test_empty_makes_the_same_array_on_every_path(backend, path, monkeypatch):
    """cuctx.empty's array is made in C where the backend has the compiled path (the memory
    from the pool as the Python path allocates it, without its `allocate`; allocations are
    traced there as here), in Python otherwise: the same array either way, and the same
    refusals."""
    s = Stream()
    for dtype in (np.float32, "f8"):  # the compiled path takes a dtype argument seen before
        cuctx.empty(1, dtype, stream=s)
    allocated = []
    real = _array.allocate
    monkeypatch.setattr(_array, "allocate", lambda *a: allocated.append(a) or real(*a))
    arr = cuctx.empty((3, 4), np.float32, stream=s)
    assert (arr.shape, arr.strides, arr.dtype, arr._c, arr._f) == (
        (3, 4),
        (16, 4),
        np.float32,
        True,
        False,
    )
    assert arr.context is s.context and arr._alloc.stream is s and arr._alloc.nbytes == 48
    assert arr.ptr == arr._alloc.ptr != 0 and arr._owner is None
    column = cuctx.empty(5, "f8", stream=s)  # a 1-D array is Fortran-contiguous too
    assert (column.shape, column.strides, column._c, column._f) == ((5,), (8,), True, True)
    assert len(allocated) == (0 if backend.native is not None else 2)
    arr.copy_from(np.arange(12, dtype=np.float32).reshape(3, 4), stream=s)
    np.testing.assert_array_equal(
        arr.to_host(stream=s), np.arange(12, dtype=np.float32).reshape(3, 4)
    )
    with pytest.raises(ValueError, match="negative dimension"):
        cuctx.empty((2, -1), np.float32)
    with pytest.raises(TypeError, match="a shape is an int or a tuple of ints"):
        cuctx.empty(True)
    with pytest.raises(TypeError, match="native byte order"):
        cuctx.empty(4, ">f4")


def test_full_takes_its_dtype_from_the_value(backend):
    assert cuctx.full(3, 2).dtype == np.dtype(int)
    assert cuctx.full(3, 2.0).dtype == np.float64


# -- views --------------------------------------------------------------------------------


def test_slices_are_views_sharing_memory(backend):
    host = np.arange(20, dtype=np.int32).reshape(4, 5)
    arr = cuctx.to_device(host)
    row = arr[2]
    assert row.shape == (5,) and row.ptr == arr.ptr + 2 * 20
    np.testing.assert_array_equal(row.to_host(), host[2])
    np.testing.assert_array_equal(arr[1:3].to_host(), host[1:3])
    assert arr[-1, 4].shape == () and int(arr[-1, 4].to_host()) == 19
    arr[1:3].fill(-1)  # writes through the view
    expected = host.copy()
    expected[1:3] = -1
    np.testing.assert_array_equal(arr.to_host(), expected)
    column = arr[:, 1]
    assert column.strides == (20,) and not column.is_contiguous
    assert arr[None, ...].shape == (1, 4, 5)


def test_a_view_keeps_the_memory_alive(backend):
    host = np.arange(10, dtype=np.float64)
    view = cuctx.to_device(host)[5:]
    gc.collect()
    cuctx.full(10, -1.0)  # may reuse freed memory; must not reuse the view's
    np.testing.assert_array_equal(view.to_host(), host[5:])


# -- copies -------------------------------------------------------------------------------


def test_copy_in_every_direction_on_one_device(backend):
    host = np.arange(12, dtype=np.float64).reshape(3, 4)
    a = cuctx.empty((3, 4))
    cuctx.copy(a, host)  # host to device
    b = cuctx.empty((3, 4))
    cuctx.copy(b, a)  # device to device
    out = np.empty_like(host)
    cuctx.copy(out, b)  # device to host
    np.testing.assert_array_equal(out, host)
    assert b.copy_from(host * 2) is b
    np.testing.assert_array_equal(b.to_host(out=out), host * 2)


def test_copy_between_devices_is_a_peer_copy(backend):
    d0, d1 = two_devices()
    host = np.arange(1000, dtype=np.int64)
    a = cuctx.to_device(host, device=d0)
    b = cuctx.empty(1000, np.int64, device=d1)
    assert b.device is d1
    d0.synchronize()  # the upload is on d0's stream; the copy below runs on d1's
    cuctx.copy(b, a)  # on the current stream of dst's device
    np.testing.assert_array_equal(b.to_host(), host)
    c = cuctx.empty(1000, np.int64, device=d0)
    s0 = Stream(d0)
    cuctx.copy(c, b, stream=s0)  # a stream of either side will do
    s0.synchronize()
    np.testing.assert_array_equal(c.to_host(), host)


def test_copy_follows_the_with_stream_block(backend):
    stream = Stream(Device(0))
    host = np.arange(8, dtype=np.float32)
    with stream:
        arr = cuctx.to_device(host)  # allocated and copied on `stream`
        assert arr._alloc.stream == stream
        out = cuctx.pinned_empty(8, np.float32)
        arr.to_host(out=out)
        stream.synchronize()
    np.testing.assert_array_equal(out, host)


# -- pinned and pageable host memory ------------------------------------------------------


def test_pinned_empty_is_a_numpy_array_freed_with_it(backend):
    pinned = cuctx.pinned_empty((4, 8), np.float32)
    assert isinstance(pinned, np.ndarray) and pinned.shape == (4, 8) and pinned.dtype == np.float32
    pinned[:] = 3
    assert pinned.sum() == 96
    assert cuctx.pinned_empty(0).size == 0


def test_pageable_copies_are_synchronous(backend):
    host = np.arange(1 << 16, dtype=np.float32)
    arr = cuctx.to_device(host)
    host[:] = -1  # the copy already took the data: reusing the host array is safe
    back = arr.to_host()  # pageable destination: the data is there on return
    np.testing.assert_array_equal(back, np.arange(1 << 16, dtype=np.float32))


def test_pinned_copies_are_complete_after_a_stream_sync(backend):
    stream = Stream(Device(0))
    pinned = cuctx.pinned_empty(1 << 16, np.float32)
    pinned[:] = 2
    arr = cuctx.empty(1 << 16, np.float32, stream=stream)
    cuctx.copy(arr, pinned, stream=stream)
    out = cuctx.pinned_empty(1 << 16, np.float32)
    out[:] = 0
    cuctx.copy(out, arr, stream=stream)
    stream.synchronize()
    assert out.sum() == 2 << 16


def test_pinned_copies_are_asynchronous_on_the_sim(sim):
    stream = Stream(Device(0))
    arr = cuctx.full(1024, 5.0, stream=stream)
    out = cuctx.pinned_empty(1024)
    out[:] = 0
    arr.to_host(out=out, stream=stream)
    assert out.sum() == 0  # queued, not run: pinned copies do not wait
    stream.synchronize()
    assert out.sum() == 5 * 1024


def test_register_host_makes_copies_asynchronous_for_the_arrays_life(sim):
    stream = Stream(Device(0))
    arr = cuctx.full(256, 1.0, stream=stream)
    host = np.zeros(256)
    assert cuctx.register_host(host) is host
    arr.to_host(out=host, stream=stream)
    assert host.sum() == 0  # page-locked now: asynchronous
    stream.synchronize()
    assert host.sum() == 256
    ptr = host.__array_interface__["data"][0]
    assert sim.driver._pinned(ptr, 256 * 8)
    del host
    gc.collect()
    assert not sim.driver._pinned(ptr, 256 * 8)  # unregistered with the array


def test_registering_page_locked_memory_twice_is_refused(backend):
    host = np.zeros(1024)
    cuctx.register_host(host)
    with pytest.raises(cuctx.CudaError, match="already page-locked") as info:
        cuctx.register_host(host)
    assert info.value.name == "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED"
    with pytest.raises(ValueError, match="contiguous"):
        cuctx.register_host(np.zeros((4, 4))[:, 1])
    with pytest.raises(TypeError, match="numpy.ndarray"):
        cuctx.register_host([1, 2])


# -- the missing-wait race, with arrays -----------------------------------------------------


def normalise_then_sum(wait: bool) -> float:
    """The seeds' bug: a sum on one stream reads an array that another stream is still
    normalising. 'Normalise' is an async copy of the normalised values into the array on
    s_norm (after busy work there); 'sum' copies it back on s_sum and adds up on the host."""
    s_norm, s_sum = Stream(Device(0)), Stream(Device(0))
    raw = np.arange(1, 4097, dtype=np.float64)
    data = cuctx.zeros(raw.size, stream=s_norm)
    s_norm.synchronize()
    normalised = cuctx.pinned_empty(raw.size)
    normalised[:] = raw / raw.sum()
    busy(s_norm, 20)
    cuctx.copy(data, normalised, stream=s_norm)
    if wait:
        s_sum.wait(s_norm)
    out = cuctx.pinned_empty(raw.size)
    cuctx.copy(out, data, stream=s_sum)
    s_sum.synchronize()
    return float(out.sum())


def test_sum_waiting_for_the_normalisation_is_correct(backend):
    assert normalise_then_sum(wait=True) == pytest.approx(1.0)


def test_sum_without_the_wait_reads_stale_data_on_the_sim(sim):
    with pytest.warns(cuctx.RaceWarning, match=r"fix: s_sum\.wait\(s_norm\) before line"):
        assert normalise_then_sum(wait=False) == 0.0  # the zeros from before normalising


# -- stream-ordered frees -------------------------------------------------------------------


def use_on_another_stream_then_free(keep) -> tuple[np.ndarray, int, int]:
    """Allocate on s_alloc, read on s_use (queued), drop the array, allocate again on
    s_alloc and overwrite. ``keep(arr, s_use)`` is what protects the first array's memory.
    Returns what s_use read and the two addresses."""
    s_alloc, s_use = Stream(Device(0)), Stream(Device(0))
    host = np.arange(4096, dtype=np.float32)
    arr = cuctx.to_device(host, stream=s_alloc)
    first = arr.ptr
    out = cuctx.pinned_empty(4096, np.float32)
    s_use.wait(s_alloc)
    busy(s_use, 20)  # s_use is busy: its read of arr comes late
    cuctx.copy(out, arr, stream=s_use)
    with keep(arr, s_use):
        del arr
        gc.collect()  # the free is queued on s_alloc
        again = cuctx.full(4096, -1.0, np.float32, stream=s_alloc)
        second = again.ptr
        s_alloc.synchronize()
        s_use.synchronize()  # the read is done before memory held by keep() is freed
    return out, first, second


class record_stream:
    def __init__(self, arr, stream):
        arr.record_stream(stream)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_record_stream_keeps_memory_until_the_other_stream_is_done(backend):
    out, _, _ = use_on_another_stream_then_free(record_stream)
    np.testing.assert_array_equal(out, np.arange(4096, dtype=np.float32))


def test_defer_cleanup_holds_frees_until_the_block_ends(backend):
    out, first, second = use_on_another_stream_then_free(lambda arr, s: cuctx.defer_cleanup())
    np.testing.assert_array_equal(out, np.arange(4096, dtype=np.float32))
    assert first != second  # held, so not reused inside the block


def test_without_record_stream_a_reused_block_is_overwritten_on_the_sim(sim):
    import contextlib

    with pytest.warns(
        cuctx.RaceWarning,
        match="free while in use .*\n.*\n.*\n.*\n"
        r"  fix: call array.record_stream\(s_use\)",
    ):
        out, first, second = use_on_another_stream_then_free(
            lambda arr, s: contextlib.nullcontext()
        )
    assert first == second  # the same stream reused the block at once
    assert (out == -1).all()  # and the late reader saw the new owner's data


def test_memory_comes_back_after_defer_cleanup(sim):
    device = Device(0)
    before = device.mem_info().free
    with cuctx.defer_cleanup():
        arr = cuctx.empty(1 << 20)
        del arr
        gc.collect()
        assert device.mem_info().free < before  # held
    device.primary_context.synchronize()
    assert device.mem_info().free == before


def python_run(fn) -> set[str]:
    """The functions of memory/_alloc.py and _lifetimes.py that ``fn()`` ran (in Python)."""
    files, ran = {_alloc.__file__, _lifetimes.__file__}, set()

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_filename in files:
            ran.add(frame.f_code.co_name)

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return ran


@pytest.mark.paths("python", "native")
def test_an_arrays_memory_is_freed_alike_on_every_path(backend, path, monkeypatch, request):
    """cuctx.empty's memory from the device's pool and its free: allocated and freed in C on
    the compiled path (nothing of memory/_alloc.py or _lifetimes.py runs), through
    `from_pool` and `Allocation.__del__` otherwise, with the same effects: a dropped array is
    freed on its stream at once (its context files one pending free less; the sim gives the
    block to the next allocation there), a `defer_cleanup` block holds the free until it
    ends, and a context's teardown frees the arrays still alive."""
    unraisable = []  # (an error of a free at a collection is reported here)
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    # Arrays of an earlier test in reference cycles, collected midway, would change the count
    # (collected now, their frees are taken by the first allocation).
    gc.collect()
    gc.disable()
    request.addfinalizer(gc.enable)
    # Frees an earlier test's torn-down context left on this device send its next allocation
    # through from_pool (it frees them first): set aside meanwhile.
    monkeypatch.setattr(_lifetimes, "orphans", {})
    s = Stream(Device(0))
    cuctx.empty(1, np.float32, stream=s)  # (the first files the context's pending frees)
    live = lambda: len(s.context._allocations)  # noqa: E731
    before = live()

    def make_and_drop() -> int:
        arr = cuctx.empty(1024, np.float32, stream=s)
        assert live() == before + 1
        return arr.ptr

    ptrs = []
    ran = python_run(lambda: ptrs.append(make_and_drop()))
    assert live() == before
    if path == "native":
        assert not ran
    else:
        assert {"from_pool", "__del__", "_release"} <= ran
    if backend.sim is not None:
        assert cuctx.empty(1024, np.float32, stream=s).ptr == ptrs[0]  # freed on s: reused
    with cuctx.defer_cleanup():
        held = make_and_drop()
        assert live() == before and len(_lifetimes._deferred) == 1
        kept = cuctx.empty(1024, np.float32, stream=s)
        assert kept.ptr != held  # still allocated
    assert not _lifetimes._deferred
    if backend.sim is not None:
        assert cuctx.empty(1024, np.float32, stream=s).ptr == held  # freed at the block's end

    ctx = Context.create(Device(0))
    try:
        first = cuctx.empty(256, np.float32)  # (the context's first allocation)
        second = cuctx.empty(256, np.float32)
    finally:
        Context.pop()
    freed = []
    with _trace.sink(lambda op: freed.extend(a.ptr for a in op.accesses), kinds=["free"]):
        ctx.destroy()
    assert sorted(freed) == sorted([first.ptr, second.ptr])
    assert not first._alloc.alive and not second._alloc.alive
    del first, second, kept  # (theirs have nothing left to free)
    gc.collect()
    assert not unraisable


@pytest.mark.paths("python", "native")
def test_a_devices_orphaned_frees_are_freed_by_its_next_allocation_alone(
    backend, path, monkeypatch
):
    """Memory a torn-down context could not free (`_lifetimes.orphans`) is freed by the next
    allocation on its device, on every path. Another device's orphans change nothing: the
    compiled path still allocates in C, without `from_pool`."""
    s = Stream(Device(0))
    keep = [cuctx.empty(1, np.float32, stream=s)]  # (the first files the context's frees)
    elsewhere = object()  # a device that has not allocated since
    monkeypatch.setattr(_lifetimes, "orphans", {elsewhere: [1234]})
    ran = python_run(lambda: keep.append(cuctx.empty(256, np.float32, stream=s)))
    assert ("from_pool" in ran) == (path == "python")
    assert _lifetimes.orphans == {elsewhere: [1234]}

    drv = backend.driver
    with s.context:
        err, ptr = drv.cuMemAllocAsync(4096, s._handle)
        assert not err
    _lifetimes.orphans[Device(0)] = [int(ptr)]
    before = Device(0).mem_info().free
    ran = python_run(lambda: keep.append(cuctx.empty(256, np.float32, stream=s)))
    assert {"from_pool", "free_orphans"} <= ran
    assert _lifetimes.orphans == {elsewhere: [1234]}
    s.synchronize()
    if backend.sim is not None:  # (a GPU's pool may keep the freed block reserved)
        assert Device(0).mem_info().free > before


@pytest.mark.paths("python", "native")
def test_an_allocations_refusals_are_the_same_on_every_path(sim, path):
    """The driver's refusals of cuctx.empty's allocation, raised as `from_pool` raises them
    on every path: out of memory after its retry, with its words; a sticky fault poisons the
    context."""
    s = Stream(Device(0))
    cuctx.empty(1, np.uint8, stream=s)  # (the compiled path takes a dtype seen before)
    with pytest.raises(OutOfMemoryError, match=rf"asked for {2**61} bytes on device 0"):
        cuctx.empty(2**61, np.uint8, stream=s)
    cuctx.sim.inject_fault(s.context, CUresult.CUDA_ERROR_ILLEGAL_ADDRESS)
    with pytest.raises(StickyFaultError, match="cuMemAllocAsync failed: CUDA_ERROR_ILLEGAL"):
        cuctx.empty(4, np.uint8, stream=s)
    with pytest.raises(ContextPoisonedError, match="cuctx.empty"):
        cuctx.empty(4, np.uint8, stream=s)


def test_record_stream_refuses_memory_cuctx_does_not_own(backend):
    arr = cuctx.zeros(4)

    class Producer:
        __cuda_array_interface__ = arr.__cuda_array_interface__

    with pytest.raises(ValueError, match="another library"):
        cuctx.asarray(Producer()).record_stream(Stream(Device(0)))


# -- contexts, faults, out of memory --------------------------------------------------------


def test_an_array_keeps_its_context_alive_and_fails_after_destroy(backend):
    ctx = Context.create(Device(0))
    try:
        arr = cuctx.to_device(np.ones(16))
        assert arr.context is ctx
    finally:
        Context.pop()
    del ctx
    gc.collect()
    assert arr.context.state == "active"  # still alive: the array holds it
    np.testing.assert_array_equal(arr.to_host(), np.ones(16))
    arr.context.destroy()
    for use in (
        arr.to_host,
        lambda: arr.fill(1),
        lambda: cuctx.copy(arr, np.ones(16)),
        lambda: arr.__cuda_array_interface__,
    ):
        with pytest.raises(ContextDestroyedError):
            use()
    arr = None  # (the lambdas above read `arr`: rebind rather than del)
    gc.collect()  # freeing after the context is gone is quietly skipped


@pytest.mark.device_memory  # on a GPU the failed allocation takes all free memory for a while
def test_out_of_memory_names_the_sizes(backend):
    total = Device(0).total_memory
    with pytest.raises(
        OutOfMemoryError,
        match=r"asked for \d+ bytes on device 0 \(free \d+ of "
        f"{total}\\)",
    ) as info:
        cuctx.empty(total // 4 * 5, np.uint8)
    assert isinstance(info.value, MemoryError)
    cuctx.zeros(16).to_host()  # and the device still works
    other = Context.create(Device(0))  # with memory for a new context: nothing kept reserved
    Context.pop()
    other.destroy()


def test_a_shape_beyond_any_address_space_is_a_value_error_naming_the_bytes(backend):
    huge = (2**40, 2**40)  # 2**82 bytes of float32: no size_t holds it
    for make in (
        lambda: cuctx.empty(huge, np.float32),
        lambda: cuctx.zeros(huge, np.float32),
        lambda: cuctx.full(huge, 1.0, np.float32),
        lambda: cuctx.pinned_empty(huge, np.float32),
    ):
        with pytest.raises(
            ValueError,
            match=rf"shape \(1099511627776, 1099511627776\) and "
            rf"dtype float32 would take {2**82} bytes, more than any array",
        ):
            make()
    cuctx.zeros(16).to_host()  # and the device still works


def test_a_shape_larger_than_the_memory_is_out_of_memory_naming_the_bytes(backend):
    # 2 EiB: a size_t holds it, no device or host memory (and no 57-bit address space) does.
    with pytest.raises(OutOfMemoryError, match=rf"asked for {2**61} bytes on device 0"):
        cuctx.empty(2**61, np.uint8)
    with pytest.raises(OutOfMemoryError, match=rf"asked for {2**61} bytes of page-locked"):
        cuctx.pinned_empty(2**61, np.uint8)
    assert cuctx.to_device(np.arange(4)).to_host().tolist() == [0, 1, 2, 3]


def test_a_use_after_free_is_an_illegal_address_on_the_sim(sim):
    s_alloc, s_use = Stream(Device(0)), Stream(Device(0))
    arr = cuctx.zeros(64, stream=s_alloc)
    out = cuctx.pinned_empty(64)
    s_use.wait(s_alloc)
    cuctx.copy(out, arr, stream=s_use)  # queued on s_use; arr is not recorded there
    with pytest.warns(cuctx.RaceWarning, match="free while in use"):
        del arr
        gc.collect()
    s_alloc.synchronize()  # the free runs
    with pytest.raises(StickyFaultError, match="ILLEGAL_ADDRESS"):
        s_use.synchronize()  # now the read runs, on freed memory
    with pytest.raises(ContextPoisonedError):
        cuctx.zeros(4)


# -- bad input ----------------------------------------------------------------------------


def test_bad_shapes_and_dtypes_are_refused(backend):
    with pytest.raises(ValueError, match="negative dimension"):
        cuctx.empty((3, -1))
    with pytest.raises(ValueError, match="negative dimension"):
        cuctx.empty(-5)
    with pytest.raises(TypeError, match="shape"):
        cuctx.empty((2.5, 3))
    with pytest.raises(TypeError, match=r"a shape is an int or a tuple of ints, not \(True, 2\)"):
        cuctx.empty((True, 2))  # refused, as NumPy refuses it (not a shape of (1, 2))
    with pytest.raises(TypeError, match="shape"):
        cuctx.zeros(4).reshape(True, 4)
    with pytest.raises(TypeError, match="bool, integer, float or complex"):
        cuctx.empty(3, object)
    with pytest.raises(TypeError, match="bool, integer, float or complex"):
        cuctx.to_device(np.array(["a", "b"]))


def test_copies_between_mismatched_arrays_are_refused(backend):
    arr = cuctx.zeros((3, 4), np.float32)
    with pytest.raises(ValueError, match=r"shapes differ: dst \(3, 4\), src \(4, 3\)"):
        arr.copy_from(np.zeros((4, 3), np.float32))
    with pytest.raises(TypeError, match="dtypes differ: dst float32, src float64"):
        arr.copy_from(np.zeros((3, 4)))
    with pytest.raises(TypeError, match="dtypes differ"):
        arr.to_host(out=np.zeros((3, 4), np.int32))
    repeated = np.lib.stride_tricks.as_strided(np.zeros(4, np.float32), (3, 4), (0, 4))
    with pytest.raises(ValueError, match="elements overlap"):
        arr.to_host(out=repeated)  # the one layout a destination cannot have
    with pytest.raises(ValueError, match="read-only"):
        out = np.zeros((3, 4), np.float32)
        out.flags.writeable = False
        arr.to_host(out=out)
    with pytest.raises(TypeError, match="numpy.copyto"):
        cuctx.copy(np.zeros(3), np.zeros(3))
    with pytest.raises(TypeError, match="numpy.ndarray"):
        arr.copy_from([[1.0] * 4] * 3)
    with pytest.raises(TypeError, match="truncated"):
        cuctx.zeros(3, np.int32).fill(1.5)
    with pytest.raises(IndexError, match="basic indices"):
        arr[[0, 1]]
    with pytest.raises(IndexError):
        arr[3]
    with pytest.raises(TypeError, match="to_host"):
        np.asarray(arr)


def test_streams_of_another_device_or_context_are_refused(backend):
    arr = cuctx.zeros(4)
    other = Context.create(Device(0))
    try:
        foreign = Stream(Device(0))
    finally:
        Context.pop()
    with pytest.raises(ValueError, match="use a stream of the same context"):
        arr.to_host(stream=foreign)
    with pytest.raises(ValueError, match="use a stream of the same context"):
        arr.fill(1, stream=foreign)
    other.destroy()
    if len(cuctx.devices()) > 1:
        s1 = Stream(Device(1))
        with pytest.raises(ValueError, match="use a stream of the same context"):
            arr.copy_from(np.zeros(4), stream=s1)
        with pytest.raises(ValueError, match=r"device=<Device 0 .* is on <Device 1"):
            cuctx.empty(4, device=0, stream=s1)


# -- the sim's address space --------------------------------------------------------------


def test_sim_pointers_are_global_and_tell_their_device(sim):
    drv = sim.driver
    a = cuctx.zeros(100, np.float32, device=0)
    b = cuctx.zeros(100, np.float32, device=1)
    assert a.ptr != b.ptr
    from cuda.bindings.driver import CUpointer_attribute

    attr = CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
    assert drv.cuPointerGetAttribute(attr, a.ptr + 396) == (CUresult.CUDA_SUCCESS, 0)
    assert drv.cuPointerGetAttribute(attr, b.ptr) == (CUresult.CUDA_SUCCESS, 1)


def test_sim_device_view_is_bounds_checked_and_pointer_arithmetic_works(sim):
    drv = sim.driver
    arr = cuctx.to_device(np.arange(10, dtype=np.int32))
    err, view = drv._device_view(arr.ptr + 8, 8)  # elements 2 and 3
    assert err == CUresult.CUDA_SUCCESS and view.view(np.int32).tolist() == [2, 3]
    view.view(np.int32)[:] = [20, 30]  # kernel twins write through the view
    assert arr.to_host()[2:4].tolist() == [20, 30]
    assert drv._device_view(arr.ptr + 36, 8)[0] == CUresult.CUDA_ERROR_ILLEGAL_ADDRESS
    assert drv._device_view(12345, 1)[0] == CUresult.CUDA_ERROR_ILLEGAL_ADDRESS


def test_driver_answers_memory_misuse_the_same_on_both_backends(backend):
    # The real driver's answers were recorded on an H100 by scripts/probe_memory.py, for a
    # cuMemAlloc buffer (not a pool block, whose neighbours belong to the pool).
    drv = backend.driver
    with Device(0):
        err, buf = drv.cuMemAlloc(32)
        assert not err
        host = np.zeros(4)
        address = host.__array_interface__["data"][0]
        err, null = drv.cuMemAllocAsync(0, 0)
        assert not err and int(null) == 0
        err = drv.cuMemcpyHtoDAsync(int(buf) + 32, address, 8, 0)[0]
        assert err == CUresult.CUDA_ERROR_INVALID_VALUE
        assert drv.cuMemcpyDtoH(address, buf, 40)[0] == CUresult.CUDA_ERROR_INVALID_VALUE
        assert drv.cuMemFreeAsync(int(buf) + 8, 0)[0] == CUresult.CUDA_ERROR_INVALID_VALUE
        assert drv.cuMemFreeHost(address)[0] == CUresult.CUDA_ERROR_INVALID_VALUE
        assert drv.cuMemHostUnregister(address)[0] == CUresult.CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED
        assert drv.cuMemFree(buf) == (CUresult.CUDA_SUCCESS,)
        assert drv.cuMemFree(buf)[0] == CUresult.CUDA_ERROR_INVALID_VALUE
        assert drv.cuCtxSynchronize() == (CUresult.CUDA_SUCCESS,)  # nothing was poisoned


def test_sim_releases_a_contexts_memory_with_it(sim):
    device = Device(0)
    before = device.mem_info().free
    ctx = Context.create(device)
    try:
        arr = cuctx.empty(1 << 20)
        ptr = arr.ptr
        assert device.mem_info().free < before
    finally:
        Context.pop()
    ctx.destroy()
    assert device.mem_info().free == before
    assert sim.driver._device_view(ptr, 8)[0] == CUresult.CUDA_ERROR_ILLEGAL_ADDRESS


def test_a_context_dropped_with_its_arrays_frees_them_before_it_goes(backend):
    """A created context and its arrays that become garbage in one collection (a traceback's
    frames hold both): the arrays' frees run while the context works (pushing a destroyed
    context to free corrupts the heap)."""
    freed = []
    sink = lambda op: freed.extend(a.ptr for a in op.accesses)  # noqa: E731
    _trace.add_sink(sink, kinds=["free"])
    try:
        with cuctx.racecheck("off"):  # (the checker's history would hold the context)
            for _ in range(3):  # (each collection's order is arbitrary: several chances)
                ctx = Context.create(Device(0))
                try:
                    arrays = [cuctx.zeros(256, np.float32) for _ in range(3)]
                    ctx.synchronize()  # (queued work holds its context)
                finally:
                    Context.pop()
                ptrs = [a.ptr for a in arrays]
                garbage = [ctx, arrays]
                garbage.append(garbage)
                del ctx, arrays, garbage
                freed.clear()
                gc.collect()
                assert sorted(freed) == sorted(ptrs)
    finally:
        _trace.remove_sink(sink)
    assert cuctx.to_device(np.arange(4)).to_host().tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize("make", ["register_host", "pinned_empty"])
def test_a_host_array_dropped_while_its_copy_is_queued_stays_valid(backend, make):
    """An asynchronous copy reads page-locked host memory after the call returns: the
    stream must keep the array alive until then, whatever the caller does with it."""
    with Device(0):
        stream = cuctx.Stream()
        busy(stream, 20)  # the copy waits behind this
        if make == "register_host":
            host = cuctx.register_host(np.full(1 << 20, 7, np.uint8))
        else:
            host = cuctx.pinned_empty(1 << 20, np.uint8)
            host[:] = 7
        dev = cuctx.empty(host.shape, np.uint8, stream=stream)
        cuctx.copy(dev, host, stream=stream)
        del host
        gc.collect()  # unregisters / frees the host memory, were nothing holding it
        stream.synchronize()
        assert (dev.to_host() == 7).all()


def test_implicit_streams_follow_the_array_context_not_the_current_stream(backend):
    """Inside `with s1:` (a stream of a created context), work on an array of another
    context that names no stream runs on that array's own context's stream."""
    device = Device(0)
    with device:
        arr = cuctx.to_device(np.arange(4, dtype=np.float32))
    ctx = Context.create(device)
    Context.pop()
    try:
        with ctx:
            s1 = cuctx.Stream()
        with s1:
            assert arr.to_host().tolist() == [0, 1, 2, 3]
            arr.fill(2)
            assert arr.to_host().tolist() == [2, 2, 2, 2]
    finally:
        ctx.destroy()


def test_foreign_array_makes_the_given_stream_wait_for_its_producer(backend):
    with Device(0):
        producer, consumer = cuctx.Stream(), cuctx.Stream()
        x = cuctx.zeros(4, np.float32, stream=producer)  # zeroed where it is written next
        busy(producer, 20)
        x.fill(5, stream=producer)  # the producer's last write, still queued

        class Foreign:  # another library's array, produced on `producer`
            __cuda_array_interface__ = {
                "version": 3,
                "shape": (4,),
                "typestr": "<f4",
                "data": (x.ptr, False),
                "strides": None,
                "stream": producer.handle,
            }

        view = cuctx.asarray(Foreign(), stream=consumer)
        out = cuctx.pinned_empty(4, np.float32)
        view.to_host(out=out, stream=consumer)
        consumer.synchronize()
        assert out.tolist() == [5, 5, 5, 5]


def test_pinned_empty_keeps_structured_dtypes_and_refuses_objects(backend):
    record = np.dtype([("a", "<i4"), ("b", "<f8")])
    assert cuctx.pinned_empty(3, record).dtype == record
    with pytest.raises(TypeError, match="Python objects"):
        cuctx.pinned_empty(3, object)  # uninitialised object pointers would crash NumPy


def test_to_device_of_a_device_array_copies_it(backend):
    arr = cuctx.to_device(np.arange(6.0).reshape(2, 3))
    again = cuctx.to_device(arr.T)
    assert again.ptr != arr.ptr and again.strides == (16, 8)
    np.testing.assert_array_equal(again.to_host(), np.arange(6.0).reshape(2, 3).T)


def _device_memory_in_use(backend, device) -> int:
    """Bytes in use on ``device`` once its work is done and its pool gave back what is free."""
    drv = backend.driver
    with device as primary:
        primary.synchronize()
        err, pool = drv.cuDeviceGetDefaultMemPool(device._handle)
        assert not err, err
        (err,) = drv.cuMemPoolTrimTo(pool, 0)
        assert not err, err
        free, total = device.mem_info()
    return total - free


@pytest.mark.device_memory
def test_arrays_that_outlive_their_context_give_their_memory_back(backend):
    """Stream-ordered memory comes from the device's pool, which outlives contexts: the driver
    does not free it with a destroyed or reset context (measured on an H100), so cuctx frees
    what is left just before. The arrays then refuse every use."""
    device = Device(0)
    before = _device_memory_in_use(backend, device)
    ctx = Context.create(device)
    in_created = cuctx.zeros(64 << 20, np.uint8)
    Context.pop()
    ctx.destroy()
    assert _device_memory_in_use(backend, device) < before + (64 << 20)
    with device:
        in_primary = cuctx.zeros(64 << 20, np.uint8)
    device.reset()
    assert _device_memory_in_use(backend, device) < before + (64 << 20)
    for arr in (in_created, in_primary):
        with pytest.raises(ContextDestroyedError):
            arr.to_host()
    del in_created, in_primary
    gc.collect()  # their finalizers have nothing left to do
    assert _device_memory_in_use(backend, device) < before + (64 << 20)
