"""Kernel layouts read from real NVRTC output, checked against the C ABI.

ctypes lays structs out with the host C ABI, which for the types used here
is the layout the CUDA kernel-parameter ABI prescribes, so it serves as an
independent oracle for the offsets and sizes parsed from cubins and PTX.
"""

from __future__ import annotations

import ctypes
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import NVRTC_MISSING, requires_nvrtc
from cuctx.devcode._elf import read_kernels
from cuctx.devcode._image import kernel_layouts
from cuctx.devcode._kinds import is_cubin, is_fatbin, is_ptx
from cuctx.devcode._layout import KernelInfo, Param
from cuctx.devcode._ptx import ptx_kernels, ptx_layouts
from cuctx.kernels._compiler import compile_source


MIXED_SRC = r"""
struct S12 { float a; int b; short c; };
extern "C" __global__ void mixed(char c, int i, double d, float* p, S12 s,
                                 short h, long long q, float f) {
    if (p) p[0] = c + i + d + s.a + h + q + f;
}
extern "C" __global__ void noparams() {}
extern "C" __global__ void unused(int a, int b, float* p) {}
struct Big { double d[1000]; };
extern "C" __global__ void big(int x, Big b, double* out) { out[0] = b.d[threadIdx.x] + x; }
// 20000 bytes does not fit the 14-bit size field of EIATTR_KPARAM_INFO.
struct Huge { char c[20000]; };
extern "C" __global__ void huge(Huge h, char* out) { out[0] = h.c[threadIdx.x]; }
template <typename T> __global__ void axpy(T a, T* x, T* y) {
    y[threadIdx.x] += a * x[threadIdx.x];
}
"""


class S12(ctypes.Structure):
    _fields_ = [("a", ctypes.c_float), ("b", ctypes.c_int), ("c", ctypes.c_short)]


class Big(ctypes.Structure):
    _fields_ = [("d", ctypes.c_double * 1000)]


class Huge(ctypes.Structure):
    _fields_ = [("c", ctypes.c_char * 20000)]


def c_abi_layout(*ctypes_types) -> tuple[tuple[Param, ...], int]:
    """Params and parameter-space size of a kernel taking these types, by the C ABI."""
    fields = [(f"p{i}", t) for i, t in enumerate(ctypes_types)]
    struct_type = type("Params", (ctypes.Structure,), {"_fields_": fields})
    params = tuple(
        Param(i, getattr(struct_type, name).offset, ctypes.sizeof(t))
        for i, (name, t) in enumerate(fields)
    )
    end = params[-1].offset + params[-1].size if params else 0
    return params, end


@pytest.fixture(scope="module")
def cubin() -> bytes:
    if NVRTC_MISSING is not None:
        pytest.skip(f"NVRTC cannot be loaded: {NVRTC_MISSING}")
    result = compile_source(
        MIXED_SRC, arch="sm_90", name_expressions=["axpy<float>"], cache_dir=False
    )
    return result.image


@pytest.fixture(scope="module")
def ptx() -> bytes:
    if NVRTC_MISSING is not None:
        pytest.skip(f"NVRTC cannot be loaded: {NVRTC_MISSING}")
    return compile_source(
        MIXED_SRC, arch="compute_90", name_expressions=["axpy<float>"], cache_dir=False
    ).image


def section(image: bytes, wanted: str) -> tuple[int, int]:
    """(file offset, size) of a named section, located independently of the reader."""
    shoff = struct.unpack_from("<Q", image, 0x28)[0]
    shnum, shstrndx = struct.unpack_from("<HH", image, 0x3C)
    headers = [struct.unpack_from("<IIQQQQIIQQ", image, shoff + 64 * i) for i in range(shnum)]
    strtab_off = headers[shstrndx][4]
    for h in headers:
        name_start = strtab_off + h[0]
        name = image[name_start : image.index(b"\0", name_start)].decode()
        if name == wanted:
            return h[4], h[5]
    raise KeyError(wanted)


def records(image: bytes, kernel: str) -> list[tuple[int, int, int]]:
    """(absolute offset, format, attribute) of each .nv.info.<kernel> record."""
    off, size = section(image, f".nv.info.{kernel}")
    out, pos = [], off
    while pos < off + size:
        fmt, attr, value = struct.unpack_from("<BBH", image, pos)
        out.append((pos, fmt, attr))
        pos += 4 + (value if fmt == 4 else 0)
    return out


# -------------------------------------------------------------- real layouts


def test_mixed_scalar_struct_and_pointer_params_match_c_abi(cubin):
    params, end = c_abi_layout(
        ctypes.c_char,
        ctypes.c_int,
        ctypes.c_double,
        ctypes.c_void_p,
        S12,
        ctypes.c_short,
        ctypes.c_longlong,
        ctypes.c_float,
    )
    info = read_kernels(cubin)["mixed"]
    assert info == KernelInfo("mixed", params, end)
    # The 12-byte struct is 4-aligned right after the 8-byte pointer.
    assert info.params[4] == Param(4, 24, 12)
    assert info.param_size == 52


def test_kernel_without_params(cubin):
    assert read_kernels(cubin)["noparams"] == KernelInfo("noparams", (), 0)


def test_unused_params_are_still_described(cubin):
    params, end = c_abi_layout(ctypes.c_int, ctypes.c_int, ctypes.c_void_p)
    assert read_kernels(cubin)["unused"] == KernelInfo("unused", params, end)


def test_only_entry_functions_are_reported(cubin):
    assert set(read_kernels(cubin)) == {
        "mixed",
        "noparams",
        "unused",
        "big",
        "huge",
        "_Z4axpyIfEvT_PS0_S1_",
    }


def test_template_instantiation_layout(cubin):
    params, end = c_abi_layout(ctypes.c_float, ctypes.c_void_p, ctypes.c_void_p)
    assert read_kernels(cubin)["_Z4axpyIfEvT_PS0_S1_"].params == params
    assert read_kernels(cubin)["_Z4axpyIfEvT_PS0_S1_"].param_size == end


def test_parameter_space_over_4k(cubin):
    params, end = c_abi_layout(ctypes.c_int, Big, ctypes.c_void_p)
    assert read_kernels(cubin)["big"] == KernelInfo("big", params, end)
    assert end == 8016
    params, end = c_abi_layout(Huge, ctypes.c_void_p)
    assert read_kernels(cubin)["huge"] == KernelInfo("huge", params, end)
    assert params[0].size == 20000


def test_kparam_info_v2_records_give_the_same_layout(cubin):
    # Rewrite every V1 record of a kernel into the V2 encoding in place (both
    # have 12-byte payloads); whichever the toolchain emits, both must parse.
    image = bytearray(cubin)
    for pos, _, attr in records(cubin, "mixed"):
        if attr == 0x17:
            index, ordinal, offset, flags = struct.unpack_from("<IHHI", cubin, pos + 4)
            struct.pack_into(
                "<BBHIHHHH", image, pos, 4, 0x45, 12, index, ordinal, offset, flags >> 18, 0
            )
    assert {attr for _, _, attr in records(bytes(image), "mixed")} >= {0x45}
    assert read_kernels(bytes(image))["mixed"] == read_kernels(cubin)["mixed"]


@requires_nvrtc
def test_many_params_of_every_width():
    ctypes_cycle = [
        ctypes.c_char,
        ctypes.c_short,
        ctypes.c_int,
        ctypes.c_longlong,
        ctypes.c_double,
        ctypes.c_void_p,
    ]
    c_names = ["char", "short", "int", "long long", "double", "float*"]
    count = 60
    types = [ctypes_cycle[i % 6] for i in range(count)]
    decl = ", ".join(f"{c_names[i % 6]} a{i}" for i in range(count))
    image = compile_source(
        f'extern "C" __global__ void wide({decl}) {{}}', arch="sm_90", cache_dir=False
    ).image
    params, end = c_abi_layout(*types)
    assert read_kernels(image)["wide"] == KernelInfo("wide", params, end)


@requires_nvrtc
@pytest.mark.parametrize("arch", ["sm_75", "sm_120"])
def test_layout_is_the_same_on_other_architectures(arch):
    image = compile_source(MIXED_SRC, arch=arch, cache_dir=False).image
    on_arch = read_kernels(image)
    on_90 = read_kernels(compile_source(MIXED_SRC, arch="sm_90", cache_dir=False).image)
    assert on_arch["mixed"] == on_90["mixed"]
    assert on_arch["big"] == on_90["big"]


# ---------------------------------------------------------------------- PTX


def test_ptx_layouts_agree_with_cubin(cubin, ptx):
    assert ptx_layouts(ptx) == read_kernels(cubin)


def test_ptx_kernels_lists_sizes(ptx):
    sizes = ptx_kernels(ptx)
    assert sizes["mixed"] == [1, 4, 8, 8, 12, 2, 8, 4]
    assert sizes["noparams"] == []
    assert sizes["big"] == [4, 8000, 8]
    assert sizes["huge"] == [20000, 8]


def test_ptx_pointer_annotations_and_comments():
    text = """
    .version 8.0
    .target sm_90
    .address_size 64
    // .entry commented_out(.param .u32 x)
    .visible .entry annotated(
        .param .u8 a, /* trailing comment */
        .param .u64 .ptr .global .align 16 p,
        .param .align 8 .b8 s[24],
        .param .f16 h
    )
    { ret; }
    .weak .entry bare
    { ret; }
    """
    assert ptx_layouts(text) == {
        "annotated": KernelInfo(
            "annotated", (Param(0, 0, 1), Param(1, 8, 8), Param(2, 16, 24), Param(3, 40, 2)), 42
        ),
        "bare": KernelInfo("bare", (), 0),
    }


@pytest.mark.parametrize(
    "decl, problem",
    [
        (".param .pred p", "type .pred"),
        (".param .align 3 .b8 s[4]", "alignment 3"),
        (".reg .u32 r", "parameter"),
    ],
)
def test_ptx_bad_parameter_is_a_value_error(decl, problem):
    with pytest.raises(ValueError, match=problem):
        ptx_layouts(f".version 8.0\n.target sm_90\n.entry k({decl})\n{{ ret; }}")


def test_ptx_layouts_rejects_binary():
    with pytest.raises(ValueError, match="not PTX"):
        ptx_layouts(b".version 8.0\0\x01binary")


# ----------------------------------------------------------------- sniffers


def test_sniffers_on_real_images(cubin, ptx):
    assert is_cubin(cubin) and not is_ptx(cubin) and not is_fatbin(cubin)
    assert is_ptx(ptx) and not is_cubin(ptx) and not is_fatbin(ptx)
    assert is_ptx(ptx.decode().rstrip("\0"))


def test_fatbin_magic():
    header = struct.pack("<IHHQ", 0xBA55ED50, 1, 16, 0)
    assert is_fatbin(header)
    assert (
        not is_fatbin(struct.pack("<I", 0x50ED55BA)) and not is_cubin(header) and not is_ptx(header)
    )


@pytest.mark.parametrize(
    "data", [b"", b"\x7fEL", b"\x7fELF" + b"\0" * 60, b"hello", b".version 8.0\n"]
)
def test_sniffers_reject_other_data(data):
    assert not is_cubin(data) and not is_fatbin(data) and not is_ptx(data)


def test_kernel_layouts_dispatches_on_content(cubin, ptx):
    assert kernel_layouts(cubin) == read_kernels(cubin)
    assert kernel_layouts(ptx) == ptx_layouts(ptx)
    assert kernel_layouts(ptx.decode()) == ptx_layouts(ptx)
    with pytest.raises(ValueError, match="fatbin"):
        kernel_layouts(struct.pack("<IHHQ", 0xBA55ED50, 1, 16, 0))
    with pytest.raises(ValueError, match="unrecognised"):
        kernel_layouts(b"\x00\x01\x02")


# -------------------------------------------------------- malformed cubins


def _patched(image: bytes, offset: int, new: bytes) -> bytes:
    return image[:offset] + new + image[offset + len(new) :]


def _first_kparam(image: bytes, kernel: str) -> int:
    return next(pos for pos, fmt, attr in records(image, kernel) if attr == 0x17)


def test_not_a_cubin(ptx):
    with pytest.raises(ValueError, match="not a cubin"):
        read_kernels(ptx)


def test_elf32_is_rejected(cubin):
    with pytest.raises(ValueError, match="ELF64"):
        read_kernels(_patched(cubin, 4, b"\x01"))


def test_unknown_record_format(cubin):
    pos = _first_kparam(cubin, "mixed")
    with pytest.raises(ValueError, match="unknown record format 0x9"):
        read_kernels(_patched(cubin, pos, b"\x09"))


def test_record_longer_than_its_section(cubin):
    pos = _first_kparam(cubin, "mixed")
    with pytest.raises(ValueError, match="claims 65535 bytes"):
        read_kernels(_patched(cubin, pos + 2, struct.pack("<H", 0xFFFF)))


def test_kparam_payload_of_wrong_size(cubin):
    # Shrink the record to 8 bytes and turn the 4 bytes left over into a
    # NVAL padding record, so only the payload size is wrong.
    pos = _first_kparam(cubin, "mixed")
    image = _patched(cubin, pos + 2, struct.pack("<H", 8))
    image = _patched(image, pos + 12, bytes([1, 1, 0, 0]))
    with pytest.raises(ValueError, match="EIATTR_KPARAM_INFO of 'mixed' has 8 bytes, expected 12"):
        read_kernels(image)


def test_duplicate_ordinal(cubin):
    kparams = [pos for pos, fmt, attr in records(cubin, "mixed") if attr == 0x17]
    ordinal = struct.unpack_from("<H", cubin, kparams[1] + 8)
    with pytest.raises(ValueError, match="twice"):
        read_kernels(_patched(cubin, kparams[0] + 8, struct.pack("<H", *ordinal)))


def test_ordinal_gap(cubin):
    pos = _first_kparam(cubin, "mixed")
    with pytest.raises(ValueError, match="not 0..n-1"):
        read_kernels(_patched(cubin, pos + 8, struct.pack("<H", 40)))


def test_param_beyond_param_cbank(cubin):
    pos = _first_kparam(cubin, "mixed")
    with pytest.raises(ValueError, match="EIATTR_PARAM_CBANK says 52"):
        read_kernels(_patched(cubin, pos + 10, struct.pack("<H", 0x4000)))


def test_missing_nv_info_section(cubin):
    strtab_off, strtab_size = section(cubin, ".shstrtab")
    at = cubin.index(b".nv.info.mixed\0", strtab_off, strtab_off + strtab_size)
    with pytest.raises(ValueError, match=r"'mixed' has no \.nv\.info\.mixed"):
        read_kernels(_patched(cubin, at, b".nv.info.MIXED"))


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_any_truncation_is_a_value_error(cubin, data):
    cut = data.draw(st.integers(0, len(cubin) - 1))
    with pytest.raises(ValueError):
        read_kernels(cubin[:cut])


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_corrupted_bytes_never_leak_low_level_errors(cubin, data):
    image = bytearray(cubin)
    for _ in range(data.draw(st.integers(1, 8))):
        image[data.draw(st.integers(0, len(image) - 1))] = data.draw(st.integers(0, 255))
    try:
        kernels = read_kernels(bytes(image))
    except ValueError:
        return
    assert all(isinstance(k, KernelInfo) for k in kernels.values())


def test_param_dataclasses_are_immutable(cubin):
    info = read_kernels(cubin)["mixed"]
    with pytest.raises(AttributeError):
        info.param_size = 0  # type: ignore[misc]
    assert isinstance(info.params, tuple)
