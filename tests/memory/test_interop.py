"""Zero-copy interop: DeviceArray as a CUDA Array Interface v3 and DLPack producer, and
cuctx.asarray over other libraries' device memory. On every backend with pure-Python
producers; against real PyTorch, CuPy, Numba and cuda.core on a GPU."""

import ctypes
import gc
import weakref

import numpy as np
import pytest
from conftest import busy
from scenarios import run_python

import cuctx
from cuctx import Device, DeviceArray, Stream
from cuctx.memory._interop import export


class CAIProducer:
    """A minimal CUDA Array Interface producer, as a third-party library would be."""

    def __init__(self, arr: DeviceArray, stream: int | None = None):
        self.arr = arr
        self.stream = stream

    @property
    def __cuda_array_interface__(self):
        cai = dict(self.arr.__cuda_array_interface__)
        cai["stream"] = self.stream
        return cai


class DLPackOnly:
    """A producer that speaks DLPack alone (as cuda.core buffers and JAX arrays do)."""

    def __init__(self, obj):
        self.obj = obj

    def __dlpack__(self, **kwargs):
        return self.obj.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.obj.__dlpack_device__()


# -- the producer side --------------------------------------------------------------------


def test_cuda_array_interface_describes_the_array(backend):
    arr = cuctx.zeros((4, 6), np.float32)
    cai = arr.__cuda_array_interface__
    assert cai["version"] == 3 and cai["shape"] == (4, 6) and cai["typestr"] == "<f4"
    assert cai["data"] == (arr.ptr, False) and cai["strides"] is None
    assert cai["stream"] == 1  # the legacy default stream, the current one outside `with`
    view = arr[:, 1::2]
    assert view.__cuda_array_interface__["strides"] == (24, 8)
    stream = Stream(Device(0))
    with stream:
        assert arr.__cuda_array_interface__["stream"] == stream.handle


def test_dlpack_device_is_cuda_and_the_ordinal(backend):
    assert cuctx.zeros(3).__dlpack_device__() == (2, 0)
    if len(cuctx.devices()) > 1:
        assert cuctx.zeros(3, device=1).__dlpack_device__() == (2, 1)


def test_dlpack_refuses_copies_and_stream_zero(backend):
    arr = cuctx.zeros(3)
    with pytest.raises(BufferError, match="without copying"):
        arr.__dlpack__(copy=True)
    with pytest.raises(BufferError, match="ambiguous"):
        arr.__dlpack__(stream=0)
    with pytest.raises(BufferError, match="not"):
        arr.__dlpack__(dl_device=(1, 0))


@pytest.mark.parametrize("max_version", [None, (1, 0), (1, 3)])
def test_dlpack_capsules_are_valid_dlpack(backend, max_version):
    """The capsule layout, checked by NumPy (which consumes DLPack for host memory): the
    same builder makes the CUDA capsules, with device (kDLCUDA, ordinal)."""
    host = np.arange(24, dtype=np.int16).reshape(4, 6)[:, ::2]

    class HostProducer:
        def __dlpack__(self, **kwargs):
            ptr = host.__array_interface__["data"][0]
            return export(host, ptr, host.shape, host.strides, host.dtype, (1, 0), max_version)

        def __dlpack_device__(self):
            return (1, 0)

    view = np.from_dlpack(HostProducer())
    assert np.shares_memory(view, host) and view.strides == host.strides
    np.testing.assert_array_equal(view, host)


# -- asarray: the consumer side -------------------------------------------------------------


def test_asarray_wraps_a_cai_producer_without_copying(backend):
    arr = cuctx.to_device(np.arange(10, dtype=np.float64))
    producer = CAIProducer(arr)
    wrapped = cuctx.asarray(producer)
    assert wrapped.ptr == arr.ptr and wrapped.shape == (10,) and wrapped.dtype == np.float64
    assert wrapped.device is arr.device
    wrapped[2:4].fill(-1)
    assert arr.to_host()[2:4].tolist() == [-1, -1]
    ref = weakref.ref(producer)
    del producer
    gc.collect()
    assert ref() is not None  # the wrapper keeps its producer alive
    assert cuctx.asarray(arr) is arr


def test_asarray_waits_for_the_producers_stream(backend):
    producer_stream = Stream(Device(0))
    pinned = cuctx.pinned_empty(1 << 12)
    pinned[:] = 7
    arr = cuctx.empty(1 << 12, stream=producer_stream)
    busy(producer_stream, 20)
    cuctx.copy(arr, pinned, stream=producer_stream)  # still queued
    wrapped = cuctx.asarray(CAIProducer(arr, stream=producer_stream.handle))
    # The current stream now waits for the producer's, so this copy sees the data.
    assert wrapped.to_host().sum() == 7 << 12


def test_asarray_over_dlpack_keeps_the_exporter_alive(backend):
    arr = cuctx.to_device(np.arange(12, dtype=np.int32).reshape(3, 4))
    view = arr[1:]
    ref = weakref.ref(view)
    wrapped = cuctx.asarray(DLPackOnly(view))
    assert wrapped.ptr == arr.ptr + 16 and wrapped.shape == (2, 4) and wrapped.strides == (16, 4)
    del arr, view
    gc.collect()
    assert ref() is not None  # the capsule's tensor holds it
    np.testing.assert_array_equal(wrapped.to_host(), np.arange(4, 12).reshape(2, 4))
    del wrapped
    gc.collect()
    assert ref() is None  # the deleter ran when the consumer let go


def test_asarray_refuses_host_and_unknown_objects(backend):
    with pytest.raises(TypeError, match="to_device"):
        cuctx.asarray(np.zeros(3))
    with pytest.raises(TypeError, match="to_device"):
        cuctx.asarray(DLPackOnly(np.zeros(3)))
    with pytest.raises(TypeError, match="neither"):
        cuctx.asarray([1, 2, 3])
    with pytest.raises(TypeError, match="bool, integer, float or complex"):

        class Odd:
            __cuda_array_interface__ = {
                "version": 3,
                "shape": (2,),
                "typestr": "|O",
                "data": (0, False),
            }

        cuctx.asarray(Odd())


def test_raw_elements_are_viewed_as_the_unsigned_integers_of_their_size(backend):
    """A void typestr (PyTorch's bfloat16 is '<V2', float8 '|V1') has no NumPy float: the
    array is viewed as its bits; a size no unsigned integer has stays refused."""
    arr = cuctx.to_device(np.arange(12, dtype=np.uint16).reshape(3, 4))

    class Producer:
        def __init__(self, typestr):
            self.__cuda_array_interface__ = {**good_cai(arr), "typestr": typestr}

    view = cuctx.asarray(Producer("<V2"))
    assert (view.dtype, view.shape, view.ptr) == (np.uint16, (3, 4), arr.ptr)
    assert view.to_host().tolist() == arr.to_host().tolist()
    assert cuctx.asarray(Producer("|V1")).dtype == np.uint8
    with pytest.raises(TypeError, match=r"not \|V3"):
        cuctx.asarray(Producer("|V3"))


# -- real libraries on a GPU ----------------------------------------------------------------


@pytest.mark.gpu
def test_torch_round_trip(gpu):
    torch = pytest.importorskip("torch")
    tensor = torch.arange(12, dtype=torch.float32, device="cuda").reshape(3, 4)
    wrapped = cuctx.asarray(tensor)
    assert wrapped.ptr == tensor.data_ptr() and wrapped.shape == (3, 4)
    wrapped.fill(2)
    torch.cuda.synchronize()
    assert tensor.sum().item() == 24
    arr = cuctx.to_device(np.arange(6, dtype=np.int64))
    back = torch.from_dlpack(arr)
    assert back.data_ptr() == arr.ptr and back.device == torch.device("cuda", 0)
    assert back.tolist() == list(range(6))
    via_cai = torch.as_tensor(arr, device="cuda")
    assert via_cai.data_ptr() == arr.ptr


@pytest.mark.gpu
def test_cupy_round_trip(gpu):
    """In a process of its own: CuPy keeps the kernels it loaded in module globals until the
    interpreter exits, in the primary context it shares with cuctx, and later tests reset
    that context; CuPy's finalizers would then unload into a destroyed context during
    interpreter teardown ("Error in sys.excepthook")."""
    pytest.importorskip("cupy")
    script = """
import numpy as np, cupy, cuctx
cp_arr = cupy.arange(10, dtype=cupy.float64)
wrapped = cuctx.asarray(cp_arr)
assert wrapped.ptr == cp_arr.data.ptr
np.testing.assert_array_equal(wrapped.to_host(), np.arange(10.0))
arr = cuctx.to_device(np.arange(8, dtype=np.int32))
for view in (cupy.asarray(arr), cupy.from_dlpack(arr)):
    assert view.data.ptr == arr.ptr and view.tolist() == list(range(8))
print("round trip ok")
"""
    run = run_python("-c", script, CUCTX_BACKEND="cuda")
    assert run.returncode == 0 and "round trip ok" in run.stdout, run.stderr[-3000:]
    assert "Error in sys.excepthook" not in run.stderr and "Traceback" not in run.stderr, (
        run.stderr[-3000:]
    )


@pytest.mark.gpu
def test_numba_device_array(gpu):
    numba_cuda = pytest.importorskip("numba.cuda")
    d = numba_cuda.to_device(np.arange(5, dtype=np.float32))
    wrapped = cuctx.asarray(d)
    assert wrapped.ptr == d.device_ctypes_pointer.value
    np.testing.assert_array_equal(wrapped.to_host(), np.arange(5, dtype=np.float32))


@pytest.mark.gpu
def test_cuda_core_buffer(gpu):
    core = pytest.importorskip("cuda.core")
    device = core.Device(0)
    device.set_current()
    buffer = device.allocate(64, stream=device.default_stream)  # cuda.core >= 1.0 asks for one
    if not hasattr(buffer, "__dlpack__"):
        pytest.skip(f"cuda.core {core.__version__} buffers do not export DLPack")
    wrapped = cuctx.asarray(buffer)
    assert wrapped.ptr == int(buffer.handle) and wrapped.nbytes == 64


# -- DLPack: versions, rejection by the consumer, read-only tensors ---------------------------


def capsule_name(capsule) -> str:
    return repr(capsule).split('"')[1]


def test_dlpack_capsule_version_follows_max_version(backend):
    arr = cuctx.zeros(3)
    assert capsule_name(arr.__dlpack__()) == "dltensor"
    assert capsule_name(arr.__dlpack__(max_version=(0, 8))) == "dltensor"
    assert capsule_name(arr.__dlpack__(max_version=(1, 0))) == "dltensor_versioned"
    assert (
        capsule_name(arr.__dlpack__(max_version=(1, 5), dl_device=(2, 0), copy=False))
        == "dltensor_versioned"
    )
    with pytest.raises(TypeError, match="max_version"):
        arr.__dlpack__(max_version=1)


@pytest.mark.device_memory
def test_a_consumer_that_rejects_the_export_raises_its_own_error_and_nothing_leaks(backend):
    """np.from_dlpack cannot take device memory: its own error reaches the caller (not a
    SystemError), and the capsule it drops frees the array."""
    device = Device(0)
    device.primary_context.synchronize()
    before = device.mem_info().free
    for _ in range(20):
        arr = cuctx.empty(64 << 20, np.uint8)
        refs = weakref.ref(arr), weakref.ref(arr._alloc)
        with pytest.raises((BufferError, RuntimeError), match="device|Device") as info:
            np.from_dlpack(arr)
        assert not isinstance(info.value, SystemError)
        del arr, info
        assert [ref() for ref in refs] == [None, None]  # freed at once: nothing holds it
    device.primary_context.synchronize()  # the frees run; the pool gives the memory back
    # 20 held arrays would be 1280 MiB; the driver's pool may keep the last block it freed
    # (seen on an H100: exactly one), so allow one array's worth.
    assert device.mem_info().free >= before - (64 << 20)


def test_dlpack_capsules_dropped_unconsumed_free_the_array(backend):
    arr = cuctx.zeros(10)
    ref = weakref.ref(arr)
    for version in (None, (1, 0)):
        arr.__dlpack__(max_version=version)  # dropped at once
    del arr
    assert ref() is None


@pytest.mark.parametrize("max_version", [None, (1, 0)])
def test_asarray_reads_legacy_and_versioned_capsules(backend, max_version):
    arr = cuctx.to_device(np.arange(6, dtype=np.float32).reshape(2, 3))

    class Producer:
        def __dlpack__(self, stream=None, max_version=None):
            return arr.__dlpack__(stream=stream, max_version=chosen)

        def __dlpack_device__(self):
            return arr.__dlpack_device__()

    chosen = max_version
    wrapped = cuctx.asarray(Producer())
    assert wrapped.ptr == arr.ptr and wrapped.shape == (2, 3)
    np.testing.assert_array_equal(wrapped.T.to_host(), np.arange(6).reshape(2, 3).T)


def test_asarray_refuses_a_read_only_versioned_tensor(backend):
    arr = cuctx.zeros(4)
    ref = weakref.ref(arr)

    class ReadOnly:
        def __dlpack__(self, stream=None, max_version=None):
            capsule = arr.__dlpack__(stream=stream, max_version=(1, 0))
            ctypes_api = ctypes.pythonapi
            ctypes_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
            ctypes_api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
            address = ctypes_api.PyCapsule_GetPointer(capsule, b"dltensor_versioned")
            ctypes.c_uint64.from_address(address + 24).value |= 1  # DLPACK_FLAG_BITMASK_READ_ONLY
            return capsule

        def __dlpack_device__(self):
            return arr.__dlpack_device__()

    with pytest.raises(BufferError, match="read-only"):
        cuctx.asarray(ReadOnly())
    arr = None  # (the class above reads `arr`: rebind rather than del)
    gc.collect()
    assert ref() is None  # the refused capsule was freed by its producer


# -- a malformed CUDA Array Interface is a TypeError naming the field --------------------------


def good_cai(arr):
    return {
        "version": 3,
        "shape": arr.shape,
        "typestr": arr.dtype.str,
        "data": (arr.ptr, False),
        "strides": None,
    }


@pytest.mark.parametrize(
    "key, value, match",
    [
        ("shape", None, "'shape'"),
        ("shape", (2, "a"), "'shape'"),
        ("shape", 4, "'shape'"),
        ("typestr", None, "'typestr'"),
        ("typestr", "<q9", "'typestr'"),
        ("typestr", 4, "'typestr'"),
        ("data", None, "'data'"),
        ("data", (1,), "'data'"),
        ("data", ("0x10", False), "'data'"),
        ("version", None, "'version'"),
        ("version", "3", "'version'"),
        ("version", 7, "'version'"),
        ("strides", (8, 8), "'strides'"),
        ("strides", ("8",), "'strides'"),
        ("stream", "s", "'stream'"),
        ("stream", 0, "'stream'"),
    ],
    ids=repr,
)
def test_malformed_cuda_array_interface_names_the_key(backend, key, value, match):
    arr = cuctx.zeros(4)
    cai = good_cai(arr)
    if value is None:
        del cai[key]
    else:
        cai[key] = value

    class Producer:
        __cuda_array_interface__ = cai

    with pytest.raises(TypeError, match=match):
        cuctx.asarray(Producer())


def test_cuda_array_interface_refusals(backend):
    arr = cuctx.zeros(4)

    class Producer:
        def __init__(self, **changes):
            self.__cuda_array_interface__ = {**good_cai(arr), **changes}

    with pytest.raises(TypeError, match="must be a dict"):
        cuctx.asarray(type("P", (), {"__cuda_array_interface__": [1]})())
    with pytest.raises(ValueError, match="read-only"):
        cuctx.asarray(Producer(data=(arr.ptr, True)))
    with pytest.raises(ValueError, match="mask"):
        cuctx.asarray(Producer(mask=object()))
    wrapped = cuctx.asarray(Producer(version=2, strides=[8], shape=[4]))
    assert wrapped.shape == (4,) and wrapped.strides == (8,)
