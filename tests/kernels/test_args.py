"""Scalar arguments are converted to the parameter types the PTX declares (code compiled
from source, or loaded as PTX); a foreign cubin without PTX keeps the size check. Device
arrays: other contexts of the launch's device are fine, other devices need peer access,
strided views are refused, and an array whose dtype is not what the parameter points at in
the source is refused unless a view or `Kernel.set_dtypes` says it is meant. Sim and GPU."""

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

from scenarios import ADD_SOURCE, add, add_arrays, library_fixture

pytestmark = [requires_nvrtc, pytest.mark.usefixtures("nvrtc_cache"), pytest.mark.paths()]

SOURCE = (
    r"""
struct C8 { float re, im; };
struct __align__(16) C16 { double re, im; };
struct Pair { int a; float b; };

extern "C" __global__ void echo(double* out, float a, double d, int n, unsigned u, short s,
                                long long q, C8 c, C16 z, bool flag, Pair p) {
    out[0] = a; out[1] = d; out[2] = n; out[3] = u; out[4] = s; out[5] = (double)q;
    out[6] = c.re; out[7] = c.im; out[8] = z.re; out[9] = z.im; out[10] = flag;
    out[11] = p.a; out[12] = p.b;
}
"""
    + ADD_SOURCE
)


def echo(grid, block, out, a, d, n, u, s, q: int, c, z, flag, p):
    """No annotations where the PTX says the type: a and d arrive as floats."""
    assert type(a) is float and type(d) is float and type(n) is int, (a, d, n)
    pair = struct.unpack("<if", p)
    out.view(np.float64, 13)[:] = [
        a,
        d,
        n,
        u & 0xFFFFFFFF,
        s,
        q,
        *struct.unpack("<2f", c),
        *struct.unpack("<2d", z),
        flag,
        *pair,
    ]


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
    result = run_echo(
        lib,
        a=Ratio(0.5),
        d=np.float32(0.25),
        n=Level.HIGH,
        u=np.uint32(2**32 - 1),
        s=np.int16(-2),
        q=np.int64(-(1 << 40)),
        flag=np.True_,
    )
    assert result[:7] == [0.5, 0.25, 7, 2**32 - 1, -2, -(1 << 40), 7]
    assert result[10] == 1
    assert run_echo(lib, a=np.float64(0.75))[0] == 0.75  # a float's value, as C converts it


@pytest.mark.parametrize(
    "name, value, message",
    [
        ("n", 4.0, r"parameter 3 of kernel 'echo' \(\.u32: an integer.*cannot take float 4\.0"),
        ("n", np.float32(4), r"parameter 3 .*cannot take float32"),
        ("u", 1 + 0j, r"parameter 4 .*cannot take complex"),
        ("a", True, r"parameter 1 .*a bool is not converted to a floating-point parameter"),
        ("d", np.False_, r"parameter 2 .*a bool is not converted"),
        ("d", 1j, r"parameter 2 .*cannot take complex"),
        ("p", 3, r"parameter 10 .*struct of 8 bytes; pass a ctypes structure or a NumPy scalar"),
        ("c", 1.0, r"parameter 7 .*struct of 8 bytes"),
        ("flag", 0.0, r"parameter 9 .*\.u8: an integer.*cannot take float"),
    ],
)
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
        with pytest.raises(
            KernelArgumentError,
            match=r"DeviceArray on device 1 passed to a launch on device 0 needs "
            r"peer access: call cuctx\.Device\(0\)\.enable_peer_access\("
            r"cuctx\.Device\(1\)\)",
        ):
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


# -- array dtypes -------------------------------------------------------------------------

MISMATCH = (
    r"parameter 1 \(const float\* x\) of kernel 'add' takes float32 arrays, not a "
    r"DeviceArray of int32: the kernel would read its bytes as float\. Pass float32 "
    r"data, or let it through knowingly: arr\.view\(np\.float32\) for this launch, or "
    r"kernel\.set_dtypes\(x=np\.int32\) for every launch$"
)


def ints(n: int = 8) -> cuctx.DeviceArray:
    return cuctx.to_device(np.arange(n, dtype=np.int32))


def test_an_array_of_another_dtype_is_refused_on_every_path(lib):
    """An int32 array for a `const float*` would be read as floats (5 -> 7e-45)."""
    out, x = add_arrays()
    launcher = lib["add"][1, 8]
    launcher(out, x, 1.0, 8)
    launcher(out, x, 1.0, 8)  # the fast path from here on
    for _ in range(2):
        with pytest.raises(KernelArgumentError, match=MISMATCH):
            launcher(out, ints(), 5.0, 8)
        with pytest.raises(
            KernelArgumentError,
            match=r"parameter 0 \(float\* out\) .* not a DeviceArray of float64",
        ):
            launcher(cuctx.zeros(8, np.float64), x, 5.0, 8)
    assert out.to_host().tolist() == [k + 1.0 for k in range(8)]  # nothing more ran


def test_a_view_or_an_address_lets_another_dtype_through_for_one_launch(lib):
    out = cuctx.zeros(8, np.float32)
    lib["add"][1, 8](out, ints().view(np.float32), 0.0, 8)
    assert out.to_host().view(np.int32).tolist() == list(range(8))  # the bits, as meant
    lib["add"][1, 8](out, ints().ptr, 0.0, 8)  # an address is the caller's word: unchecked


class ForeignArray:
    """Another library's device array, seen only through the CUDA Array Interface."""

    def __init__(self, arr: cuctx.DeviceArray) -> None:
        self.arr = arr

    @property
    def __cuda_array_interface__(self) -> dict:
        return self.arr.__cuda_array_interface__


def test_other_libraries_arrays_are_checked_by_their_dtype(lib):
    out, x = add_arrays()
    launcher = lib["add"][1, 8]
    for _ in range(2):  # the checked path, then the fast path (which converts them alike)
        launcher(out, ForeignArray(x), 2.0, 8)
        with pytest.raises(
            KernelArgumentError,
            match=r"parameter 1 \(const float\* x\) .* not a ForeignArray of "
            r"int32",
        ):
            launcher(out, ForeignArray(ints()), 2.0, 8)
    assert out.to_host().tolist() == [k + 2.0 for k in range(8)]


class RawElements(ForeignArray):
    """Another library's array of a type NumPy lacks: its CUDA Array Interface gives only the
    element's size as a void typestr (PyTorch describes bfloat16 as '<V2', float8 as '|V1')."""

    def __init__(self, arr: cuctx.DeviceArray, typestr: str) -> None:
        super().__init__(arr)
        self.typestr = typestr

    @property
    def __cuda_array_interface__(self) -> dict:
        return {**self.arr.__cuda_array_interface__, "typestr": self.typestr}


RAW_SOURCE = r"""
struct __nv_bfloat16 { unsigned short bits; };
struct __nv_fp8_e4m3 { unsigned char bits; };
extern "C" __global__ void negate(__nv_bfloat16* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i].bits ^= 0x8000;
}
extern "C" __global__ void bump(__nv_fp8_e4m3* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i].bits += 1;
}
"""


def negate(grid, block, x, n):
    x.view(np.uint16, n)[:] ^= 0x8000


def bump(grid, block, x, n):
    x.view(np.uint8, n)[:] += 1


raw_lib = library_fixture(RAW_SOURCE, negate=negate, bump=bump)


def test_arrays_of_raw_elements_are_ordinary_arguments(raw_lib):
    """bfloat16 and float8 arrays of other libraries launch on every path, the race checker's
    bookkeeping ("checked") included, which needs only their bytes; the bfloat16 parameter
    takes them as the uint16 bits they are viewed as."""
    halves = cuctx.to_device(np.array([1, 2, 3, 0x8004], np.uint16))
    quarters = cuctx.to_device(np.array([1, 2, 3, 255], np.uint8))
    for _ in range(2):  # the checked path, then the fast path
        raw_lib["negate"][1, 4](RawElements(halves, "<V2"), 4)
        raw_lib["bump"][1, 4](RawElements(quarters, "|V1"), 4)
    assert halves.to_host().tolist() == [1, 2, 3, 0x8004]
    assert quarters.to_host().tolist() == [3, 4, 5, 1]


def test_set_dtypes_says_what_a_kernel_takes_for_every_launch(lib):
    kernel = lib["add"]
    out, x = add_arrays()
    launcher = kernel[1, 8]
    launcher(out, x, 0.0, 8)
    launcher(out, x, 0.0, 8)  # a fast path that lets float32 arrays through
    assert kernel.dtypes == (("float32",), ("float32",), None, None)
    kernel.set_dtypes(x=np.int32)
    assert kernel.dtypes == (("float32",), ("int32",), None, None)
    for _ in range(2):  # the fast path made before lets float32 through no more
        with pytest.raises(
            KernelArgumentError,
            match=r"parameter 1 \(const float\* x\) of kernel 'add' takes int32 "
            r"arrays \(kernel\.set_dtypes\), not a DeviceArray of float32\. "
            r"Pass int32 data, .* kernel\.set_dtypes\(x=np\.float32\)",
        ):
            launcher(out, x, 0.0, 8)
        launcher(out, ints(), 0.0, 8)
    assert out.to_host().view(np.int32).tolist() == list(range(8))
    kernel.set_dtypes({1: (np.int32, np.uint32)})
    launcher(out, cuctx.zeros(8, np.uint32), 0.0, 8)
    kernel.set_dtypes(x=None)  # any array
    for arr in (x, ints(), cuctx.zeros(8, np.float64), cuctx.zeros(32, np.uint8)):
        launcher(out, arr, 0.0, 8)
    assert kernel.dtypes == (("float32",), None, None, None)


@pytest.mark.parametrize(
    "given, error, message",
    [
        (
            {"n": np.int32},
            ValueError,
            r"parameter 3 of kernel 'add' \(int n\) is not a pointer: set_dtypes is for the arrays",
        ),
        (
            {"y": np.int32},
            ValueError,
            r"kernel 'add' has no parameter called 'y' \(its parameters: out, x, a, n\)",
        ),
        ({7: None}, ValueError, r"kernel 'add' has parameters 0 to 3, not 7"),
        (
            {"x": "no such type"},
            TypeError,
            r"set_dtypes: 'no such type' for parameter 1 is not a dtype",
        ),
    ],
)
def test_set_dtypes_refuses_what_it_cannot_mean(lib, given, error, message):
    with pytest.raises(error, match=message):
        lib["add"].set_dtypes(
            {k: v for k, v in given.items() if isinstance(k, int)},
            **{k: v for k, v in given.items() if isinstance(k, str)},
        )
    assert lib["add"].dtypes == (("float32",), ("float32",), None, None)  # unchanged


def test_without_source_arrays_are_unchecked_unless_set_dtypes_says(backend):
    """PTX keeps no pointee type (a pointer is a .u64): a library loaded from PTX or a cubin
    checks only what set_dtypes says, by index."""
    image = compile_source(ADD_SOURCE, arch="compute_90", cache_dir=False).image
    kernel = cuctx.Library.from_bytes(image, sim_kernels={"add": add})["add"]
    assert kernel.dtypes == (None, None, None, None)
    with cuctx.Device(0):
        out = cuctx.zeros(8, np.float32)
        kernel[1, 8](out, ints(), 0.0, 8)  # unchecked: its bits
        kernel.set_dtypes({1: np.float32})
        with pytest.raises(
            KernelArgumentError,
            match=r"parameter 1 of kernel 'add' takes float32 arrays "
            r"\(kernel\.set_dtypes\), not a DeviceArray of int32\. .*"
            r"kernel\.set_dtypes\(\{1: np\.int32\}\) for every launch",
        ):
            kernel[1, 8](out, ints(), 0.0, 8)
        with pytest.raises(ValueError, match=r"parameter 2 of kernel 'add' \(4 bytes\) is not"):
            kernel.set_dtypes({2: np.float32})


def test_graph_kernel_nodes_and_autograph_calls_check_dtypes(lib):
    """The same plans check them: nothing is added to a graph or recorded for a refused
    array."""
    out, x = add_arrays()
    g = cuctx.Graph()
    with pytest.raises(KernelArgumentError, match=MISMATCH):
        g.launch(lib["add"], 1, 8, out, ints(), 1.0, 8)
    assert g.nodes == ()
    g.launch(lib["add"], 1, 8, out, x, 1.0, 8)
    g.instantiate().launch()
    kernel = lib["add"]

    @cuctx.autograph
    def step(out, x):
        kernel[1, 8](out, x, 1.0, 8)

    for _ in range(3):  # eager, then from a graph where that pays
        step(out, x)
    with pytest.raises(KernelArgumentError, match=MISMATCH):
        step(out, ints())
    step(out, x)
    assert out.to_host().tolist() == [k + 1.0 for k in range(8)]


SPELLINGS_SOURCE = r"""
typedef long long int64_t;
typedef unsigned int uint32_t;
typedef unsigned char uint8_t;
typedef signed char int8_t;
struct __half { unsigned short bits; };
struct __nv_bfloat16 { unsigned short bits; };
typedef float2 cuFloatComplex;
typedef double2 cuDoubleComplex;
namespace std { enum class byte : unsigned char {}; }
namespace cuda { namespace std { template <class T> struct complex { T re, im; }; } }
struct Particle { float x, y, z, m; };
typedef float real;
using index_t = unsigned long long;
#ifdef USE_DOUBLE
typedef double maybe_real;
#else
typedef float maybe_real;
#endif

extern "C" __global__ void spellings(%s) {}

template <typename T, int N>
__global__ void __launch_bounds__(256) scale(T* out, const T* in, T a) {}
"""
F32, I64, U64, C64, C128 = (
    ("float32",),
    ("int64",),
    ("uint64",),
    ("float32", "complex64"),
    ("float64", "complex128"),
)
# Each C spelling docs/kernels.md lists, with what it takes (None: any array; an alias with
# two meanings, one per #if branch, is unknown).
SPELLINGS = [
    ("float* {}", F32),
    ("const float* {}", F32),
    ("float* __restrict__ {}", F32),
    ("const float* __restrict__ {}", F32),
    ("float const* {}", F32),
    ("float* const {}", F32),
    ("float {}[]", F32),
    ("volatile float* {}", F32),
    ("real* {}", F32),
    ("double* {}", ("float64",)),
    ("__half* {}", ("float16",)),
    ("bool* {}", ("bool",)),
    ("int* {}", ("int32",)),
    ("const int* {}", ("int32",)),
    ("signed* {}", ("int32",)),
    ("unsigned* {}", ("uint32",)),
    ("unsigned int* {}", ("uint32",)),
    ("uint32_t* {}", ("uint32",)),
    ("short* {}", ("int16",)),
    ("unsigned short* {}", ("uint16",)),
    ("long long* {}", I64),
    ("int64_t* {}", I64),
    ("unsigned long long* {}", U64),
    ("size_t* {}", U64),
    ("const index_t* {}", U64),
    ("long* {}", (np.dtype("long").name,)),
    ("__nv_bfloat16* {}", ("uint16", "bfloat16")),
    ("float2* {}", C64),
    ("float4* {}", C64),
    ("cuFloatComplex* {}", C64),
    ("cuda::std::complex<float>* {}", C64),
    ("double2* {}", C128),
    ("cuDoubleComplex* {}", C128),
    ("float3* {}", F32),
    ("int4* {}", ("int32",)),
    ("uint2* {}", ("uint32",)),
    ("longlong2* {}", I64),
    ("float** {}", ("uint64", "int64")),
    ("void* {}", None),
    ("char* {}", None),
    ("unsigned char* {}", None),
    ("signed char* {}", None),
    ("uint8_t* {}", None),
    ("int8_t* {}", None),
    ("std::byte* {}", None),
    ("uchar4* {}", None),
    ("Particle* {}", None),
    ("maybe_real* {}", None),
    ("float {}", None),
    ("int {}", None),
]


def test_each_c_spelling_takes_its_dtypes(backend):
    params = ", ".join(spelling.format(f"p{i}") for i, (spelling, _) in enumerate(SPELLINGS))
    lib = cuctx.Library.from_source(
        SPELLINGS_SOURCE % params, name_expressions=["scale<float, 4>", "scale<double, 2>"]
    )
    got = dict(zip((s for s, _ in SPELLINGS), lib["spellings"].dtypes))
    assert got == dict(SPELLINGS)
    # A template's parameters take its name expression's arguments (__launch_bounds__ aside).
    assert lib["scale<float, 4>"].dtypes == (F32, F32, None)
    assert lib["scale<double, 2>"].dtypes == (("float64",),) * 2 + (None,)


def test_a_template_kernel_names_its_instance_type(backend):
    source = r"""
template <typename T> __global__ void fill(T* out, T value) { out[threadIdx.x] = value; }
"""

    def fill(grid, block, out, value):
        out.view(np.float64 if isinstance(value, float) else np.int64, block[0])[:] = value

    lib = cuctx.Library.from_source(
        source,
        name_expressions=["fill<double>", "fill<long long>"],
        sim_kernels={"fill<double>": fill, "fill<long long>": fill},
    )
    with cuctx.Device(0):
        out = cuctx.zeros(4, np.float64)
        lib["fill<double>"][1, 4](out, 2.5)
        with pytest.raises(
            KernelArgumentError,
            match=r"parameter 0 \(double\* out\) of kernel '_Z4fillIdEvPT_S0_' "
            r"takes float64 arrays, not a DeviceArray of float32",
        ):
            lib["fill<double>"][1, 4](cuctx.zeros(4, np.float32), 2.5)
        assert out.to_host().tolist() == [2.5] * 4
        # int64 is two NumPy dtype objects ('l' and 'q'): each passes, on every path.
        launcher = lib["fill<long long>"][1, 4]
        longs = [cuctx.zeros(4, np.dtype(code)) for code in "lqlq"]
        for k, arr in enumerate(longs):
            launcher(arr, k)
        assert [arr.to_host().tolist() for arr in longs] == [[k] * 4 for k in range(4)]


def test_a_gpu_kernel_refuses_an_array_of_another_dtype(gpu):
    """On a real compiled kernel: refused before the driver sees it; the view launches and
    the kernel reads the integers' bits."""
    kernel = cuctx.Library.from_source(ADD_SOURCE)["add"]
    with cuctx.Device(0):
        out = cuctx.zeros(8, np.float32)
        launcher = kernel[1, 8]
        for _ in range(2):
            with pytest.raises(KernelArgumentError, match=MISMATCH):
                launcher(out, ints(), 0.0, 8)
        launcher(out, ints().view(np.float32), 0.0, 8)
        assert out.to_host().view(np.int32).tolist() == list(range(8))


def test_torch_tensors_are_checked_by_their_dtype(gpu):
    """torch's dtypes by name, bfloat16 included (NumPy has none)."""
    torch = pytest.importorskip("torch")
    source = (
        ADD_SOURCE
        + r"""
struct __nv_bfloat16 { unsigned short bits; };
extern "C" __global__ void halve(__nv_bfloat16* p) {}
"""
    )
    lib = cuctx.Library.from_source(source)
    with cuctx.Device(0):
        out = torch.zeros(8, device="cuda")
        x = torch.arange(8, dtype=torch.int32, device="cuda")
        torch.cuda.synchronize()
        with pytest.raises(
            KernelArgumentError,
            match=r"parameter 1 \(const float\* x\) .* not a Tensor of int32: .*"
            r"tensor\.view\(torch\.float32\) for this launch",
        ):
            lib["add"][1, 8](out, x, 0.0, 8)
        lib["add"][1, 8](out, x.view(torch.float32), 0.0, 8)
        cuctx.synchronize()
        assert out.view(torch.int32).tolist() == list(range(8))
        lib["halve"][1, 1](torch.zeros(4, dtype=torch.bfloat16, device="cuda"))
        with pytest.raises(
            KernelArgumentError,
            match=r"takes uint16 or bfloat16 arrays, not a Tensor of float16: .* "
            r"Pass bfloat16 data, .* tensor\.view\(torch\.bfloat16\)",
        ):
            lib["halve"][1, 1](torch.zeros(4, dtype=torch.float16, device="cuda"))
