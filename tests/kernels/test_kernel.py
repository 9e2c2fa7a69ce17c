"""The kernel API's small promises: a clear error for each misuse, the driver's order for
suggest_block_size, views of variables only as plain numbers. Sim and GPU."""

from __future__ import annotations

import numpy as np
import pytest

import cuctx
from conftest import requires_nvrtc
from cuctx import LaunchConfigError

from scenarios import library_fixture

pytestmark = [requires_nvrtc, pytest.mark.usefixtures("nvrtc_cache"), pytest.mark.paths()]

SOURCE = r"""
__device__ int counter[4];
__managed__ int shared_total;
extern "C" __global__ void fill(int* out, int v) { out[threadIdx.x] = v; }
"""


def fill(grid, block, out, v):
    out.view(np.int32, block[0])[:] = v


lib = library_fixture(SOURCE, fill=fill)


def test_calling_a_kernel_without_a_configuration_says_how(lib):
    with pytest.raises(
        TypeError,
        match=r"lib\['fill'\]\[grid, block\]\(\*args\).*"
        r"cuctx\.launch\(kernel, grid, block, \*args\)",
    ):
        lib["fill"](cuctx.zeros(4, np.int32), 1)


@pytest.mark.parametrize("kernel", [None, "fill", 3])
def test_launch_names_its_kernel_argument(lib, kernel):
    with pytest.raises(
        TypeError,
        match=r"the kernel argument of cuctx\.launch must be a "
        r"cuctx\.Kernel",
    ):
        cuctx.launch(kernel, 1, 4, cuctx.zeros(4, np.int32), 1)


def test_launch_of_a_launcher_is_refused_too(lib):
    with pytest.raises(TypeError, match="not Launcher"):
        cuctx.launch(lib["fill"][1, 4], 1, 4)


@pytest.mark.parametrize(
    "block, error, message",
    [
        (0, LaunchConfigError, "block size must be positive"),
        (-32, LaunchConfigError, "block must be >= 0"),
        (2048, LaunchConfigError, "can run at most 1024 threads per block"),
        (256.0, TypeError, "block must be an int"),
        (True, TypeError, "block must be an int"),
    ],
)
def test_occupancy_of_a_block_size_that_never_runs_is_an_error(lib, block, error, message):
    with pytest.raises(error, match=message):
        lib["fill"].occupancy(block)


def test_occupancy_checks_its_shared_memory_argument(lib):
    assert lib["fill"].occupancy(256, 0) >= 1
    with pytest.raises(LaunchConfigError, match="shared_mem must be >= 0"):
        lib["fill"].occupancy(256, -1)


def test_suggest_block_size_is_in_the_drivers_order(lib):
    kernel = lib["fill"]
    min_grid_size, block_size = kernel.suggest_block_size()  # cuOccupancyMaxPotentialBlockSize
    best = kernel.suggest_block_size()
    assert best._fields == ("min_grid_size", "block_size")
    assert (best.min_grid_size, best.block_size) == (min_grid_size, block_size)
    assert block_size % 32 == 0 and 0 < block_size <= 1024
    sms = cuctx.Device(0).properties.multiprocessor_count
    assert min_grid_size == kernel.occupancy(block_size) * sms
    assert kernel.suggest_block_size(limit=64).block_size <= 64
    with pytest.raises(LaunchConfigError, match="limit must be >= 0"):
        kernel.suggest_block_size(limit=-1)


def test_a_module_kernel_is_asked_about_its_own_device_only(backend):
    if len(cuctx.devices()) < 2:
        pytest.skip("needs two devices (the sim has two)")
    with cuctx.Device(0):
        module = cuctx.Module.from_source(SOURCE, sim_kernels={"fill": fill})
        kernel = module["fill"]
        assert kernel.occupancy(256, device=0) >= 1
        with pytest.raises(ValueError, match="exists only on <Device 0"):
            kernel.occupancy(256, device=1)
        module.unload()


@pytest.mark.parametrize(
    "dtype, shape, error, message",
    [
        (object, None, TypeError, "bool, integer, float or complex"),
        (np.dtype(">i4"), None, TypeError, "native byte order"),
        (np.int32, (-1,), ValueError, "negative dimension"),
        (np.int32, 2.0, TypeError, "a shape is an int or a tuple of ints"),
    ],
)
def test_variable_views_hold_plain_numbers(lib, dtype, shape, error, message):
    with pytest.raises(error, match=message):
        lib.get_global("counter", dtype, shape)
    with pytest.raises(error, match=message):
        lib.get_managed("shared_total", dtype, shape)


def test_a_cubin_whose_variable_lies_outside_its_section_is_an_invalid_image(sim):
    """The sim's image reader must not trust a symbol's size (it allocated what it said)."""
    import struct

    from cuctx.devcode import _elf
    from cuctx.kernels._compiler import compile_source

    image = bytearray(compile_source(SOURCE, arch="sm_90", cache_dir=False).image)
    ehdr = _elf._EHDR.unpack_from(image, 0)
    shoff, shnum = ehdr[6], ehdr[12]
    sections = [_elf._SHDR.unpack_from(image, shoff + i * _elf._SHDR.size) for i in range(shnum)]
    symtab = next(sh for sh in sections if sh[1] == _elf._SHT_SYMTAB)
    names = _elf._section_data(bytes(image), sections[symtab[6]], "names")
    for offset in range(symtab[4], symtab[4] + symtab[5], _elf._SYM.size):
        if _elf._cstr(names, _elf._SYM.unpack_from(image, offset)[0], "") == "counter":
            struct.pack_into("<Q", image, offset + 16, 1 << 62)  # st_size
            break
    else:
        pytest.fail("no symbol 'counter' in the cubin")
    with pytest.raises(cuctx.CudaError, match="INVALID_IMAGE"):
        cuctx.Library.from_bytes(bytes(image))


def test_names_must_be_strings(lib):
    with pytest.raises(TypeError, match=r"kernel takes a name \(str\), not int"):
        lib[0]
    with pytest.raises(TypeError, match=r"Library.get_global takes a name \(str\)"):
        lib.get_global(b"counter")
    with pytest.raises(TypeError, match=r"Library.get_managed takes a name \(str\)"):
        lib.get_managed(None)
