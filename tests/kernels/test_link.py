"""Every kind of device code: compile targets (cubin, PTX, LTO-IR), PTX to a cubin, NVVM IR
through libNVVM, `Library.link` with nvJitLink or the driver's linker, its errors and its
cache, on both backends (the sim runs linked kernels with twins, by kernel name)."""

from __future__ import annotations

import numpy as np
import pytest

import cuctx
from conftest import requires_nvrtc
from cuctx.devcode._kinds import is_cubin, is_ltoir, is_ptx, kind_of
from cuctx.kernels import _jitlink, _nvvm

pytestmark = requires_nvrtc

_NVJITLINK_MISSING = None if _jitlink.nvjitlink_version() else _jitlink._nvjitlink()[1]
requires_nvjitlink = pytest.mark.skipif(
    _NVJITLINK_MISSING is not None, reason=f"nvJitLink cannot be loaded: {_NVJITLINK_MISSING}"
)
_NVVM_MISSING = _nvvm._nvvm()[1]
requires_nvvm = pytest.mark.skipif(
    _NVVM_MISSING is not None, reason=f"libNVVM cannot be loaded: {_NVVM_MISSING}"
)

KERNEL = r"""
extern __device__ float scale(float x, float by);
extern "C" __global__ void scale_all(float* y, float by, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = scale(y[i], by);
}"""
DEVICE_FUNCTION = "__device__ float scale(float x, float by) { return x * by; }"


def scale_all_on_the_sim(grid, block, y, by, n):
    y.view(np.float32, n)[:] *= np.float32(by)


def arch() -> str:
    major, minor = cuctx.Device(0).compute_capability
    return f"sm_{major}{minor}"


def run_scale_all(library: cuctx.Library) -> np.ndarray:
    y = cuctx.to_device(np.arange(8, dtype=np.float32))
    library["scale_all"][1, 32](y, 3, 8)  # 3 -> 3.0f: the kernel's PTX gives the types
    return y.to_host()


# -- compile targets ----------------------------------------------------------------------


def test_the_three_targets_of_a_cpp_source(tmp_path):
    src = 'extern "C" __global__ void k(int* p) { *p = 1; }'
    results = {
        target: cuctx.compile_source(src, arch="sm_90", target=target, cache_dir=tmp_path)
        for target in ("cubin", "ptx", "ltoir")
    }
    assert is_cubin(results["cubin"].image) and is_ptx(results["ptx"].image)
    assert is_ltoir(results["ltoir"].image) and results["ltoir"].ptx is None
    assert {r.kind for r in results.values()} == {"cubin", "ptx", "ltoir"}
    again = cuctx.compile_source(src, arch="sm_90", target="ltoir", cache_dir=tmp_path)
    assert again.from_cache and again.kind == "ltoir" and again.image == results["ltoir"].image


def test_relocatable_code_keeps_device_functions_no_kernel_calls():
    plain = cuctx.compile_source(DEVICE_FUNCTION, arch="sm_90", target="ptx", cache_dir=False)
    kept = cuctx.compile_source(
        DEVICE_FUNCTION, arch="sm_90", target="ptx", relocatable=True, cache_dir=False
    )
    assert b"_Z5scaleff" not in plain.image and b"_Z5scaleff" in kept.image


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(arch="compute_90", target="cubin"), "a cubin is code for a real architecture"),
        (dict(arch="sm_90", target="fatbin"), "target must be 'cubin', 'ptx' or 'ltoir'"),
        (dict(arch="sm_90", language="fortran"), "language must be one of"),
    ],
)
def test_targets_no_compiler_makes_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        cuctx.compile_source(DEVICE_FUNCTION, cache_dir=False, **kwargs)


def test_ltoir_is_linked_not_loaded(backend):
    ltoir = cuctx.compile_source(DEVICE_FUNCTION, arch=arch(), target="ltoir", cache_dir=False)
    with pytest.raises(ValueError, match=r"LTO-IR, which the driver does not load: link it"):
        cuctx.Library.from_bytes(ltoir.image)


# -- PTX to a cubin -----------------------------------------------------------------------


@requires_nvjitlink
def test_ptx_compiles_to_a_cubin_that_loads_and_runs(backend, tmp_path):
    src = 'extern "C" __global__ void fill(int* p, int v) { p[threadIdx.x] = v; }'
    ptx = cuctx.compile_source(src, arch=arch(), target="ptx", cache_dir=False).image
    cubin = cuctx.compile_source(
        ptx, arch=arch(), language="ptx", options=["-O3"], cache_dir=tmp_path
    )
    assert cubin.kind == "cubin" and is_cubin(cubin.image) and cubin.ptx == ptx
    with pytest.raises(ValueError, match="PTX compiles to a cubin only"):
        cuctx.compile_source(ptx, arch=arch(), language="ptx", target="ptx")

    def fill(grid, block, p, v):
        p.view(np.int32, block[0])[:] = v

    library = cuctx.Library.from_source(ptx, language="ptx", sim_kernels={"fill": fill})
    out = cuctx.zeros(4, np.int32)
    library["fill"][1, 4](out, 7)
    assert out.to_host().tolist() == [7, 7, 7, 7]


# -- NVVM IR ------------------------------------------------------------------------------

NVVM_IR = """target triple = "nvptx64-unknown-cuda"
target datalayout = "e-p:64:64:64-i1:8:8-i8:8:8-i16:16:16-i32:32:32-i64:64:64-i128:128:128-\
f32:32:32-f64:64:64-v16:16:16-v32:32:32-v64:64:64-v128:128:128-n16:32:64"
define void @simple(i32* %data) {
entry:
  %0 = call i32 @llvm.nvvm.read.ptx.sreg.tid.x()
  store i32 %0, i32* %data, align 4
  ret void
}
declare i32 @llvm.nvvm.read.ptx.sreg.tid.x() nounwind readnone
!nvvm.annotations = !{!0}
!0 = !{void (i32*)* @simple, !"kernel", i32 1}
!nvvmir.version = !{!1}
!1 = !{i32 2, i32 0, i32 3, i32 2}
"""


@requires_nvvm
def test_nvvm_ir_compiles_through_libnvvm_to_each_target(backend):
    assert kind_of(NVVM_IR) == "nvvm"
    ptx = cuctx.compile_source(
        NVVM_IR, arch=arch(), language="nvvm", target="ptx", name="simple.ll", cache_dir=False
    )
    assert b".visible .entry simple(" in ptx.image and ptx.name == "simple.ll"
    assert is_ltoir(
        cuctx.compile_source(
            NVVM_IR, arch=arch(), language="nvvm", target="ltoir", cache_dir=False
        ).image
    )
    library = cuctx.Library.from_source(
        NVVM_IR, language="nvvm", sim_kernels={"simple": lambda grid, block, data: None}
    )
    assert library["simple"].param_layout == ((0, 8),)
    with pytest.raises(cuctx.CompileError, match=r"libNVVM failed to compile 'bad.ll'") as e:
        cuctx.compile_source(
            "define void @k( {", arch=arch(), language="nvvm", name="bad.ll", cache_dir=False
        )
    assert e.value.log


def test_without_libnvvm_the_error_names_the_package(monkeypatch):
    monkeypatch.setattr(_nvvm, "_nvvm", lambda: (None, "OSError: libnvvm.so.4 not found"))
    with pytest.raises(RuntimeError, match=r"libNVVM.*not found.*nvidia-nvvm"):
        cuctx.compile_source(NVVM_IR, arch="sm_90", language="nvvm", cache_dir=False)


# -- linking ------------------------------------------------------------------------------


@requires_nvjitlink
def test_an_lto_link_of_a_kernel_and_a_separately_compiled_device_function(backend):
    device_function = cuctx.compile_source(
        DEVICE_FUNCTION, arch=arch(), target="ltoir", name="scale.cu", cache_dir=False
    )
    library = cuctx.Library.link(
        [KERNEL, device_function],
        lto=True,
        cache_dir=False,
        sim_kernels={"scale_all": scale_all_on_the_sim},
    )
    assert isinstance(library, cuctx.Library) and library.kernel_names == ["scale_all"]
    assert run_scale_all(library).tolist() == [0, 3, 6, 9, 12, 15, 18, 21]
    assert library["scale_all"].dtypes == (("float32",), None, None)  # from the C++ source


@requires_nvjitlink
def test_a_link_of_ptx_cubin_and_source_pieces(backend, tmp_path):
    kernel_ptx = cuctx.compile_source(
        KERNEL, arch=arch(), target="ptx", relocatable=True, name="kernel.cu", cache_dir=False
    )
    device_cubin = cuctx.compile_source(
        DEVICE_FUNCTION, arch=arch(), relocatable=True, cache_dir=False
    )
    path = tmp_path / "scale.cubin"
    path.write_bytes(device_cubin.image)
    for pieces in ([kernel_ptx, path], [("kernel.ptx", kernel_ptx.image), DEVICE_FUNCTION]):
        library = cuctx.Library.link(
            pieces, cache_dir=False, sim_kernels={"scale_all": scale_all_on_the_sim}
        )
        assert run_scale_all(library).tolist() == [0, 3, 6, 9, 12, 15, 18, 21]


@requires_nvjitlink
@pytest.mark.parametrize("lto", [False, True], ids=["plain", "lto"])
def test_a_link_error_carries_the_log_and_names_the_piece(backend, lto):
    with pytest.raises(cuctx.LinkError) as caught:
        cuctx.Library.link([("kernel.cu", KERNEL)], lto=lto, cache_dir=False)
    error = caught.value
    assert "_Z5scaleff" in error.log and error.pieces == ("kernel.cu",)
    assert "_Z5scaleff (scale) is used by 'kernel.cu' and defined by no piece" in str(error)


def test_pieces_that_are_no_device_code_are_refused():
    with pytest.raises(ValueError, match="piece 'piece 1' is not device code"):
        cuctx.Library.link([b"\x00\x01 not device code"], arch="sm_90", cache_dir=False)
    with pytest.raises(TypeError, match="a list of pieces"):
        cuctx.Library.link(KERNEL, arch="sm_90")
    with pytest.raises(ValueError, match="arch="):
        cuctx.Library.link([KERNEL], arch="sm_90", options=["-arch=sm_80"])
    with pytest.raises(ValueError, match="lto=True"):
        cuctx.Library.link([KERNEL], arch="sm_90", options=["-lto"])


@requires_nvjitlink
def test_links_are_cached_by_every_input_and_option(backend, tmp_path, monkeypatch):
    runs = []
    real = _jitlink.link
    monkeypatch.setattr(_jitlink, "link", lambda *a, **k: runs.append(1) or real(*a, **k))

    def link(device=DEVICE_FUNCTION, **options):
        return cuctx.Library.link(
            [KERNEL, device],
            cache_dir=tmp_path,
            sim_kernels={"scale_all": scale_all_on_the_sim},
            **options,
        )

    link()
    assert run_scale_all(link()).tolist()[1] == 3 and len(runs) == 1, "the same link: a hit"
    link(options=["-O3"])
    link(lto=True)
    link(device=DEVICE_FUNCTION.replace("x * by", "x * by * 2.0f"))
    assert len(runs) == 4 and len(list(tmp_path.glob("link-*.bin"))) == 4


def test_lto_without_nvjitlink_names_the_package(monkeypatch):
    monkeypatch.setattr(_jitlink, "nvjitlink_version", lambda: None)
    with pytest.raises(RuntimeError, match=r"lto=True\) needs nvJitLink.*nvidia-nvjitlink"):
        cuctx.Library.link([KERNEL, DEVICE_FUNCTION], lto=True, arch="sm_90", cache_dir=False)


def test_without_nvjitlink_the_drivers_linker_links(backend, monkeypatch):
    """The driver's linker serves links without LTO where nvJitLink is missing; the sim has
    none of its own, so there the error names the package."""
    monkeypatch.setattr(_jitlink, "nvjitlink_version", lambda: None)
    pieces = [KERNEL, DEVICE_FUNCTION]
    if backend.sim is not None:
        with pytest.raises(cuctx.CudaError, match=r"cuLinkCreate.*nvidia-nvjitlink"):
            cuctx.Library.link(pieces, cache_dir=False)
        return
    library = cuctx.Library.link(pieces, options=["-O3"], cache_dir=False)
    assert run_scale_all(library).tolist() == [0, 3, 6, 9, 12, 15, 18, 21]
    with pytest.raises(cuctx.LinkError, match=r"Undefined reference to '_Z5scaleff'") as e:
        cuctx.Library.link([("kernel.cu", KERNEL)], cache_dir=False)
    assert e.value.linker == "driver"
    with pytest.raises(ValueError, match="the driver's linker .* takes -O<n>"):
        cuctx.Library.link(pieces, options=["-ftz=true"], cache_dir=False)


# -- occupancy ----------------------------------------------------------------------------

OCCUPANCY_SRC = r"""extern "C" __global__ void k(float* y) {
    extern __shared__ float s[];
    s[threadIdx.x] = y[threadIdx.x];
    __syncthreads();
    y[threadIdx.x] = s[blockDim.x - 1 - threadIdx.x];
}"""


def test_suggest_block_size_asks_a_shared_memory_callback_per_block_size(backend):
    kernel = cuctx.Library.from_source(OCCUPANCY_SRC)["k"]
    asked = []
    min_grid, block = kernel.suggest_block_size(
        lambda size: asked.append(size) or 64 * size, limit=277
    )
    assert asked and max(asked) <= 277 and block in asked and block <= 277
    assert (
        min_grid
        == kernel.occupancy(block, 64 * block) * cuctx.Device(0).properties.multiprocessor_count
    )
    with pytest.raises(ZeroDivisionError):
        kernel.suggest_block_size(lambda size: size // 0)
    with pytest.raises(TypeError, match=r"shared_mem\(\d+\) must be an int"):
        kernel.suggest_block_size(lambda size: 1.5)


@pytest.mark.parametrize("blocks_per_sm, block", [(4, 32), (2, 64), (3, 120), (1, 256)])
def test_available_dynamic_shared_memory_keeps_that_many_blocks_resident(
    backend, blocks_per_sm, block
):
    kernel = cuctx.Library.from_source(OCCUPANCY_SRC)["k"]
    nbytes = kernel.available_dynamic_shared_memory(blocks_per_sm, block)
    assert 0 < nbytes <= kernel.attributes().max_dynamic_shared_size_bytes
    assert kernel.occupancy(block, nbytes) >= blocks_per_sm
    with pytest.raises(cuctx.LaunchConfigError, match="fits 1 to"):
        kernel.available_dynamic_shared_memory(kernel.occupancy(block) + 1, block)


def test_cluster_occupancy(backend):
    kernel = cuctx.Library.from_source(OCCUPANCY_SRC)["k"]
    largest = kernel.max_cluster_size(64)
    assert 1 <= largest <= 8
    counts = [kernel.max_active_clusters(size, 64) for size in (1, 2, 4, 8)]
    assert counts[0] >= counts[1] >= counts[2] >= counts[3] >= 1
    assert counts[0] <= kernel.occupancy(64) * cuctx.Device(0).properties.multiprocessor_count
    assert kernel.max_active_clusters((2, 2), 1024, 32768) >= 1
    with pytest.raises(cuctx.LaunchConfigError, match="portable limit is 8"):
        kernel.max_active_clusters(16, 64)


def test_cluster_occupancy_of_the_sim_is_an_h100s(sim):
    """What an H100 80GB HBM3 answered (driver 580, scripts/probe_link.py) for a kernel as
    resident as this one: at most 8 blocks of a cluster launch per SM (not the 16 of plain
    occupancy), and clusters of 4 and 8 blocks on at most 16 SMs of each GPC."""
    kernel = cuctx.Library.from_source(OCCUPANCY_SRC)["k"]
    assert (kernel.occupancy(128), kernel.occupancy(1024, 49152)) == (16, 2)
    assert kernel.max_cluster_size(128) == 8
    assert [kernel.max_active_clusters(size, 128) for size in (1, 2, 4, 8)] == [1056, 528, 248, 124]
    assert [kernel.max_active_clusters(size, 1024, 49152) for size in (1, 2, 4, 8)] == [
        264,
        132,
        62,
        30,
    ]
