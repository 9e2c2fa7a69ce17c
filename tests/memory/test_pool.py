"""Explicit memory pools (cuctx.MemoryPool) and the device's default pool (Device.memory_pool)
on both backends and both hot paths: what a pool counts, when it gives memory back (release
threshold, trim, max_size), how long it lives (its arrays hold it; it outlives contexts), and
that arrays from a pool are arrays like any other for kernels, streams, record_stream,
defer_cleanup, the race checker, captures and AutoGraph. Bad arguments are clear errors."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

import cuctx
from cuctx import Device, MemoryPool, _trace
from cuctx.sim import stream_busy

from scenarios import ADD_SOURCE, add, driver_calls, library_fixture

pytestmark = [pytest.mark.usefixtures("nvrtc_cache"), pytest.mark.paths("python", "native")]

lib = library_fixture(ADD_SOURCE, add=add)
MiB = 1 << 20


def collect() -> None:
    """Let the dropped arrays' frees run and their memory go back (threshold 0)."""
    gc.collect()
    cuctx.synchronize()


@pytest.fixture
def pool(backend):
    with Device(0):
        yield MemoryPool(Device(0))
    collect()


# -- counting and giving back ---------------------------------------------------------------


def test_a_pool_counts_the_bytes_asked_for_and_gives_them_back(pool):
    a = cuctx.zeros(1000, np.float32, pool=pool)
    assert a.pool is pool
    assert pool.used == 4000 and pool.reserved >= 4000 and pool.high_water == 4000
    assert a.to_host().tolist() == [0.0] * 1000
    del a
    collect()
    assert (pool.used, pool.reserved) == (0, 0)  # release threshold 0: all of it, at once
    assert pool.high_water == 4000  # a high-water mark stays


def test_arrays_of_a_pool_work_in_kernels(pool, lib):
    x = cuctx.to_device(np.arange(8, dtype=np.float32), pool=pool)
    out = cuctx.empty(8, np.float32, pool=pool)
    lib["add"][1, 8](out, x, 2.0, 8)
    assert out.to_host().tolist() == [float(i + 2) for i in range(8)]
    full = cuctx.full((2, 3), 7, np.int16, pool=pool)
    assert full.to_host().tolist() == [[7] * 3] * 2 and full.pool is pool


def test_a_release_threshold_keeps_memory_until_a_trim(backend):
    with Device(0):
        pool = MemoryPool(0, release_threshold=64 * MiB)
        assert pool.release_threshold == 64 * MiB
        a = cuctx.empty(8 * MiB, np.uint8, pool=pool)
        del a
        collect()
        kept = pool.reserved
        assert pool.used == 0 and kept >= 8 * MiB  # below the threshold: kept
        pool.trim(kept)  # keeps at least what it is asked to keep
        assert pool.reserved == kept
        pool.trim()
        assert pool.reserved == 0
        pool.release_threshold = 0
        assert pool.release_threshold == 0


def test_max_size_caps_the_pool(backend):
    with Device(0):
        pool = MemoryPool(Device(0), max_size=MiB)
        assert pool.max_size == MiB
        # The driver rounds the cap up to its reservation granularity (32 MiB on an H100,
        # and on the sim), so 16 MiB fit and 48 MiB do not.
        a = cuctx.empty(16 * MiB, np.uint8, pool=pool)
        with pytest.raises(cuctx.OutOfMemoryError, match="max_size 1048576"):
            cuctx.empty(48 * MiB, np.uint8, pool=pool)
        assert pool.used == 16 * MiB  # the refusal changed nothing
        del a


def test_the_default_pool_is_where_plain_allocations_go(backend):
    device = Device(0)
    default = device.memory_pool
    assert default is device.memory_pool and "(default)" in repr(default)
    with device:
        before = default.used
        a = cuctx.empty(1000, np.uint8)
        assert a.pool is default and default.used == before + 1000
        with pytest.raises(TypeError, match=r"MemoryPool\(device, ipc=True\)"):
            default._share()
        del a
        collect()
        assert default.used == before


def test_the_repr_says_what_the_pool_holds(pool):
    a = cuctx.empty(100, np.uint8, pool=pool)
    assert repr(pool).startswith(
        f"<MemoryPool {int(pool._handle):#x} of device 0: used 100 B, reserved "
    )
    assert "ipc" in repr(MemoryPool(0, ipc=True)) and "max_size 5" in repr(
        MemoryPool(0, max_size=5)
    )
    del a


# -- lifetime -----------------------------------------------------------------------------


@pytest.mark.device_memory
def test_arrays_hold_their_pool_which_goes_with_the_last_one(backend):
    with Device(0):
        before = Device(0).mem_info().free
        pool = MemoryPool(0)
        a = cuctx.full(64, 3, np.int32, pool=pool)
        view = a[8:]
        gone = weakref.ref(pool)
        del pool, a
        gc.collect()
        assert gone() is not None  # the view keeps its allocation, which keeps the pool
        assert view.to_host().tolist() == [3] * 56
        del view
        collect()
        assert gone() is None
        assert Device(0).mem_info().free == before


def test_a_pool_dying_in_one_collection_with_its_arrays_is_destroyed_after_their_frees(
    backend, monkeypatch
):
    """A traceback's frames (a `pytest.raises`, an exception kept) can hold a pool and its
    arrays, which then die in one garbage collection, their finalizers in any order. The
    pool must be destroyed after its arrays' frees were queued: the other order crashed
    the process at the next pool's allocation on two H200s (driver 580)."""
    drv = backend.driver
    calls = []
    real_destroy = drv.cuMemPoolDestroy
    monkeypatch.setattr(
        drv,
        "cuMemPoolDestroy",
        lambda handle: calls.append(("destroy", int(handle))) or real_destroy(handle),
        raising=False,
    )

    def freed(op):  # announced once the driver took the free (the compiled path's too)
        calls.extend(("free", access.ptr) for access in op.accesses)

    _trace.add_sink(freed, kinds=["free"])
    try:
        with Device(0):
            for _ in range(4):  # (each collection's order is arbitrary: several chances)
                pool = MemoryPool(0)
                arrays = [cuctx.zeros(256, np.float32, pool=pool) for _ in range(3)]
                ptrs, key = [a.ptr for a in arrays], pool._key
                garbage = [pool, arrays]
                garbage.append(garbage)  # one cycle, collected at once
                del pool, arrays, garbage
                calls.clear()
                gc.collect()
                assert ("destroy", key) in calls
                destroyed = calls.index(("destroy", key))
                assert all(calls.index(("free", ptr)) < destroyed for ptr in ptrs), calls
            # and a new pool allocates afterwards
            pool = MemoryPool(0)
            assert cuctx.full(8, 2.0, np.float32, pool=pool).to_host().tolist() == [2.0] * 8
    finally:
        _trace.remove_sink(freed)


@pytest.mark.parametrize("location", ["device", "host"])
def test_a_pool_is_destroyed_once_the_frees_of_its_memory_have_run(backend, location, monkeypatch):
    """A pool destroyed while the frees of its memory were still queued behind other work
    crashed the process at the next pool's first allocation (an H200, driver 580, while
    another process used the GPU), though the driver promises to wait for them: the destroy
    waits for the contexts that queued them."""
    calls = driver_calls(monkeypatch, backend.driver, "cuMemPoolDestroy", "cuCtxSynchronize")
    with Device(0):
        try:
            pool = MemoryPool(0, location=location)
        except cuctx.NotSupportedError as exc:
            pytest.skip(f"this driver or device makes no {location} pools: {exc}")
        stream = cuctx.Stream()
        x = cuctx.full(256, 1.0, np.float32, pool=pool, stream=stream)
        if backend.sim is not None:  # the free waits behind 10 ms of other work
            stream_busy(stream, 10_000_000)
        del x
        gc.collect()  # (an earlier test's garbage, whose finalizers may synchronize too)
        calls.clear()
        del pool
        gc.collect()
        assert [name for name, _ in calls] == ["cuCtxSynchronize", "cuMemPoolDestroy"]
        if backend.sim is not None:
            assert backend.sim.pools_destroyed_early() == 0
        pool = MemoryPool(0, location=location)  # and the next pool allocates
        assert cuctx.full(8, 2.0, np.float32, pool=pool).to_host().tolist() == [2.0] * 8


def test_the_sims_pools_are_gone_with_their_arrays(sim):
    driver = sim.driver
    with Device(0):
        pools = set(driver._mempools)
        pool = MemoryPool(0, ipc=True)
        a = cuctx.zeros(1 << 16, np.uint8, pool=pool)
        assert len(driver._mempools) == len(pools) + 1
        del pool, a
        collect()
        assert set(driver._mempools) == pools


def test_a_pool_outlives_a_context_its_arrays_used(pool):
    other = cuctx.Context.create(Device(0))
    try:
        a = cuctx.full(1000, 1, np.uint8, pool=pool)  # on the new context's stream
        assert a.context is other
    finally:
        cuctx.Context.pop()
    other.destroy()  # frees a's memory first: the pool would outlive it
    collect()
    assert pool.used == 0
    b = cuctx.zeros(10, pool=pool)  # the pool still allocates, in the primary context
    assert b.to_host().tolist() == [0.0] * 10


# -- streams and frees ---------------------------------------------------------------------


def test_record_stream_and_defer_cleanup_hold_a_pool_array_like_any(pool):
    s = cuctx.Stream()
    a = cuctx.zeros(1000, np.uint8, stream=s, pool=pool)
    a.record_stream(cuctx.Stream())
    with cuctx.defer_cleanup():
        del a
        gc.collect()
        cuctx.synchronize()
        assert pool.used == 1000  # held until the block ends
    collect()
    assert pool.used == 0


def test_the_race_checker_sees_a_pool_arrays_free(pool, lib):
    s1, s2 = cuctx.Stream(), cuctx.Stream()
    x = cuctx.zeros(1024, np.float32, stream=s1, pool=pool)
    y = cuctx.empty(1024, np.float32, stream=s2)
    cuctx.synchronize()
    with pytest.raises(cuctx.RaceError) as info:
        with cuctx.racecheck():
            # n = 0: the kernel touches nothing (the sim's checks stay quiet), and the checker
            # sees x passed as an input on s2, as it would for any n
            lib["add"][1, 1, 0, s2](y, x, 0.0, 0)
            del x  # freed on s1 while s2 may still read it
    assert [f.kind for f in info.value.findings] == ["free while in use"]
    cuctx.synchronize()


def test_a_capture_turns_a_pool_allocation_into_graph_memory(pool, lib):
    s = cuctx.Stream()
    x = cuctx.to_device(np.arange(8, dtype=np.float32), stream=s)
    out = cuctx.zeros(8, np.float32, stream=s)
    with s.capture() as graph:
        tmp = cuctx.empty(8, np.float32, stream=s, pool=pool)
        lib["add"][1, 8, 0, s](tmp, x, 1.0, 8)
        lib["add"][1, 8, 0, s](out, tmp, 1.0, 8)
        del tmp
    assert sorted(node.kind for node in graph.nodes) == ["alloc", "free", "kernel", "kernel"]
    graph.instantiate().launch(s)
    s.synchronize()
    assert out.to_host().tolist() == [float(i + 2) for i in range(8)]


def test_an_ipc_pool_cannot_allocate_in_a_capture(backend):
    with Device(0):
        pool = MemoryPool(0, ipc=True)
        s = cuctx.Stream()
        with pytest.raises(cuctx.NotSupportedError, match="allocate before the capture"):
            with s.capture():
                cuctx.empty(8, np.float32, stream=s, pool=pool)


def test_autograph_calls_allocating_from_a_pool_give_eager_results(pool, lib):
    @cuctx.autograph
    def step(out, x):
        tmp = cuctx.empty(8, np.float32, pool=pool)
        lib["add"][1, 8](tmp, x, 1.0, 8)
        lib["add"][1, 8](out, tmp, 1.0, 8)

    x = cuctx.to_device(np.arange(8, dtype=np.float32))
    for i in range(3):
        out = cuctx.zeros(8, np.float32)
        step(out, x)
        assert out.to_host().tolist() == [float(i + 2) for i in range(8)]


# -- bad arguments ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, error, words",
    [
        (dict(max_size=0), ValueError, "max_size must be at least 1"),
        (dict(max_size=-5), ValueError, "max_size must be at least 1"),
        (dict(max_size=1.5), TypeError, "max_size must be a whole number"),
        (dict(max_size=True), TypeError, "max_size must be a whole number"),
        (dict(release_threshold=-1), ValueError, "release_threshold must be 0 or more"),
        (dict(release_threshold=1 << 64), ValueError, "below 2\\*\\*64"),
        (dict(ipc="yes"), TypeError, "ipc must be True or False"),
    ],
)
def test_bad_pool_settings_are_refused(backend, kwargs, error, words):
    with pytest.raises(error, match=words):
        MemoryPool(0, **kwargs)


def test_bad_uses_of_a_pool_are_refused(pool):
    with pytest.raises(TypeError, match="pool must be a cuctx.MemoryPool, not str"):
        cuctx.empty(4, pool="default")
    with pytest.raises(ValueError, match="release_threshold must be 0 or more"):
        pool.release_threshold = -1
    with pytest.raises(ValueError, match="keep must be 0 or more"):
        pool.trim(-1)
    with pytest.raises(cuctx.InvalidDeviceError):
        MemoryPool(99)
    assert pool.used == 0  # nothing was allocated by the refusals


def test_a_pool_allocates_only_on_its_device(backend):
    if len(cuctx.devices()) < 2:
        pytest.skip("needs two devices")
    with Device(0):
        pool = MemoryPool(0)
        with pytest.raises(
            ValueError, match="device=<Device 1 .* but <MemoryPool 0x[0-9a-f]+ of device 0"
        ):
            cuctx.empty(4, device=1, pool=pool)
        other = Device(1).create_stream()
        with pytest.raises(ValueError, match="allocate on a stream of the pool's device"):
            cuctx.empty(4, stream=other, pool=pool)
        assert cuctx.empty(4, device=0, pool=pool).device is Device(0)
