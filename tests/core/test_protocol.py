"""The internal protocol (`cuctx._resource.Resource`): every resource class derives from it
and answers its fields (``_backend``, ``_ctx``, ``_handle``, ``_key``, ``_check``), and
``_check`` raises what each raised before: the context's ContextDestroyedError or
ContextPoisonedError naming the operation, RuntimeError for unloaded device code."""

from __future__ import annotations

import gc

import numpy as np
import pytest
from conftest import requires_nvrtc

import cuctx
from cuctx import Context, ContextDestroyedError, ContextPoisonedError, StickyFaultError
from cuctx._resource import Resource
from cuctx.sim import inject_fault

pytestmark = pytest.mark.paths()

SOURCE = r"""
extern "C" __global__ void fill(int* out, int v) { out[threadIdx.x] = v; }
"""


def fill(grid, block, out, v):
    out.view(np.int32, block[0])[:] = v


@pytest.fixture(autouse=True)
def cache_dir(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("CUCTX_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "nvrtc-cache"))


def bound_to(ctx: Context) -> dict[str, Resource]:
    """One resource of each context-bound class, made in ``ctx``."""
    with ctx:
        module = cuctx.Module.from_source(SOURCE, sim_kernels={"fill": fill})
        stream = cuctx.Stream()
        return {
            "context": ctx,
            "stream": stream,
            "event": stream.record(cuctx.Event()),
            "array": cuctx.zeros(4, np.int32),
            "module": module,
            "module kernel": module["fill"],
        }


@requires_nvrtc
def test_every_resource_answers_the_protocol(backend):
    ctx = Context.create(0)
    Context.pop()
    library = cuctx.Library.from_source(SOURCE, sim_kernels={"fill": fill})
    resources = bound_to(ctx)
    unbound = {"library": library, "library kernel": library["fill"]}
    for name, obj in {**resources, **unbound}.items():
        assert isinstance(obj, Resource), name
        assert obj._backend is backend, name
        assert obj._key == int(obj._handle), name
        assert obj._check("anything") is None, name
    for name, obj in resources.items():
        assert obj._ctx is ctx, name
    for name, obj in unbound.items():
        assert obj._ctx is None, name  # a library runs in every context
    assert resources["array"]._key == resources["array"].ptr
    ctx.destroy()


@requires_nvrtc
def test_check_of_a_destroyed_context_names_the_operation(backend):
    ctx = Context.create(0)
    Context.pop()
    resources = bound_to(ctx)
    ctx.destroy()
    for name, obj in resources.items():
        with pytest.raises(ContextDestroyedError, match="Stream.frobnicate") as raised:
            obj._check("Stream.frobnicate")
        assert raised.value.operation == "Stream.frobnicate", name


@requires_nvrtc
def test_check_of_a_poisoned_context_carries_the_fault(sim):
    ctx = Context.create(0)
    Context.pop()
    resources = bound_to(ctx)
    inject_fault(ctx, "CUDA_ERROR_ILLEGAL_ADDRESS")
    with pytest.raises(StickyFaultError) as fault:
        ctx.synchronize()
    for name, obj in resources.items():
        with pytest.raises(ContextPoisonedError) as raised:
            obj._check("op")
        assert raised.value.fault is fault.value and raised.value.operation == "op", name
    del resources
    gc.collect()
    ctx.destroy()


@requires_nvrtc
def test_check_of_unloaded_code(backend):
    library = cuctx.Library.from_source(SOURCE, sim_kernels={"fill": fill})
    module = cuctx.Module.from_source(SOURCE, sim_kernels={"fill": fill})
    for code in (library, module):
        kernel = code["fill"]
        code.unload()
        for obj in (code, kernel):
            with pytest.raises(RuntimeError, match=r"^op: .* was unloaded"):
                obj._check("op")


# -- device properties: cached only where the attribute cannot change --------------------


def test_only_the_compute_mode_is_read_again(sim, monkeypatch):
    calls = []
    read = sim.driver.cuDeviceGetAttribute

    def counting(attribute, device):
        calls.append(attribute.name)
        return read(attribute, device)

    monkeypatch.setattr(sim.driver, "cuDeviceGetAttribute", counting)
    properties = cuctx.Device(0).properties
    for _ in range(3):
        assert properties.compute_mode == 0
        assert properties.multiprocessor_count == 132
    assert calls.count("CU_DEVICE_ATTRIBUTE_COMPUTE_MODE") == 3
    assert calls.count("CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT") == 1
