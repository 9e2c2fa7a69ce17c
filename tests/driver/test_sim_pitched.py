"""cuMemcpy2D(Async) and cuMemcpy3D(Async) through the raw driver, with cuda.bindings' own
CUDA_MEMCPY2D / CUDA_MEMCPY3D. Every test that runs on both backends checks the sim's answer
against the real driver's on the GPU; results are checked against a NumPy model."""

import gc

import numpy as np
import pytest
from cuda.bindings import driver
from cuda.bindings.driver import CUmemorytype, CUresult

import cuctx
from cuctx import Device, Stream

OK = CUresult.CUDA_SUCCESS
INVALID_VALUE = CUresult.CUDA_ERROR_INVALID_VALUE
HOST, DEVICE = CUmemorytype.CU_MEMORYTYPE_HOST, CUmemorytype.CU_MEMORYTYPE_DEVICE
UNIFIED, ARRAY = CUmemorytype.CU_MEMORYTYPE_UNIFIED, CUmemorytype.CU_MEMORYTYPE_ARRAY


def address(host: np.ndarray) -> int:
    return host.__array_interface__["data"][0]


def params(kind, **fields):
    p = kind()
    for name, value in fields.items():
        setattr(p, name, value)
    return p


def host_side(prefix: str, host: np.ndarray, pitch: int, **more) -> dict:
    return {
        f"{prefix}MemoryType": HOST,
        f"{prefix}Host": address(host),
        f"{prefix}Pitch": pitch,
        **{prefix + k: v for k, v in more.items()},
    }


def device_side(prefix: str, ptr, pitch: int, kind=DEVICE, **more) -> dict:
    return {
        f"{prefix}MemoryType": kind,
        f"{prefix}Device": ptr,
        f"{prefix}Pitch": pitch,
        **{prefix + k: v for k, v in more.items()},
    }


@pytest.fixture
def drv(backend):
    """The raw driver, with device 0's primary context current."""
    with Device(0):
        yield backend.driver


def alloc(drv, nbytes):
    err, ptr = drv.cuMemAlloc(nbytes)
    assert not err
    return ptr


# -- 2D ---------------------------------------------------------------------------------------


def test_2d_copies_rows_between_pitched_host_and_device_memory(drv):
    rows, width = 5, 12
    host = np.arange(rows * 20, dtype=np.uint8).reshape(rows, 20)  # rows 20 bytes apart
    ptr = alloc(drv, 32 * (rows + 1))  # device rows 32 bytes apart, one row of margin
    up = params(
        driver.CUDA_MEMCPY2D,
        **host_side("src", host, 20, XInBytes=3),
        **device_side("dst", ptr, 32, Y=1),
        WidthInBytes=width,
        Height=rows,
    )
    assert drv.cuMemcpy2D(up) == (OK,)
    back = np.zeros((rows + 1, 32), np.uint8)
    down = params(
        driver.CUDA_MEMCPY2D,
        **device_side("src", ptr, 32),
        **host_side("dst", back, 32),
        WidthInBytes=32,
        Height=rows + 1,
    )
    assert drv.cuMemcpy2D(down) == (OK,)
    np.testing.assert_array_equal(back[1:, :width], host[:, 3 : 3 + width])
    assert drv.cuMemFree(ptr) == (OK,)


def test_2d_device_to_device_and_unified_addresses(drv):
    host = np.arange(64, dtype=np.uint8).reshape(8, 8)
    a, b = alloc(drv, 64), alloc(drv, 64)
    assert drv.cuMemcpyHtoD(a, address(host), 64) == (OK,)
    assert drv.cuMemsetD8Async(b, 0, 64, 0) == (OK,)
    # Unified: the address tells host from device memory.
    block = params(
        driver.CUDA_MEMCPY2D,
        **device_side("src", a, 8, UNIFIED, XInBytes=2, Y=1),
        **device_side("dst", b, 16, DEVICE, XInBytes=4),
        WidthInBytes=4,
        Height=3,
    )
    assert drv.cuMemcpy2DAsync(block, 0) == (OK,)
    out = np.zeros((4, 16), np.uint8)
    down = params(
        driver.CUDA_MEMCPY2D,
        **device_side("src", b, 16),
        **device_side("dst", address(out), 16, UNIFIED),
        WidthInBytes=16,
        Height=4,
    )
    assert drv.cuMemcpy2DAsync(down, 0) == (OK,)
    assert drv.cuCtxSynchronize() == (OK,)
    expected = np.zeros((4, 16), np.uint8)
    expected[:3, 4:8] = host[1:4, 2:6]
    np.testing.assert_array_equal(out, expected)
    for ptr in (a, b):
        assert drv.cuMemFree(ptr) == (OK,)


def test_2d_copies_run_in_stream_order(drv):
    stream = Stream(Device(0))
    ptr = alloc(drv, 4 * 64)
    assert drv.cuMemsetD32Async(ptr, 7, 64, stream._handle) == (OK,)
    out = np.zeros((4, 4), np.uint32)
    down = params(
        driver.CUDA_MEMCPY2D,
        **device_side("src", ptr, 64),
        **host_side("dst", out, 16),
        WidthInBytes=16,
        Height=4,
    )
    # Pageable host memory: the copy has completed when the call returns.
    assert drv.cuMemcpy2DAsync(down, stream._handle) == (OK,)
    assert (out == 7).all()
    assert drv.cuMemFree(ptr) == (OK,)


def test_2d_copies_are_checked_when_called(drv):
    ptr = alloc(drv, 64)
    host = np.zeros(64, np.uint8)
    good = dict(**host_side("src", host, 16), **device_side("dst", ptr, 16), Height=2)
    cases = {
        "pitch below the width": dict(good, srcPitch=8, WidthInBytes=16),
        "pitch below X + width": dict(good, dstXInBytes=4, WidthInBytes=16),
        "no source memory type": {k: v for k, v in good.items() if k != "srcMemoryType"},
        # A small overrun of a cuMemAlloc buffer: refused up front, as the 1D copies are.
        "past the device allocation": dict(good, dstY=3, WidthInBytes=8),
    }
    for what, fields in cases.items():
        fields.setdefault("WidthInBytes", 8)
        result = drv.cuMemcpy2DAsync(params(driver.CUDA_MEMCPY2D, **fields), 0)
        assert result == (INVALID_VALUE,), what
    with pytest.raises(TypeError, match="CUDA_MEMCPY2D"):
        drv.cuMemcpy2DAsync(params(driver.CUDA_MEMCPY3D), 0)
    empty = params(driver.CUDA_MEMCPY2D, **good, WidthInBytes=0)
    assert drv.cuMemcpy2DAsync(empty, 0) == (OK,)
    assert drv.cuCtxSynchronize() == (OK,)  # nothing was poisoned
    assert drv.cuMemFree(ptr) == (OK,)


# -- 3D ---------------------------------------------------------------------------------------


def test_3d_copies_slices_with_row_and_slice_padding(drv):
    depth, rows, width = 3, 4, 6
    host = np.arange(depth * 5 * 8, dtype=np.uint8).reshape(depth, 5, 8)  # pitch 8, height 5
    ptr = alloc(drv, 16 * 6 * (depth + 1))  # device pitch 16, height 6, one spare slice
    assert drv.cuMemsetD8Async(ptr, 0, 16 * 6 * (depth + 1), 0) == (OK,)
    up = params(
        driver.CUDA_MEMCPY3D,
        **host_side("src", host, 8, Height=5, XInBytes=1, Y=1),
        **device_side("dst", ptr, 16, Height=6, Z=1, Y=2),
        WidthInBytes=width,
        Height=rows,
        Depth=depth,
    )
    assert drv.cuMemcpy3DAsync(up, 0) == (OK,)
    out = np.zeros((depth + 1, 6, 16), np.uint8)
    down = params(
        driver.CUDA_MEMCPY3D,
        **device_side("src", ptr, 16, Height=6),
        **host_side("dst", out, 16, Height=6),
        WidthInBytes=16,
        Height=6,
        Depth=depth + 1,
    )
    assert drv.cuMemcpy3D(down) == (OK,)
    expected = np.zeros_like(out)
    expected[1:, 2 : 2 + rows, :width] = host[:, 1 : 1 + rows, 1 : 1 + width]
    np.testing.assert_array_equal(out, expected)
    assert drv.cuMemFree(ptr) == (OK,)


def test_3d_copies_are_checked_when_called(drv):
    ptr = alloc(drv, 256)
    host = np.zeros(256, np.uint8)
    good = dict(
        **host_side("src", host, 16, Height=4),
        **device_side("dst", ptr, 16, Height=4),
        WidthInBytes=8,
        Height=4,
        Depth=2,
    )
    assert drv.cuMemcpy3DAsync(params(driver.CUDA_MEMCPY3D, **good), 0) == (OK,)
    # a level of detail is for CUDA arrays only: ignored for host and device memory
    assert drv.cuMemcpy3DAsync(params(driver.CUDA_MEMCPY3D, **dict(good, srcLOD=1)), 0) == (OK,)
    cases = {
        "slice height below Y + Height": dict(good, dstY=1),
        "pitch below the width": dict(good, srcPitch=4),
    }
    for what, fields in cases.items():
        result = drv.cuMemcpy3DAsync(params(driver.CUDA_MEMCPY3D, **fields), 0)
        assert result == (INVALID_VALUE,), what
    with pytest.raises(TypeError, match="CUDA_MEMCPY3D"):
        drv.cuMemcpy3DAsync(params(driver.CUDA_MEMCPY2D), 0)
    assert drv.cuCtxSynchronize() == (OK,)
    assert drv.cuMemFree(ptr) == (OK,)


# -- what only the sim shows ----------------------------------------------------------------


def test_pinned_2d_copies_are_asynchronous_on_the_sim(sim):
    drv = sim.driver
    with Device(0):
        stream = Stream(Device(0))
        ptr = alloc(drv, 64)
        assert drv.cuMemsetD8Async(ptr, 9, 64, stream._handle) == (OK,)
        out = cuctx.pinned_empty((4, 16), np.uint8)
        out[...] = 0
        down = params(
            driver.CUDA_MEMCPY2D,
            **device_side("src", ptr, 16),
            **host_side("dst", out, 16),
            WidthInBytes=16,
            Height=4,
        )
        assert drv.cuMemcpy2DAsync(down, stream._handle) == (OK,)
        assert (out == 0).all()  # queued, not run
        assert drv.cuStreamSynchronize(stream._handle) == (OK,)
        assert (out == 9).all()
        assert drv.cuMemFree(ptr) == (OK,)


def test_a_2d_copy_of_memory_freed_before_it_runs_faults_on_the_sim(sim):
    drv = sim.driver
    with Device(0):
        stream = Stream(Device(0))
        s = stream._handle
        err, ptr = drv.cuMemAllocAsync(64, s)
        assert not err
        out = cuctx.pinned_empty(64, np.uint8)
        late = Stream(Device(0))
        down = params(
            driver.CUDA_MEMCPY2D,
            **device_side("src", ptr, 16),
            **host_side("dst", out, 16),
            WidthInBytes=16,
            Height=4,
        )
        assert drv.cuMemcpy2DAsync(down, late._handle) == (OK,)
        assert drv.cuMemFreeAsync(ptr, s) == (OK,)
        assert drv.cuStreamSynchronize(s) == (OK,)  # the free runs first
        assert drv.cuStreamSynchronize(late._handle) == (CUresult.CUDA_ERROR_ILLEGAL_ADDRESS,)
        del out
        gc.collect()


def test_arrays_null_params_and_bad_host_addresses_are_refused_by_the_sim(sim):
    drv = sim.driver
    with Device(0):
        ptr = alloc(drv, 64)
        host = np.zeros(64, np.uint8)
        good = dict(
            **host_side("src", host, 16), **device_side("dst", ptr, 16), WidthInBytes=16, Height=4
        )
        arrays = params(driver.CUDA_MEMCPY2D, **dict(good, srcMemoryType=ARRAY))
        assert drv.cuMemcpy2DAsync(arrays, 0) == (CUresult.CUDA_ERROR_NOT_SUPPORTED,)
        assert drv.cuMemcpy2DAsync(None, 0) == (INVALID_VALUE,)
        assert drv.cuMemcpy3D(None) == (INVALID_VALUE,)
        for bad in (0, 0x10, int(ptr)):  # null, unmapped, device memory named as host memory
            p = params(driver.CUDA_MEMCPY2D, **dict(good, srcHost=bad))
            assert drv.cuMemcpy2DAsync(p, 0) == (INVALID_VALUE,)
        # A device address that is neither device memory nor page-locked host memory:
        p = params(
            driver.CUDA_MEMCPY2D, **dict(good, srcMemoryType=DEVICE, srcDevice=address(host))
        )
        assert drv.cuMemcpy2DAsync(p, 0) == (INVALID_VALUE,)
        pinned = cuctx.pinned_empty(64, np.uint8)
        pinned[...] = 5
        p = params(
            driver.CUDA_MEMCPY2D, **dict(good, srcMemoryType=DEVICE, srcDevice=address(pinned))
        )
        assert drv.cuMemcpy2D(p) == (OK,)  # page-locked memory has a device address
        out = np.zeros(64, np.uint8)
        assert drv.cuMemcpyDtoH(address(out), ptr, 64) == (OK,)
        assert (out == 5).all()
        assert drv.cuCtxSynchronize() == (OK,)
        assert drv.cuMemFree(ptr) == (OK,)
