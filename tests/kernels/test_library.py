"""Libraries and modules: context-independent loading (seed 002), kernels, variables,
templates, the compile cache, unloading, and the sim's twins. Every scenario runs on the sim
and, where a GPU is present, on the real driver with the same CUDA source."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import cuctx
from cuctx.kernels import _compiler as compiler
from cuctx.kernels._compiler import compile_source

SOURCE = r"""
__device__ float gain = 2.5f;
__device__ int hits[4];
__managed__ int launches = 7;

extern "C" __global__ void scale(float* data, float factor, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) data[i] *= factor * gain;
    if (i == 0) atomicAdd(&launches, 1);
}

template <typename T>
__global__ void axpy(T* y, const T* x, T a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] += a * x[i];
}
"""


def twins(box: dict) -> dict:
    """The sim's stand-ins for SOURCE's kernels (gain keeps its initial 2.5 in these tests).
    ``box["managed"]`` receives the view of `launches` once the library is loaded."""

    def scale(grid, block, data, factor: float, n):
        data.view(np.float32, n)[:] *= np.float32(factor) * np.float32(2.5)
        box["managed"][0] += 1

    def axpy(grid, block, y, x, a: float, n):
        y.view(np.float32, n)[:] += np.float32(a) * x.view(np.float32, n)

    return {"scale": scale, "axpy<float>": axpy}


pytestmark = pytest.mark.usefixtures("nvrtc_cache")


def load() -> tuple[cuctx.Library, dict]:
    box: dict = {}
    lib = cuctx.Library.from_source(
        SOURCE, name_expressions=["axpy<float>"], sim_kernels=twins(box)
    )
    box["managed"] = lib.get_managed("launches", np.int32)
    return lib, box


# -- seed 002: one library, one kernel handle, many contexts ------------------------------


def test_one_kernel_handle_runs_in_every_context_including_ones_created_later(backend):
    lib, box = load()
    scale = lib.kernel("scale")
    contexts = [d.primary_context for d in cuctx.devices()]
    created = cuctx.Context.create(0)  # after the load: the driver loads the code on first use
    cuctx.Context.pop()
    contexts.append(created)
    for ctx in contexts:
        with ctx:
            data = cuctx.to_device(np.ones(8, np.float32))
            scale[1, 32](data, 2.0, 8)
            assert data.to_host().tolist() == [5.0] * 8, ctx
    assert lib["scale"] is scale  # one handle, not one per context
    for ctx in contexts:
        ctx.synchronize()
    assert int(lib.get_managed("launches", np.int32)[0]) == 7 + len(contexts)
    created.destroy()
    lib.unload()


def test_two_devices_share_one_library(backend):
    if len(cuctx.devices()) < 2:
        pytest.skip("needs two devices (the sim has two; this GPU machine has one)")
    lib, _ = load()
    results = []
    for ordinal in (0, 1):
        with cuctx.Device(ordinal):
            data = cuctx.to_device(np.full(4, 2, np.float32))
            cuctx.launch(lib["scale"], 1, 4, data, 1.0, 4)
            results.append(data.to_host().tolist())
    assert results == [[5.0] * 4, [5.0] * 4]


# -- variables ----------------------------------------------------------------------------


def test_device_variable_is_a_device_array_per_context(backend):
    lib, _ = load()
    with cuctx.Device(0):
        gain = lib.get_global("gain", np.float32)
        assert isinstance(gain, cuctx.DeviceArray)
        assert gain.shape == (1,) and gain.to_host()[0] == np.float32(2.5)
        gain.copy_from(np.array([4.0], np.float32))
        assert lib.get_global("gain", np.float32).to_host()[0] == 4.0
    other = cuctx.Context.create(0)
    try:
        assert lib.get_global("gain", np.float32).to_host()[0] == np.float32(2.5), (
            "each context has its own copy of a __device__ variable"
        )
        assert lib.get_global("hits", np.int32).shape == (4,)
    finally:
        other.destroy()


def test_missing_variable_names_it(backend):
    lib, _ = load()
    with cuctx.Device(0):
        with pytest.raises(cuctx.CudaError, match="no __device__ variable 'nope'"):
            lib.get_global("nope")
        with pytest.raises(cuctx.CudaError, match="no __managed__ variable 'gain'"):
            lib.get_managed("gain")


def test_global_view_shape_must_fit(backend):
    lib, _ = load()
    with cuctx.Device(0):
        with pytest.raises(ValueError, match="is 16 bytes"):
            lib.get_global("hits", np.int32, shape=8)


def test_managed_variable_is_one_host_visible_copy_for_all_contexts(backend):
    lib, _ = load()
    view = lib.get_managed("launches", np.int32)
    assert isinstance(view, np.ndarray) and view[0] == 7
    view[0] = 100
    with cuctx.Device(0):
        data = cuctx.to_device(np.ones(4, np.float32))
        lib["scale"][1, 32](data, 1.0, 4)
        cuctx.current_context().synchronize()
    assert lib.get_managed("launches", np.int32)[0] == 101


# -- templates, names ---------------------------------------------------------------------


def test_template_kernel_by_name_expression(backend):
    lib, _ = load()
    axpy = lib["axpy<float>"]
    assert axpy.name.startswith("_Z4axpyIfE")
    with cuctx.Device(0):
        y = cuctx.to_device(np.ones(16, np.float32))
        x = cuctx.to_device(np.arange(16, dtype=np.float32))
        axpy[1, 16](y, x, 2.0, 16)
        assert y.to_host().tolist() == (1 + 2 * np.arange(16)).tolist()
    assert axpy.name in lib.kernel_names and "scale" in lib.kernel_names


def test_unknown_kernel_lists_the_kernels(backend):
    lib, _ = load()
    with pytest.raises(KeyError, match="no kernel 'scal'.*'scale'"):
        lib["scal"]


CPP_SOURCE = r"""
__global__ void cpp_name(float* x) { x[0] = 1.0f; }
namespace ns { __global__ void nested(float* x) { x[0] = 2.0f; } }
template <typename T> __global__ void fill(T* x) { x[0] = T(3); }
"""


@pytest.mark.parametrize("kind", ["Library", "Module"])
def test_a_cpp_kernels_plain_name_suggests_extern_c_or_name_expressions(backend, kind):
    code = getattr(cuctx, kind).from_source(CPP_SOURCE, name_expressions=["fill<float>"])
    with pytest.raises(
        KeyError,
        match=r'no kernel "cpp_name" .*: it has the C\+\+ kernel '
        r'_Z8cpp_namePf; declare it extern "C" to keep the name "cpp_name", or '
        rf'list it in name_expressions=\["cpp_name"\] when calling {kind}\.'
        "from_source and ask for that name",
    ):
        code["cpp_name"]
    with pytest.raises(
        KeyError,
        match=r'_ZN2ns6nestedEPf; declare it extern "C" to keep the '
        r'name "nested", or list it in name_expressions=\["ns::nested"\]',
    ):
        code["nested"]
    with pytest.raises(
        KeyError, match="ask for it by the name expression it was compiled with: fill<float>"
    ):
        code["fill"]
    with pytest.raises(
        KeyError,
        match=r"list each instance in name_expressions="
        r'\["fill<int>"\] .*\(it was compiled with fill<float>\)',
    ):
        code["fill<int>"]
    assert code["_Z8cpp_namePf"].name == "_Z8cpp_namePf"  # the mangled name works as it did
    with pytest.raises(KeyError, match=r"no kernel 'nothing'.*_Z8cpp_namePf"):
        code["nothing"]  # no hint where no C++ kernel has the name: the list, as before


def test_compile_error_carries_nvrtc_log(backend):
    with pytest.raises(cuctx.CompileError) as info:
        cuctx.Library.from_source('extern "C" __global__ void k() { undefined_thing(); }')
    assert "undefined_thing" in info.value.log and "identifier" in info.value.log


# -- the cache ----------------------------------------------------------------------------


def test_cache_hit_invalidation_and_corrupt_entry(backend, tmp_path, monkeypatch):
    runs = []
    real = compiler.run_nvrtc
    monkeypatch.setattr(compiler, "run_nvrtc", lambda *a: runs.append(1) or real(*a))
    src = 'extern "C" __global__ void k(int* p) { *p = 1; }'
    cuctx.Library.from_source(src, cache_dir=tmp_path)
    cuctx.Library.from_source(src, cache_dir=tmp_path)
    assert len(runs) == 1, "the second compile is a cache hit"
    cuctx.Library.from_source(src, options=["-DVARIANT=2"], cache_dir=tmp_path)
    assert len(runs) == 2, "other options are another entry"
    for entry in tmp_path.glob("nvrtc-*.bin"):
        entry.write_bytes(entry.read_bytes()[:-7] + b"garbage")
    lib = cuctx.Library.from_source(src, cache_dir=tmp_path)
    assert len(runs) == 3, "a corrupt entry is recompiled, never loaded"
    assert lib["k"].param_layout == ((0, 8),)


# -- loading images -----------------------------------------------------------------------


def test_from_file_and_from_bytes_take_cubin_and_ptx(backend, tmp_path):
    src = 'extern "C" __global__ void fill(int* p, int v) { p[threadIdx.x] = v; }'

    def fill(grid, block, p, v):
        p.view(np.int32, block[0])[:] = v

    for arch in ("sm_90", "compute_90"):
        image = compile_source(src, arch=arch, cache_dir=False).image
        unterminated = image.rstrip(b"\0") if arch.startswith("compute") else image
        path = tmp_path / f"fill.{arch}"
        path.write_bytes(image)
        for lib in (
            cuctx.Library.from_file(path, sim_kernels={"fill": fill}),
            cuctx.Library.from_bytes(unterminated, sim_kernels={"fill": fill}),
        ):
            assert lib["fill"].param_layout == ((0, 8), (8, 4))
            with cuctx.Device(0):
                out = cuctx.zeros(4, np.int32)
                lib["fill"][1, 4](out, 9)
                assert out.to_host().tolist() == [9] * 4


def test_not_device_code_is_rejected(backend):
    with pytest.raises(ValueError, match="neither a cubin"):
        cuctx.Library.from_bytes(b"hello")
    with pytest.raises(TypeError, match="must be bytes"):
        cuctx.Library.from_bytes(12)


def test_fatbin_is_refused_clearly_on_the_sim(sim):
    fake = (0xBA55ED50).to_bytes(4, "little") + bytes(60)
    with pytest.raises(cuctx.NotSupportedError, match="the sim reads cubins and PTX"):
        cuctx.Library.from_bytes(fake)


# -- unloading ----------------------------------------------------------------------------


def test_unload_waits_for_queued_work_and_blocks_later_use(backend):
    lib, _ = load()
    scale = lib["scale"]
    with cuctx.Device(0):
        stream = cuctx.Stream()
        data = cuctx.to_device(np.ones(1 << 12, np.float32), stream=stream)
        launcher = scale[16, 256, 0, stream]
        for _ in range(8):
            launcher(data, 1.0, 1 << 12)
        lib.unload()  # must not pull the code from under the queued launches
        stream.synchronize()
        assert data.to_host()[0] == 2.5**8  # exact in float32
        with pytest.raises(RuntimeError, match="unloaded"):
            launcher(data, 1.0, 4)
        with pytest.raises(RuntimeError, match="unloaded"):
            lib.kernel("scale")
    lib.unload()  # twice is harmless


def test_garbage_collection_unloads(backend):
    def fill(grid, block, p, v):
        p.view(np.int32, 4)[:] = v

    lib = cuctx.Library.from_source(
        'extern "C" __global__ void fill(int* p, int v) { p[threadIdx.x] = v; }',
        sim_kernels={"fill": fill},
    )
    with cuctx.Device(0):
        data = cuctx.zeros(4, np.int32)
        lib["fill"][1, 4](data, 3)
    finalizer = lib._finalizer
    del lib
    gc.collect()
    assert not finalizer.alive
    assert data.to_host().tolist() == [3] * 4  # the queued launch ran before the unload


# -- Module: the context-bound way --------------------------------------------------------


def test_module_kernels_run_only_in_their_context(backend):
    other = None
    with cuctx.Device(0) as primary:
        box = {"managed": np.zeros(1, np.int32)}
        module = cuctx.Module.from_source(
            SOURCE, name_expressions=["axpy<float>"], sim_kernels=twins(box)
        )
        assert module.context is primary
        data = cuctx.to_device(np.ones(4, np.float32))
        module["scale"][1, 4](data, 2.0, 4)
        assert data.to_host().tolist() == [5.0] * 4
        assert module.get_global("gain", np.float32).to_host()[0] == np.float32(2.5)
        other = cuctx.Context.create(0)
        try:
            with pytest.raises(ValueError, match="runs only in"):
                module["scale"][1, 4, 0, cuctx.Stream()](data, 2.0, 4)  # a stream of `other`
        finally:
            other.destroy()
        module.unload()
        with pytest.raises(RuntimeError, match="unloaded"):
            module["scale"]


# -- introspection ------------------------------------------------------------------------


def test_attributes_occupancy_and_block_size(backend):
    lib, _ = load()
    scale = lib["scale"]
    with cuctx.Device(0):
        attrs = scale.attributes()
        assert attrs.num_regs > 0 and attrs.max_threads_per_block == 1024
        assert attrs.binary_version == 90 and attrs.shared_size_bytes == 0
        assert attrs.max_dynamic_shared_size_bytes == 48 * 1024
        assert 1 <= scale.occupancy(256) <= 8
        assert scale.occupancy(1024, 0) * 1024 <= 2048
        best = scale.suggest_block_size()
        assert best.block_size % 32 == 0 and 0 < best.block_size <= 1024
        assert best.min_grid_size % cuctx.Device(0).properties.multiprocessor_count == 0


def test_launch_bounds_and_static_shared_show_in_attributes(backend):
    src = r"""
    extern "C" __global__ void __launch_bounds__(128) bounded(float* p) {
        __shared__ float tile[1024];
        tile[threadIdx.x] = p[threadIdx.x];
        __syncthreads();
        p[threadIdx.x] = tile[127 - threadIdx.x];
    }"""
    lib = cuctx.Library.from_source(src)
    attrs = lib["bounded"].attributes(0)
    assert attrs.max_threads_per_block == 128
    assert attrs.shared_size_bytes == 4096
    assert attrs.max_dynamic_shared_size_bytes == 48 * 1024 - 4096


# -- the sim's twins ----------------------------------------------------------------------


def test_kernel_without_twin_fails_clearly_on_the_sim(sim):
    lib = cuctx.Library.from_source('extern "C" __global__ void lonely(int* p) {}')
    with cuctx.Device(0):
        with pytest.raises(cuctx.NotSupportedError, match="no Python twin.*'lonely'"):
            lib["lonely"][1, 1](None)


def test_twin_out_of_bounds_access_is_a_sticky_illegal_address(sim):
    src = 'extern "C" __global__ void over(float* p, int n) { p[n] = 1.0f; }'

    def over(grid, block, p, n):
        p.view(np.float32, n + 1)[n] = 1.0

    lib = cuctx.Library.from_source(src, sim_kernels={"over": over})
    ctx = cuctx.Context.create(0)
    try:
        data = cuctx.zeros(4, np.float32)
        lib["over"][1, 1](data, 4)  # one element past the end
        with pytest.raises(cuctx.StickyFaultError, match="ILLEGAL_ADDRESS"):
            ctx.synchronize()
        assert ctx.state == "poisoned"
        with pytest.raises(cuctx.ContextPoisonedError):
            lib["over"][1, 1](data, 0)
    finally:
        ctx.destroy()


def test_twin_that_raises_fails_the_launch_with_its_traceback(sim):
    from cuctx._driver.sim._twins import SimTwinWarning

    def broken(grid, block, p):
        raise ZeroDivisionError("twin bug")

    lib = cuctx.Library.from_source(
        'extern "C" __global__ void b(int* p) {}', sim_kernels={"b": broken}
    )
    ctx = cuctx.Context.create(0)
    try:
        lib["b"][1, 1](None)
        with pytest.warns(SimTwinWarning, match="twin bug"):
            with pytest.raises(cuctx.StickyFaultError, match="LAUNCH_FAILED"):
                ctx.synchronize()
    finally:
        ctx.destroy()


def test_twin_sees_arguments_decoded_by_size_and_annotation(sim):
    src = r"""
    struct Pair { int a; float b; };
    extern "C" __global__ void mix(double d, float f, int i, short s, long long q,
                                   Pair p, float* out) {}"""
    seen = {}

    def mix(grid, block, d: float, f: float, i, s, q: int, p: bytes, out):
        seen.update(grid=grid, block=block, d=d, f=f, i=i, s=s, q=q, p=p, out=out)

    lib = cuctx.Library.from_source(src, sim_kernels={"mix": mix})
    import ctypes

    class Pair(ctypes.Structure):
        _fields_ = [("a", ctypes.c_int), ("b", ctypes.c_float)]

    with cuctx.Device(0) as ctx:
        out = cuctx.zeros(2, np.float32)
        lib["mix"][(2, 3), 4](1.5, 0.25, -7, np.int16(-2), -(1 << 40), Pair(3, 0.5), out)
        ctx.synchronize()
    assert seen["grid"] == (2, 3, 1) and seen["block"] == (4, 1, 1)
    scalars = (seen["d"], seen["f"], seen["i"], seen["s"], seen["q"])
    assert scalars == (1.5, 0.25, -7, -2, -(1 << 40))
    assert seen["p"] == bytes(Pair(3, 0.5))
    assert int(seen["out"]) == out.ptr
