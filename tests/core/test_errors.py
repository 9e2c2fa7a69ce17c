"""The CudaError family: codes, names, classes users catch, sticky faults."""

import pickle

import pytest

from cuctx import errors
from cuctx.errors import (
    ContextDestroyedError,
    ContextPoisonedError,
    CudaError,
    InvalidValueError,
    NotSupportedError,
    OutOfMemoryError,
    StickyFaultError,
    error_for,
)


@pytest.mark.parametrize(
    "code, cls, builtin",
    [
        (1, InvalidValueError, ValueError),
        (2, OutOfMemoryError, MemoryError),
        (709, ContextDestroyedError, RuntimeError),
        (801, NotSupportedError, RuntimeError),
        (999, CudaError, RuntimeError),
    ],
)
def test_codes_map_to_the_classes_users_catch(code, cls, builtin):
    exc = error_for(code, "cuSomething", "driver text")
    assert type(exc) is cls and isinstance(exc, builtin) and isinstance(exc, CudaError)
    assert exc.code == code and exc.operation == "cuSomething" and exc.message == "driver text"


@pytest.mark.parametrize("code", sorted(errors.STICKY_CODES))
def test_sticky_codes_are_named_as_such(code):
    exc = error_for(code, "cuCtxSynchronize", "boom")
    assert isinstance(exc, StickyFaultError) and exc.sticky
    assert exc.name.startswith("CUDA_ERROR_")


def test_message_names_code_operation_and_hint():
    exc = error_for(700, "cuCtxSynchronize", "an illegal memory access was encountered", "fix it")
    assert str(exc) == (
        "cuCtxSynchronize failed: CUDA_ERROR_ILLEGAL_ADDRESS (700): "
        "an illegal memory access was encountered; fix it"
    )
    assert not error_for(1, "x").sticky


def test_poisoned_error_names_the_original_fault():
    fault = error_for(700, "cuLaunchKernel", "an illegal memory access was encountered")
    exc = ContextPoisonedError(fault, "Context.synchronize")
    assert exc.fault is fault and exc.code == 700
    assert "poisoned by an earlier CUDA_ERROR_ILLEGAL_ADDRESS in cuLaunchKernel" in str(exc)


def test_errors_survive_pickling_for_multiprocessing():
    for exc in (
        error_for(2, "cuMemAlloc", "out of memory", "asked 1 GiB"),
        ContextPoisonedError(error_for(719, "k", "launch failed"), "sync"),
    ):
        back = pickle.loads(pickle.dumps(exc))
        assert type(back) is type(exc) and str(back) == str(exc)


def test_unknown_code_still_gets_a_name():
    assert error_for(123456, "x").name == "CUDA_ERROR_123456"


def test_not_permitted_and_peer_access_codes_have_their_classes():
    from cuctx.errors import NotPermittedError, called_from_host_function

    assert type(error_for(800, "cuMemAlloc")) is NotPermittedError
    assert type(error_for(217, "cuCtxEnablePeerAccess")) is NotSupportedError
    exc = called_from_host_function("cuctx.zeros")
    assert exc.code == 800 and exc.operation == "cuctx.zeros"
    assert str(exc).startswith("cuctx.zeros failed: CUDA_ERROR_NOT_PERMITTED (800)")
    assert "host functions must not call CUDA" in str(exc)
