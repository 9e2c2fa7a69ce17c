"""Launching: the configuration checks (each violation names its limit and value), argument
packing against the real parameter layout, streams, and the launch forms. Sim and GPU."""

from __future__ import annotations

import ctypes
import threading

import numpy as np
import pytest

import cuctx
from cuctx import KernelArgumentError, LaunchConfigError

from scenarios import ADD_SOURCE, add, add_arrays, library_fixture

SOURCE = (
    ADD_SOURCE
    + r"""
struct Pair { int a; float b; };

extern "C" __global__ void store(unsigned int* out, unsigned int u, long long q, Pair p) {
    out[0] = u; out[1] = (unsigned int)q; out[2] = (unsigned int)p.a; out[3] = (unsigned int)p.b;
}

extern "C" __global__ void __launch_bounds__(256) bounded(float* out) {
    out[threadIdx.x] = 1.0f;
}

extern "C" __global__ void dynamic(float* out, int n) {
    extern __shared__ float scratch[];
    int i = threadIdx.x;
    if (i < n) { scratch[i] = i; out[i] = scratch[i]; }
}
"""
)


class Pair(ctypes.Structure):
    _fields_ = [("a", ctypes.c_int), ("b", ctypes.c_float)]


def store(grid, block, out, u, q: int, p: bytes):
    a, b = int(np.frombuffer(p, np.int32, 1)[0]), float(np.frombuffer(p, np.float32, 1, 4)[0])
    out.view(np.uint32, 4)[:] = [u & 0xFFFFFFFF, q & 0xFFFFFFFF, a & 0xFFFFFFFF, int(b)]


def bounded(grid, block, out):
    out.view(np.float32, block[0])[:] = 1.0


def dynamic(grid, block, out, n):
    out.view(np.float32, n)[:] = np.arange(n, dtype=np.float32)


pytestmark = [pytest.mark.usefixtures("nvrtc_cache"), pytest.mark.paths()]

lib = library_fixture(SOURCE, add=add, store=store, bounded=bounded, dynamic=dynamic)


# -- the forms of a launch ----------------------------------------------------------------


def test_launch_forms_agree(lib):
    out, x = add_arrays()
    lib["add"][1, 8](out, x, 1.0, 8)
    assert out.to_host().tolist() == list(range(1, 9))
    cuctx.launch(lib["add"], (1, 1), (8, 1, 1), out, x, 2.0, 8)
    assert out.to_host().tolist() == list(range(2, 10))
    stream = cuctx.Stream()
    launcher = lib["add"][1, 8, 0, stream]  # <<<Dg, Db, Ns, S>>>
    assert isinstance(launcher, cuctx.Launcher) and launcher.stream is stream
    launcher(out, x, 3.0, 8)
    stream.synchronize()
    assert out.to_host().tolist() == list(range(3, 11))


def test_default_stream_is_the_current_stream(lib):
    out, x = add_arrays()
    stream = cuctx.Stream()
    with stream:
        launcher = lib["add"][1, 8]
    assert launcher.stream is stream


def test_bad_subscript_says_how(lib):
    with pytest.raises(TypeError, match=r"kernel\[grid, block\]"):
        lib["add"][8]


# -- configuration violations -------------------------------------------------------------


@pytest.mark.parametrize(
    "grid, block, message",
    [
        (1, 2048, r"block.x = 2048 exceeds the device's limit of 1024"),
        (1, (1, 1, 65), r"block.z = 65 exceeds the device's limit of 64"),
        (1, (32, 32, 2), r"is 2048 threads; the device runs at most 1024 threads per block"),
        ((1, 65536), 32, r"grid.y = 65536 exceeds the device's limit of 65535"),
        (0, 32, r"grid.x is 0; every dimension must be at least 1"),
        ((1, 2, 3, 4), 32, r"grid must be an int or a tuple of 1 to 3 ints"),
        (1, 32.0, r"block must be an int or a tuple"),
    ],
)
def test_config_violations_name_limit_and_value(lib, grid, block, message):
    out, x = add_arrays()
    with pytest.raises(LaunchConfigError, match=message):
        lib["add"][grid, block](out, x, 1.0, 8)


def test_kernel_thread_limit_from_launch_bounds(lib):
    out, _ = add_arrays(512)
    with pytest.raises(
        LaunchConfigError,
        match=r"'bounded' can run at most 256 threads per "
        r"block.*has 512",
    ):
        lib["bounded"][1, 512](out)
    lib["bounded"][1, 256](out)


def test_dynamic_shared_memory_above_48k_sets_the_attribute(lib):
    out, _ = add_arrays(64)
    kernel = lib["dynamic"]
    assert kernel.attributes(0).max_dynamic_shared_size_bytes == 48 * 1024
    kernel[1, 64, 100 * 1024](out, 64)
    assert kernel.attributes(0).max_dynamic_shared_size_bytes == 100 * 1024
    cuctx.current_context().synchronize()
    assert out.to_host().tolist() == list(range(64))


def test_dynamic_shared_memory_beyond_the_device_names_the_opt_in_limit(lib):
    out, _ = add_arrays()
    with pytest.raises(LaunchConfigError, match=r"shared_mem = 300000 bytes exceeds.*232448"):
        lib["dynamic"][1, 32, 300000](out, 8)
    with pytest.raises(LaunchConfigError, match="shared_mem must be a number of bytes"):
        lib["dynamic"][1, 32, -1](out, 8)


def test_cluster_shape_checks(lib):
    out, x = add_arrays()
    with pytest.raises(LaunchConfigError, match=r"grid.x = 3 is not a multiple of cluster.x = 2"):
        cuctx.launch(lib["add"], 3, 8, out, x, 1.0, 8, cluster=2)
    with pytest.raises(LaunchConfigError, match=r"is 16 blocks; the portable limit is 8"):
        cuctx.launch(lib["add"], 16, 8, out, x, 1.0, 8, cluster=16)
    cuctx.launch(lib["add"], 2, 8, out, x, 1.0, 8, cluster=2)
    cuctx.current_context().synchronize()
    assert out.to_host().tolist() == list(range(1, 9))


def test_cooperative_grid_must_fit_at_once(lib):
    out, x = add_arrays()
    kernel = lib["add"]
    most = kernel.occupancy(1024) * cuctx.Device(0).properties.multiprocessor_count
    with pytest.raises(LaunchConfigError, match=rf"is {most + 1} blocks.*at most {most} blocks"):
        cuctx.launch(kernel, most + 1, 1024, out, x, 1.0, 8, cooperative=True)
    cuctx.launch(kernel, 4, 32, out, x, 1.0, 8, cooperative=True)
    cuctx.current_context().synchronize()
    assert out.to_host().tolist() == list(range(1, 9))


# -- arguments ----------------------------------------------------------------------------


def test_wrong_argument_count_names_the_kernel_and_sizes(lib):
    out, x = add_arrays()
    with pytest.raises(
        KernelArgumentError,
        match=r"'add' takes 4 argument\(s\) \(parameter "
        r"sizes \[8, 8, 4, 4\] bytes\), got 3",
    ):
        lib["add"][1, 8](out, x, 1.0)


@pytest.mark.parametrize(
    "value, message",
    [
        (1 + 2j, r"parameter 2 .*\.f32: a floating-point number.*cannot take complex"),
        (True, r"parameter 2 .*a bool is not converted to a floating-point parameter"),
        ("1.0", r"parameter 2 .*cannot take str"),
        (np.zeros(2, np.float32), r"parameter 2 .*NumPy array, which is host memory"),
    ],
)
def test_wrong_argument_type_or_size_names_the_parameter(lib, value, message):
    out, x = add_arrays()
    with pytest.raises(KernelArgumentError, match=message):
        lib["add"][1, 8](out, x, value, 8)


def test_pointer_into_a_small_parameter_is_refused(lib):
    out, x = add_arrays()
    with pytest.raises(KernelArgumentError, match=r"parameter 3 .*not pointer-sized"):
        lib["add"][1, 8](out, x, 1.0, x)


def test_int_out_of_range_is_refused_and_unsigned_values_fit(lib):
    out = cuctx.zeros(4, np.uint32)
    with pytest.raises(KernelArgumentError, match=r"parameter 1 .*cannot hold 4294967296"):
        lib["store"][1, 1](out, 1 << 32, 0, Pair(0, 0.0))
    lib["store"][1, 1](out, 0xFFFFFFFF, -1, Pair(-2, 7.0))
    assert out.to_host().tolist() == [0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFE, 7]


def test_structs_by_value_ctypes_and_numpy(lib):
    out = cuctx.zeros(4, np.uint32)
    pair = np.array((5, 3.0), dtype=[("a", "<i4"), ("b", "<f4")])[()]
    lib["store"][1, 1](out, np.uint32(9), np.int64(4), pair)
    assert out.to_host().tolist() == [9, 4, 5, 3]
    with pytest.raises(KernelArgumentError, match=r"parameter 3 .*got a ctypes c_int of 4 bytes"):
        lib["store"][1, 1](out, 1, 2, ctypes.c_int(1))


def test_raw_int_pointers_and_foreign_arrays(lib):
    out, x = add_arrays()
    lib["add"][1, 8](out.ptr, x, 1.0, 8)  # a raw address where a pointer goes

    class Foreign:  # another library's array, through the CUDA Array Interface
        __cuda_array_interface__ = x.__cuda_array_interface__

    lib["add"][1, 8](out, Foreign(), 5.0, 8)
    assert out.to_host().tolist() == list(range(5, 13))


def test_array_of_a_destroyed_context_is_refused(lib):
    ctx = cuctx.Context.create(0)
    stale = cuctx.zeros(8, np.float32)
    ctx.destroy()
    out, _ = add_arrays()
    with pytest.raises(cuctx.ContextDestroyedError):
        lib["add"][1, 8](out, stale, 1.0, 8)


def test_packer_is_built_once_per_kernel(lib):
    out, x = add_arrays()
    kernel = lib["add"]
    kernel[1, 8](out, x, 1.0, 8)
    kernel[2, 8](out, x, 2.0, 8)
    packer = kernel._packer()
    assert kernel[1, 8]._packer is packer and len(packer.plans) == 1
    kernel[1, 8](out, x, 2, 8)  # an int for the float: another plan, same packer
    assert len(packer.plans) == 2


def test_launches_from_many_threads_keep_their_arguments(lib):
    n, results = 64, {}
    stream_of = {}

    def work(k):
        with cuctx.Device(0):
            stream_of[k] = cuctx.Stream()
            out, x = add_arrays(n)
            launcher = lib["add"][1, n, 0, stream_of[k]]
            for _ in range(50):
                launcher(out, x, float(k), n)
            stream_of[k].synchronize()
            results[k] = out.to_host()

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for k in range(4):
        assert results[k].tolist() == (np.arange(n) + k).tolist()


def test_launch_in_destroyed_context_is_refused(lib):
    ctx = cuctx.Context.create(0)
    stream = cuctx.Stream()
    out, x = add_arrays()
    launcher = lib["add"][1, 8, 0, stream]
    ctx.destroy()
    with pytest.raises(cuctx.ContextDestroyedError):
        launcher(out, x, 1.0, 8)


def test_a_launcher_stays_checked_after_its_fast_path_exists(lib):
    """The first launch generates a fast path for its thread and argument types; every
    other case must still take the checked path and behave exactly as before."""
    out, x = add_arrays()
    launcher = lib["add"][1, 8]
    launcher(out, x, 1.0, 8)  # generates the fast path
    launcher(out, x, 2.0, 8)  # takes it
    assert out.to_host().tolist() == list(range(2, 10))
    launcher(out, x, np.float32(3.0), np.int32(8))  # other types: still correct
    assert out.to_host().tolist() == list(range(3, 11))
    with pytest.raises(KernelArgumentError, match="takes 4 argument"):
        launcher(out, x, 1.0)
    with pytest.raises(KernelArgumentError, match="parameter 3"):
        launcher(out, x, 1.0, 2**40)
    seen = []
    thread = threading.Thread(target=lambda: (launcher(out, x, 4.0, 8), seen.append(True)))
    thread.start()
    thread.join()
    cuctx.current_stream().synchronize()
    assert seen and out.to_host().tolist() == list(range(4, 12))
    launcher(out, x, 5.0, 8)  # back on the fast path after all that
    assert out.to_host().tolist() == list(range(5, 13))


def test_a_fast_path_refuses_a_destroyed_context(backend):
    library = cuctx.Library.from_source(SOURCE, sim_kernels={"add": add})
    ctx = cuctx.Context.create(0)
    try:
        out, x = add_arrays()
        launcher = library["add"][1, 8]
        launcher(out, x, 1.0, 8)
        launcher(out, x, 1.0, 8)
    finally:
        cuctx.Context.pop()
    ctx.destroy()
    with pytest.raises(cuctx.ContextDestroyedError):
        launcher(out, x, 1.0, 8)
    library.unload()


def test_a_foreign_array_argument_orders_the_launch_stream_after_its_producer(lib):
    producer, stream = cuctx.Stream(), cuctx.Stream()
    out, x = add_arrays()
    from conftest import busy

    busy(producer, 20)
    x.fill(5, stream=producer)

    class Foreign:  # another library's array, last written on `producer`
        __cuda_array_interface__ = {
            "version": 3,
            "shape": (8,),
            "typestr": "<f4",
            "data": (x.ptr, False),
            "strides": None,
            "stream": producer.handle,
        }

    lib["add"][1, 8, 0, stream](out, Foreign(), 1.0, 8)
    stream.synchronize()
    assert out.to_host(stream=stream).tolist() == [6.0] * 8


def test_a_structured_scalar_of_another_size_is_refused_after_a_good_one(lib):
    out = cuctx.zeros(4, np.uint32)
    pair = np.dtype([("a", "<i4"), ("b", "<f4")])
    wide = np.dtype([("a", "<i4"), ("b", "<f4"), ("c", "<i4")])
    launcher = lib["store"][1, 1]
    launcher(out, 5, 1, np.zeros((), pair)[()])
    with pytest.raises(KernelArgumentError, match="scalar of 12 bytes; the parameter is 8"):
        launcher(out, 5, 1, np.zeros((), wide)[()])


@pytest.mark.parametrize("shared", [False, 0.0, 1.5])
def test_shared_mem_must_be_an_int_even_after_a_cached_launch(lib, shared):
    out, x = add_arrays()
    lib["add"][1, 8, 0](out, x, 1.0, 8)  # caches the launcher for shared_mem=0
    with pytest.raises(LaunchConfigError, match="shared_mem must be an int"):
        lib["add"][1, 8, shared]
