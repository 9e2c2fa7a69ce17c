"""NVRTC compilation and the persistent compile cache."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
import warnings
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import cuctx.kernels._compile_cache as cache_format
import cuctx.kernels._compiler as compiler
from conftest import requires_nvrtc
from scenarios import child_env
from cuctx.devcode._elf import read_kernels
from cuctx.devcode._kinds import is_cubin, is_ptx
from cuctx.kernels._compiler import (
    CacheWarning,
    CompileError,
    CompileResult,
    cache_directory,
    compile_source,
    nvrtc_supported_archs,
    pick_arch,
)


SRC = r"""
extern "C" __global__ void scale(float* x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= a;
}
"""

TEMPLATE_SRC = r"""
template <typename T> __global__ void axpy(T a, T* x, T* y) {
    y[threadIdx.x] += a * x[threadIdx.x];
}
"""


@pytest.fixture(autouse=True)
def isolated_cache_env(tmp_path, monkeypatch):
    """Keep every test away from the real user cache, even on the default path."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("CUCTX_CACHE_DIR", raising=False)


@pytest.fixture
def cache(tmp_path) -> Path:
    return tmp_path / "cache"


@pytest.fixture
def nvrtc_calls(monkeypatch):
    """Count nvrtcCompileProgram calls."""
    from cuda.bindings import nvrtc

    calls = []
    real = nvrtc.nvrtcCompileProgram

    def counting(*args):
        calls.append(args)
        return real(*args)

    monkeypatch.setattr(nvrtc, "nvrtcCompileProgram", counting)
    return calls


def entries(directory: Path) -> list[Path]:
    return sorted(directory.iterdir())


# ------------------------------------------------------------------ compiling


@requires_nvrtc
def test_cubin_compile(cache):
    result = compile_source(SRC, arch="sm_90", cache_dir=cache)
    assert result.kind == "cubin" and result.arch == "sm_90" and not result.from_cache
    assert is_cubin(result.image)
    assert [p.size for p in read_kernels(result.image)["scale"].params] == [8, 4, 4]
    assert result.lowered_names == {}
    assert isinstance(result.log, str) and "\0" not in result.log


@requires_nvrtc
def test_a_cubin_comes_with_the_ptx_of_the_same_program(cache):
    """The PTX carries the parameter types a cubin does not record; the cache keeps it."""
    first = compile_source(SRC, arch="sm_90", cache_dir=cache)
    assert first.ptx is not None and is_ptx(first.ptx) and b".entry scale(" in first.ptx
    again = compile_source(SRC, arch="sm_90", cache_dir=cache)
    assert again.from_cache and again.ptx == first.ptx
    ptx = compile_source(SRC, arch="compute_90", cache_dir=cache)
    assert ptx.ptx == ptx.image


@requires_nvrtc
def test_reading_a_one_byte_log_leaves_shared_bytes_intact():
    # An empty log is one NUL byte; writing it into CPython's cached
    # one-byte b" " object used to turn every b" " into b"\0".
    result = compile_source(SRC, arch="sm_90", cache_dir=False)
    assert result.log == ""
    assert bytes([0x20])[0] == 0x20
    assert "a b".encode() == b"a\x20b"


@requires_nvrtc
def test_ptx_compile_keeps_nul_terminator(cache):
    result = compile_source(SRC, arch="compute_90", cache_dir=cache)
    assert result.kind == "ptx"
    assert result.image.endswith(b"\0")
    assert is_ptx(result.image)
    assert b".target sm_90" in result.image and b".entry scale(" in result.image


@requires_nvrtc
def test_str_and_bytes_options_are_equivalent(cache, nvrtc_calls):
    first = compile_source(
        SRC, arch="sm_90", options=["-lineinfo", "--use_fast_math"], cache_dir=cache
    )
    second = compile_source(
        SRC, arch="sm_90", options=[b"-lineinfo", b"--use_fast_math"], cache_dir=cache
    )
    assert second.from_cache and second.image == first.image
    assert len(nvrtc_calls) == 1
    assert nvrtc_calls[0][2] == [b"--gpu-architecture=sm_90", b"-lineinfo", b"--use_fast_math"]


@requires_nvrtc
def test_template_name_expressions_resolve_to_kernels(cache):
    result = compile_source(
        TEMPLATE_SRC,
        arch="sm_90",
        name_expressions=["axpy<float>", "axpy<double>"],
        cache_dir=cache,
    )
    assert result.lowered_names == {
        "axpy<float>": "_Z4axpyIfEvT_PS0_S1_",
        "axpy<double>": "_Z4axpyIdEvT_PS0_S1_",
    }
    assert set(read_kernels(result.image)) == set(result.lowered_names.values())
    again = compile_source(
        TEMPLATE_SRC,
        arch="sm_90",
        name_expressions=["axpy<float>", "axpy<double>"],
        cache_dir=cache,
    )
    assert again.from_cache and again.lowered_names == result.lowered_names


@requires_nvrtc
def test_headers_are_used_by_include(cache):
    src = '#include "kname.h"\nextern "C" __global__ void KNAME(int* p) { p[0] = VALUE; }\n'
    foo = compile_source(
        src,
        arch="sm_90",
        headers={"kname.h": "#define KNAME foo\n#define VALUE 1\n"},
        cache_dir=cache,
    )
    bar = compile_source(
        src,
        arch="sm_90",
        headers={"kname.h": b"#define KNAME bar\n#define VALUE 2\n"},
        cache_dir=cache,
    )
    assert set(read_kernels(foo.image)) == {"foo"}
    assert set(read_kernels(bar.image)) == {"bar"} and not bar.from_cache


@requires_nvrtc
def test_missing_header_is_a_compile_error(cache):
    with pytest.raises(CompileError, match='cannot open source file "absent.h"'):
        compile_source('#include "absent.h"\n', arch="sm_90", cache_dir=cache)


@requires_nvrtc
def test_compile_error_carries_full_log(cache):
    src = "__global__ void broken(int x) {\n  undefined_thing(x);\n}\n"
    with pytest.raises(CompileError) as info:
        compile_source(src, arch="sm_90", options=["-lineinfo"], name="broken.cu", cache_dir=cache)
    err = info.value
    assert 'broken.cu(2): error: identifier "undefined_thing" is undefined' in err.log
    assert "1 error detected" in err.log
    assert err.log in str(err)
    assert err.options == ("--gpu-architecture=sm_90", "-lineinfo")
    assert err.name == "broken.cu"
    assert not cache.exists() or entries(cache) == []


@requires_nvrtc
def test_invalid_option_is_a_compile_error(cache):
    with pytest.raises(CompileError) as info:
        compile_source(SRC, arch="sm_90", options=["--no-such-flag"], cache_dir=cache)
    assert "--no-such-flag" in info.value.log
    assert "NVRTC_ERROR_INVALID_OPTION" in str(info.value)


@requires_nvrtc
def test_invalid_name_expression_is_a_compile_error(cache):
    with pytest.raises(CompileError, match="not_a_kernel<int>"):
        compile_source(
            TEMPLATE_SRC, arch="sm_90", name_expressions=["not_a_kernel<int>"], cache_dir=cache
        )


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"options": "-lineinfo"}, TypeError, "not a single string"),
        ({"options": [3]}, TypeError, "option must be str or bytes, got int"),
        ({"options": ["-arch=sm_80"]}, ValueError, "through arch="),
        ({"options": ["--gpu-architecture=compute_80"]}, ValueError, "through arch="),
        ({"name_expressions": "axpy<float>"}, TypeError, "not a single string"),
        ({"name_expressions": [b"axpy<float>"]}, TypeError, "name expression must be str"),
        ({"headers": {1: "x"}}, TypeError, "header names must be str"),
        ({"headers": {"a.h": 1}}, TypeError, "header 'a.h' must be str or bytes"),
        ({"headers": [("a.h", "x")]}, TypeError, "headers must be a dict"),
        ({"arch": "sm90"}, ValueError, "arch must look like"),
        ({"arch": "90"}, ValueError, "arch must look like"),
        ({"cache_dir": 5}, TypeError, "cache_dir must be a path"),
    ],
)
def test_argument_validation(kwargs, error, message, cache):
    kwargs = {"arch": "sm_90", "cache_dir": cache, **kwargs}
    with pytest.raises(error, match=message):
        compile_source(SRC, **kwargs)


def test_source_must_be_str():
    with pytest.raises(TypeError, match="C\\+\\+ source must be str"):
        compile_source(SRC.encode(), arch="sm_90", cache_dir=False)


# ---------------------------------------------------------------- pick_arch


@pytest.mark.parametrize(
    "capabilities, supported, expected",
    [
        ([(9, 0)], [75, 80, 90], "sm_90"),
        ([(9, 0), (9, 0)], [75, 80, 90], "sm_90"),
        ([(9, 0), (8, 0)], [75, 80, 90], "compute_80"),
        ([(8, 6), (9, 0)], [75, 80, 86, 90], "compute_86"),
        ([(12, 1)], [75, 80, 90, 100, 120, 121], "sm_121"),
        # A device newer than NVRTC knows: PTX it can JIT forward.
        ([(13, 0)], [75, 90, 120, 121], "compute_121"),
        # Lowest device between supported targets: the nearest one below.
        ([(8, 7), (9, 0)], [75, 80, 90], "compute_80"),
    ],
)
def test_pick_arch(capabilities, supported, expected):
    assert pick_arch(capabilities, supported) == expected


def test_pick_arch_device_too_old_for_nvrtc():
    with pytest.raises(ValueError, match="none of which can run on compute capability 7.0"):
        pick_arch([(7, 0), (9, 0)], [75, 80, 90])


def test_pick_arch_needs_devices():
    with pytest.raises(ValueError, match="at least one"):
        pick_arch([], [90])


@requires_nvrtc
def test_pick_arch_queries_nvrtc_by_default():
    assert 90 in nvrtc_supported_archs()
    assert pick_arch([(9, 0)]) == "sm_90"


# -------------------------------------------------------------------- cache


@requires_nvrtc
def test_second_compile_is_served_from_cache_without_nvrtc(cache, monkeypatch):
    first = compile_source(SRC, arch="sm_90", cache_dir=cache)
    from cuda.bindings import nvrtc

    def forbidden(*args):
        raise AssertionError("NVRTC must not run on a cache hit")

    monkeypatch.setattr(nvrtc, "nvrtcCompileProgram", forbidden)
    monkeypatch.setattr(nvrtc, "nvrtcCreateProgram", forbidden)
    second = compile_source(SRC, arch="sm_90", cache_dir=cache)
    assert second.from_cache
    assert replace(second, from_cache=False) == first
    [entry] = entries(cache)
    assert entry.name.startswith("nvrtc-") and entry.name.endswith(".bin")


@requires_nvrtc
@pytest.mark.parametrize(
    "change",
    [
        {"options": ["-lineinfo"]},
        {"arch": "sm_80"},
        {"arch": "compute_90"},
        {"headers": {"unused.h": "// different"}},
        {"name_expressions": ["scale"]},
        {"name": "other.cu"},
        {"src": SRC + "\n// edited\n"},
    ],
)
def test_any_input_change_misses_the_cache(cache, nvrtc_calls, change):
    base = {"src": SRC, "arch": "sm_90", "headers": {"unused.h": "// base"}}
    compile_source(**base, cache_dir=cache)
    changed = compile_source(**{**base, **change}, cache_dir=cache)
    assert not changed.from_cache
    assert len(nvrtc_calls) == 2
    assert compile_source(**{**base, **change}, cache_dir=cache).from_cache
    assert len(entries(cache)) == 2


@requires_nvrtc
def test_nvrtc_version_is_part_of_the_key(cache, monkeypatch):
    compile_source(SRC, arch="sm_90", cache_dir=cache)
    real = compiler.nvrtc_version()
    monkeypatch.setattr(compiler, "nvrtc_version", lambda: (real[0], real[1] + 1))
    assert not compile_source(SRC, arch="sm_90", cache_dir=cache).from_cache


def _damage_truncate(data: bytes) -> bytes:
    return data[: len(data) // 2]


def _damage_flip_payload(data: bytes) -> bytes:
    return data[:-10] + bytes([data[-10] ^ 0x40]) + data[-9:]


def _damage_flip_magic(data: bytes) -> bytes:
    return b"X" + data[1:]


def _damage_empty(data: bytes) -> bytes:
    return b""


@requires_nvrtc
@pytest.mark.parametrize(
    "damage", [_damage_truncate, _damage_flip_payload, _damage_flip_magic, _damage_empty]
)
def test_corrupt_entry_is_rebuilt(cache, damage):
    good = compile_source(SRC, arch="sm_90", cache_dir=cache)
    [entry] = entries(cache)
    entry.write_bytes(damage(entry.read_bytes()))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rebuilt = compile_source(SRC, arch="sm_90", cache_dir=cache)
    assert not rebuilt.from_cache
    assert rebuilt.image == good.image
    assert compile_source(SRC, arch="sm_90", cache_dir=cache).from_cache


@pytest.mark.parametrize("ptx", [None, b".version 9.0\n.target sm_90\n\0", b"\x7fELF image"])
def test_entry_round_trip(ptx):
    """With its PTX beside the cubin, without any, or with the image itself as the PTX."""
    result = CompileResult(
        b"\x7fELF image", "cubin", "sm_90", {"f<int>": "_Z1fIiEvv"}, "a log", False, ptx
    )
    decoded = cache_format._decode_entry(cache_format._encode_entry("k" * 64, result), "k" * 64)
    assert decoded == replace(result, from_cache=True)


def test_entry_for_another_key_is_rejected():
    result = CompileResult(b"image", "ptx", "compute_90", {}, "", False)
    entry = cache_format._encode_entry("a" * 64, result)
    assert cache_format._decode_entry(entry, "b" * 64) is None


_ENTRY = cache_format._encode_entry(
    "k" * 64,
    CompileResult(
        b"\x7fELF" + bytes(range(256)),
        "cubin",
        "sm_90",
        {"a": "b"},
        "log",
        False,
        b".version 9.0\n.target sm_90\n.visible .entry a()\n{\n}\n\0",
    ),
)


@settings(max_examples=300, deadline=None)  # no timing in tests: CI machines are noisy
@given(cut=st.integers(0, len(_ENTRY) - 1))
def test_every_truncation_is_detected(cut):
    assert cache_format._decode_entry(_ENTRY[:cut], "k" * 64) is None


@settings(max_examples=500, deadline=None)
@given(pos=st.integers(0, len(_ENTRY) - 1), mask=st.integers(1, 255))
def test_every_single_byte_change_is_detected(pos, mask):
    damaged = bytearray(_ENTRY)
    damaged[pos] ^= mask
    assert cache_format._decode_entry(bytes(damaged), "k" * 64) is None


def _blob(data: bytes) -> bytes:
    return cache_format._BLOB_LEN.pack(len(data)) + data


def _meta(**fields) -> bytes:
    meta = {
        "key": "k" * 64,
        "kind": "cubin",
        "arch": "sm_90",
        "lowered_names": {},
        "log": "",
        "ptx": "none",
        "name": "k.cu",
        **fields,
    }
    return json.dumps(meta).encode()


def test_the_payload_helpers_make_a_valid_entry():
    payload = _blob(b"abc") + _blob(b"ptx") + _meta(ptx="blob")
    result = cache_format._decode_entry(_entry_with_payload(payload), "k" * 64)
    assert result is not None and (result.image, result.ptx) == (b"abc", b"ptx")


def _entry_with_payload(payload: bytes) -> bytes:
    """An entry whose header is consistent with an arbitrary payload."""
    header = cache_format._HEADER.pack(
        cache_format._MAGIC,
        cache_format.CACHE_FORMAT_VERSION,
        len(payload),
        hashlib.sha256(payload).digest(),
    )
    return header + payload


@pytest.mark.parametrize(
    "payload",
    [
        _blob(b"abc") + _blob(b"") + b"{not json",
        _blob(b"abc") + _blob(b"") + b'["a list"]',
        _blob(b"abc") + _blob(b"") + b'{"key": "' + b"k" * 64 + b'", "kind": "elf"}',
        cache_format._BLOB_LEN.pack(1000) + b"abc",
        _blob(b"abc") + cache_format._BLOB_LEN.pack(1000) + b"ptx",
        _blob(b"abc") + _blob(b"ptx") + _meta(ptx="none"),  # a PTX blob it says is not there
        _blob(b"abc") + _blob(b"") + _meta(ptx="elsewhere"),
        b"\x01",
    ],
)
def test_well_hashed_but_invalid_payloads_are_rejected(payload):
    assert cache_format._decode_entry(_entry_with_payload(payload), "k" * 64) is None


def test_concurrent_writers_never_expose_a_partial_entry(tmp_path):
    path = tmp_path / "entry.bin"
    key = "k" * 64
    results = [
        CompileResult(bytes([i]) * 200_000, "cubin", "sm_90", {"n": str(i)}, f"log {i}", False)
        for i in range(4)
    ]
    cache_format._store_entry(path, key, results[0])
    images = {r.image for r in results}
    stop = threading.Event()
    seen = []

    def write(result):
        for _ in range(25):
            cache_format._store_entry(path, key, result)

    def read():
        while not stop.is_set():
            seen.append(cache_format._load_entry(path, key))

    readers = [threading.Thread(target=read) for _ in range(3)]
    writers = [threading.Thread(target=write, args=(r,)) for r in results]
    for t in readers + writers:
        t.start()
    for t in writers:
        t.join()
    stop.set()
    for t in readers:
        t.join()
    assert seen and all(r is not None and r.image in images for r in seen)
    assert cache_format._load_entry(path, key).image in images
    assert [p.name for p in tmp_path.iterdir()] == ["entry.bin"]


_CHILD = """
import hashlib, sys
from cuctx.kernels._compiler import compile_source
result = compile_source(sys.argv[1], arch="sm_90", cache_dir=sys.argv[2])
print(hashlib.sha256(result.image).hexdigest(), result.from_cache)
"""


@requires_nvrtc
def test_concurrent_processes_share_one_valid_entry(cache):
    env = child_env()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _CHILD, SRC, str(cache)],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(6)
    ]
    outputs = [p.communicate(timeout=120)[0].split() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    digests = {digest for digest, _ in outputs}
    assert len(digests) == 1
    [entry] = entries(cache)
    final = compile_source(SRC, arch="sm_90", cache_dir=cache)
    assert final.from_cache and hashlib.sha256(final.image).hexdigest() in digests
    assert entries(cache) == [entry]


@requires_nvrtc
def test_unwritable_cache_dir_still_compiles_and_warns_once(tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the cache directory should be")
    with pytest.warns(CacheWarning, match="not writable") as record:
        first = compile_source(SRC, arch="sm_90", cache_dir=blocker / "cache")
        second = compile_source(SRC, arch="sm_90", cache_dir=blocker / "cache")
    assert len(record) == 1
    assert is_cubin(first.image) and first.image == second.image
    assert not first.from_cache and not second.from_cache


@requires_nvrtc
@pytest.mark.skipif(
    hasattr(os, "geteuid") and os.geteuid() == 0, reason="root ignores directory permissions"
)
def test_read_only_cache_dir_still_compiles(cache):
    cache.mkdir()
    cache.chmod(0o500)
    try:
        with pytest.warns(CacheWarning):
            result = compile_source(SRC, arch="sm_90", cache_dir=cache)
    finally:
        cache.chmod(0o700)
    assert is_cubin(result.image) and entries(cache) == []


@requires_nvrtc
@pytest.mark.parametrize("disable", ["env", "false", "empty"])
def test_caching_can_be_disabled(tmp_path, monkeypatch, nvrtc_calls, disable):
    if disable == "env":
        monkeypatch.setenv("CUCTX_CACHE_DIR", "")
        kwargs = {}
    else:
        kwargs = {"cache_dir": False if disable == "false" else ""}
    for _ in range(2):
        assert not compile_source(SRC, arch="sm_90", **kwargs).from_cache
    assert len(nvrtc_calls) == 2
    assert not (tmp_path / "xdg").exists() and not (tmp_path / "home").exists()


@requires_nvrtc
def test_env_cache_dir_is_used(tmp_path, monkeypatch):
    monkeypatch.setenv("CUCTX_CACHE_DIR", str(tmp_path / "from-env"))
    compile_source(SRC, arch="sm_90")
    assert compile_source(SRC, arch="sm_90").from_cache
    assert len(entries(tmp_path / "from-env")) == 1


def test_cache_directory_resolution(tmp_path, monkeypatch):
    assert cache_directory() == tmp_path / "xdg" / "cuctx"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache_directory() == tmp_path / "home" / ".cache" / "cuctx"
    monkeypatch.setenv("CUCTX_CACHE_DIR", str(tmp_path / "env"))
    assert cache_directory() == tmp_path / "env"
    assert cache_directory(tmp_path / "arg") == tmp_path / "arg"
    assert cache_directory(str(tmp_path / "arg")) == tmp_path / "arg"
    assert cache_directory(False) is None and cache_directory("") is None
    monkeypatch.setenv("CUCTX_CACHE_DIR", "")
    assert cache_directory() is None
