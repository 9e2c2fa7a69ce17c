"""Sim twins: checked against their kernels when the library loads (on every backend, so
code that loads on the sim loads on a GPU), given arguments decoded with the parameter
types, and a twin's failure is reported with its exception and its file and line."""

from __future__ import annotations

import numpy as np
import pytest

import cuctx
from conftest import requires_nvrtc
from cuctx._driver.sim._twins import SimTwinWarning

pytestmark = [requires_nvrtc, pytest.mark.usefixtures("nvrtc_cache")]

SOURCE = r"""
struct Pair { int a; float b; };
extern "C" __global__ void mix(float* out, float a, double d, int n, Pair p, long long q) {}
"""


def three(grid, block, out, a, d):
    pass


def test_a_twin_of_the_wrong_arity_is_refused_at_load(backend):
    with pytest.raises(TypeError) as info:
        cuctx.Library.from_source(SOURCE, sim_kernels={"mix": three})
    message = str(info.value)
    assert "sim_kernels['mix']: the twin three(grid, block, out, a, d)" in message
    assert f"{__file__}:{three.__code__.co_firstlineno}" in message
    assert "the 6 argument(s) of kernel 'mix'" in message


@pytest.mark.parametrize(
    "twin",
    [
        lambda grid, block, *args: None,
        lambda grid, block, out, a, d, n, p, q=0: None,
        lambda grid, block, out, a, d, n, p, q, extra=None: None,
    ],
)
def test_twins_that_can_take_the_arguments_load(backend, twin):
    cuctx.Library.from_source(SOURCE, sim_kernels={"mix": twin})


def test_an_annotation_against_the_parameter_type_is_refused_at_load(backend):
    def mix(grid, block, out, a: int, d, n, p, q):
        pass

    with pytest.raises(
        TypeError,
        match=r"annotates 'a' as int, but parameter 1 of kernel "
        r"'mix' is \.f32: a floating-point number",
    ):
        cuctx.Library.from_source(SOURCE, sim_kernels={"mix": mix})

    def mix2(grid, block, out, a, d, n: float, p, q):
        pass

    with pytest.raises(TypeError, match=r"annotates 'n' as float.*\.u32: an integer"):
        cuctx.Library.from_source(SOURCE, sim_kernels={"mix": mix2})


def test_sim_kernels_must_be_a_mapping_of_functions(backend):
    with pytest.raises(TypeError, match="sim_kernels must be a dict"):
        cuctx.Library.from_source(SOURCE, sim_kernels=[three])
    with pytest.raises(TypeError, match=r"sim_kernels\['mix'\] must be a function"):
        cuctx.Library.from_source(SOURCE, sim_kernels={"mix": 3})
    with pytest.raises(KeyError, match="no kernel 'nix'"):
        cuctx.Library.from_source(SOURCE, sim_kernels={"nix": three})


def test_a_twin_without_annotations_gets_the_parameter_types(sim):
    seen = {}

    def mix(grid, block, out, a, d, n, p, q):
        seen.update(out=out, a=a, d=d, n=n, p=p, q=q)

    lib = cuctx.Library.from_source(SOURCE, sim_kernels={"mix": mix})
    import ctypes

    class Pair(ctypes.Structure):
        _fields_ = [("a", ctypes.c_int), ("b", ctypes.c_float)]

    with cuctx.Device(0) as ctx:
        out = cuctx.zeros(1, np.float32)
        lib["mix"][1, 1](out, 2, 0.5, -3, Pair(1, 2.0), 9)
        ctx.synchronize()
    assert (seen["a"], seen["d"], seen["n"]) == (2.0, 0.5, -3)
    assert type(seen["a"]) is float and type(seen["d"]) is float and type(seen["n"]) is int
    assert seen["p"] == bytes(Pair(1, 2.0))
    assert int(seen["out"]) == out.ptr and int(seen["q"]) == 9


def test_a_complex_annotation_decodes_a_complex_struct(sim):
    src = r"""
    struct __align__(16) Z { double re, im; };
    extern "C" __global__ void z(Z value) {}"""
    seen = []
    lib = cuctx.Library.from_source(
        src, sim_kernels={"z": lambda grid, block, value: seen.append(value)}
    )
    annotated = []

    def z(grid, block, value: complex):
        annotated.append(value)

    lib2 = cuctx.Library.from_source(src, sim_kernels={"z": z})
    with cuctx.Device(0) as ctx:
        lib["z"][1, 1](1.5 - 2j)
        lib2["z"][1, 1](1.5 - 2j)
        ctx.synchronize()
    assert isinstance(seen[0], bytes) and annotated == [1.5 - 2j]


def _raising_twin(grid, block, out, n):
    values = out.view(np.float32, n)
    values[0] = 1 / 0  # the line the report names


def test_a_twin_that_raises_is_the_cause_of_the_sticky_fault(sim):
    lib = cuctx.Library.from_source(
        'extern "C" __global__ void k(float* out, int n) {}', sim_kernels={"k": _raising_twin}
    )
    ctx = cuctx.Context.create(0)
    try:
        out = cuctx.zeros(4, np.float32)
        lib["k"][1, 1](out, 4)
        with pytest.warns(SimTwinWarning, match="ZeroDivisionError"):
            with pytest.raises(cuctx.StickyFaultError, match="LAUNCH_FAILED"):
                ctx.synchronize()
        err, cause, text = sim.sim.fault_cause(ctx._handle)
        line = _raising_twin.__code__.co_firstlineno + 2
        assert not err and isinstance(cause, ZeroDivisionError)
        assert "the sim twin of kernel 'k' raised ZeroDivisionError" in text
        assert f"{__file__}:{line}" in text
    finally:
        ctx.destroy()


def test_the_sticky_fault_error_chains_the_twins_exception(sim):
    lib = cuctx.Library.from_source(
        'extern "C" __global__ void k(float* out, int n) {}', sim_kernels={"k": _raising_twin}
    )
    ctx = cuctx.Context.create(0)
    try:
        lib["k"][1, 1](cuctx.zeros(4, np.float32), 4)
        with pytest.warns(SimTwinWarning):
            with pytest.raises(cuctx.StickyFaultError) as info:
                ctx.synchronize()
        assert isinstance(info.value.__cause__, ZeroDivisionError)
        assert f"{__file__}:{_raising_twin.__code__.co_firstlineno + 2}" in str(info.value)
    finally:
        ctx.destroy()


def test_an_out_of_bounds_twin_access_names_its_line(sim):
    def over(grid, block, out, n):
        out.view(np.float32, n + 1)[n] = 1.0

    lib = cuctx.Library.from_source(
        'extern "C" __global__ void over(float* out, int n) {}', sim_kernels={"over": over}
    )
    ctx = cuctx.Context.create(0)
    try:
        lib["over"][1, 1](cuctx.zeros(4, np.float32), 4)
        with pytest.raises(cuctx.StickyFaultError, match="ILLEGAL_ADDRESS"):
            ctx.synchronize()
        _, cause, text = sim.sim.fault_cause(ctx._handle)
        assert cause is None
        assert f"{__file__}:{over.__code__.co_firstlineno + 1}" in text
    finally:
        ctx.destroy()
