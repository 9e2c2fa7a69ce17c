"""Scalar arguments are converted to the parameter types the PTX declares (code compiled
from source, or loaded as PTX); a foreign cubin without PTX keeps the size check. Device
arrays: other contexts of the launch's device are fine, other devices need peer access,
strided views are refused. Sim and GPU."""

from __future__ import annotations

import ctypes
import enum
import struct

import numpy as np
import pytest

import cuctx
from conftest import requires_nvrtc
from cuctx import KernelArgumentError
from cuctx.kernels._compiler import compile_source

from scenarios import ADD_SOURCE, add, library_fixture

pytestmark = [requires_nvrtc, pytest.mark.usefixtures("nvrtc_cache"),
              pytest.mark.paths()]

SOURCE = r"""
struct C8 { float re, im; };
struct __align__(16) C16 { double re, im; };
struct Pair { int a; float b; };

extern "C" __global__ void echo(double* out, float a, double d, int n, unsigned u, short s,
                                long long q, C8 c, C16 z, bool flag, Pair p) {
    out[0] = a; out[1] = d; out[2] = n; out[3] = u; out[4] = s; out[5] = (double)q;
    out[6] = c.re; out[7] = c.im; out[8] = z.re; out[9] = z.im; out[10] = flag;
    out[11] = p.a; out[12] = p.b;
}
""" + ADD_SOURCE


def echo(grid, block, out, a, d, n, u, s, q: int, c, z, flag, p):
    """No annotations where the PTX says the type: a and d arrive as floats."""
    assert type(a) is float and type(d) is float and type(n) is int, (a, d, n)
    pair = struct.unpack("<if", p)
    out.view(np.float64, 13)[:] = [a, d, n, u & 0xFFFFFFFF, s, q, *struct.unpack("<2f", c),
                                   *struct.unpack("<2d", z), flag, *pair]


class Pair(ctypes.Structure):
    _fields_ = [("a", ctypes.c_int), ("b", ctypes.c_float)]


class Level(enum.IntEnum):
    HIGH = 7


class Ratio(float):
    pass


lib = library_fixture(SOURCE, echo=echo, add=add)


GOOD = dict(a=1.5, d=2.5, n=3, u=4, s=5, q=-6, c=7 + 8j, z=9 + 10j, flag=True, p=Pair(11, 12.5))


def run_echo(lib, **changes) -> list[float]:
    out = cuctx.zeros(13, np.float64)
    args = {**GOOD, **changes}
    lib["echo"][1, 1](out, *args.values())
    return out.to_host().tolist()


def test_each_scalar_arrives_as_its_parameter_type(lib):
    assert run_echo(lib) == [1.5, 2.5, 3, 4, 5, -6, 7, 8, 9, 10, 1, 11, 12.5]


def test_an_int_converts_to_a_float_parameter(lib):
    """The int's value, not its bits (2 as a float's bits would be 2.8e-45)."""
    assert run_echo(lib, a=2, d=3)[:2] == [2.0, 3.0]
    assert run_echo(lib, a=np.int32(4), d=np.uint64(5))[:2] == [4.0, 5.0]
    assert run_echo(lib, a=Level.HIGH)[0] == 7.0


def test_int_and_float_subclasses_and_numpy_scalars_are_accepted(lib):
    result = run_echo(lib, a=Ratio(0.5), d=np.float32(0.25), n=Level.HIGH, u=np.uint32(2**32 - 1),
                      s=np.int16(-2), q=np.int64(-(1 << 40)), flag=np.True_)
    assert result[:7] == [0.5, 0.25, 7, 2**32 - 1, -2, -(1 << 40), 7]
    assert result[10] == 1
    assert run_echo(lib, a=np.float64(0.75))[0] == 0.75  # a float's value, as C converts it


@pytest.mark.parametrize("name, value, message", [
    ("n", 4.0, r"parameter 3 of kernel 'echo' \(\.u32: an integer.*cannot take float 4\.0"),
    ("n", np.float32(4), r"parameter 3 .*cannot take float32"),
    ("u", 1 + 0j, r"parameter 4 .*cannot take complex"),
    ("a", True, r"parameter 1 .*a bool is not converted to a floating-point parameter"),
    ("d", np.False_, r"parameter 2 .*a bool is not converted"),
    ("d", 1j, r"parameter 2 .*cannot take complex"),
    ("p", 3, r"parameter 10 .*struct of 8 bytes; pass a ctypes structure or a NumPy scalar"),
    ("c", 1.0, r"parameter 7 .*struct of 8 bytes"),
    ("flag", 0.0, r"parameter 9 .*\.u8: an integer.*cannot take float"),
])
def test_a_value_of_the_wrong_kind_names_the_parameter(lib, name, value, message):
    with pytest.raises(KernelArgumentError, match=message):
        run_echo(lib, **{name: value})


def test_a_bool_goes_to_an_int_parameter(lib):
    assert run_echo(lib, n=True, flag=False)[2] == 1


def test_python_complex_fills_an_8_or_16_byte_complex_struct(lib):
    result = run_echo(lib, c=np.complex64(1.5 - 2j), z=np.complex128(-3 + 0.5j))
    assert result[6:10] == [1.5, -2.0, -3.0, 0.5]


def test_values_out_of_range_are_errors_on_every_path(lib):
    launcher = lib["add"][1, 8]
    out, x = cuctx.zeros(8, np.float32), cuctx.to_device(np.arange(8, dtype=np.float32))
    launcher(out, x, 1.0, 8)
    launcher(out, x, 1.0, 8)  # the generated fast path from here on
    for _ in range(2):
        with pytest.raises(KernelArgumentError, match=r"parameter 2 .*cannot hold 1e\+300"):
            launcher(out, x, 1e300, 8)
        with pytest.raises(KernelArgumentError, match=r"parameter 2 .*cannot hold 10{40}"):
            launcher(out, x, 10**40, 8)
        with pytest.raises(KernelArgumentError, match=r"parameter 3 .*cannot hold 4294967296"):
            launcher(out, x, 1.0, 2**32)


def test_the_fast_path_converts_and_refuses_as_the_checked_path_does(lib):
    launcher = lib["add"][1, 8]
    out, x = cuctx.zeros(8, np.float32), cuctx.to_device(np.arange(8, dtype=np.float32))
    for value in (2, 3, 4):  # ints for the float: the first call generates the fast path
        launcher(out, x, value, 8)
        assert out.to_host().tolist() == list(range(value, value + 8))
    with pytest.raises(KernelArgumentError, match=r"parameter 3 .*cannot take float 8\.0"):
        launcher(out, x, 1, 8.0)
    launcher(out, x, 0.5, 8)
    assert out.to_host().tolist() == [i + 0.5 for i in range(8)]


def test_ptx_images_carry_types_and_a_cubin_alone_is_checked_by_size(backend):
    """Library.from_bytes of PTX reads the types from it; of a bare cubin it cannot, so a
    Python number packs by its own type, with the size check only (docs/kernels.md)."""
    src = 'extern "C" __global__ void put(float* out, float a) { *out = a; }'
    seen = []

    def put(grid, block, out, a: float):
        seen.append(a)
        out.view(np.float32, 1)[0] = a
    for arch in ("compute_90", "sm_90"):
        image = compile_source(src, arch=arch, cache_dir=False).image
        lib = cuctx.Library.from_bytes(image, sim_kernels={"put": put})
        with cuctx.Device(0):
            out = cuctx.zeros(1, np.float32)
            lib["put"][1, 1](out, 2)
            value = out.to_host()[0]
        if arch == "compute_90":
            assert value == 2.0
        else:
            assert value == np.frombuffer(struct.pack("<i", 2), np.float32)[0]  # the int's bits
            with pytest.raises(KernelArgumentError, match="got a NumPy float64 scalar of 8"):
                lib["put"][1, 1](out, np.float64(2))


# -- device arrays ------------------------------------------------------------------------

def test_an_array_of_another_context_on_the_same_device_is_accepted(lib):
    """The driver maps every context's memory of a device into one address space: a kernel
    in context B reads context A's allocation (measured on an H100, docs/kernels.md)."""
    x = cuctx.to_device(np.arange(8, dtype=np.float32))  # in the primary context
    x.context.synchronize()  # uploaded on its stream: `other`'s streams do not wait for it
    other = cuctx.Context.create(0)
    try:
        out = cuctx.zeros(8, np.float32)
        launcher = lib["add"][1, 8]
        for shift in (1.0, 2.0):  # the checked path, then the fast path
            launcher(out, x, shift, 8)
            assert out.to_host().tolist() == [i + shift for i in range(8)]
    finally:
        other.destroy()


def test_an_array_of_another_device_needs_peer_access(lib):
    if len(cuctx.devices()) < 2:
        pytest.skip("needs two devices (the sim has two)")
    with cuctx.Device(1):
        x = cuctx.to_device(np.arange(8, dtype=np.float32))
        cuctx.synchronize()  # uploaded on device 1's stream; the launches run on device 0's
    out = cuctx.zeros(8, np.float32)
    launcher = lib["add"][1, 8]
    launcher(out, cuctx.to_device(np.arange(8, dtype=np.float32)), 1.0, 8)  # the fast path
    for _ in range(2):
        with pytest.raises(KernelArgumentError,
                           match=r"DeviceArray on device 1 passed to a launch on device 0 needs "
                                 r"peer access: call cuctx\.Device\(0\)\.enable_peer_access\("
                                 r"cuctx\.Device\(1\)\)"):
            launcher(out, x, 1.0, 8)
    if not hasattr(cuctx.Device, "enable_peer_access"):
        pytest.skip("Device.enable_peer_access is not there yet")
    cuctx.Device(0).enable_peer_access(cuctx.Device(1))
    try:
        launcher(out, x, 1.0, 8)
        assert out.to_host().tolist() == [i + 1.0 for i in range(8)]
    finally:
        cuctx.Device(0).disable_peer_access(cuctx.Device(1))


def test_a_strided_view_is_refused_on_every_path(lib):
    """A kernel gets only the address: it would read a[::2] as the first half of a."""
    x = cuctx.to_device(np.arange(16, dtype=np.float32))
    out = cuctx.zeros(8, np.float32)
    launcher = lib["add"][1, 8]
    launcher(out, x[:8], 0.0, 8)
    launcher(out, x[8:], 0.0, 8)  # contiguous slices are fine; the fast path exists now
    assert out.to_host().tolist() == list(range(8, 16))
    for _ in range(2):
        with pytest.raises(KernelArgumentError, match=r"not C-contiguous \(shape \(8,\)\)"):
            launcher(out, x[::2], 0.0, 8)
    launcher(out, x[::2].ptr, 0.0, 8)  # its address, for a kernel that knows the stride
