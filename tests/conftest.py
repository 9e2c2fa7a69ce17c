"""Every scenario runs on each backend available: the sim everywhere, cuda where a GPU is.

The ``backend`` fixture switches cuctx to one backend for the test (a fresh sim for each
test, so no state leaks) and checks afterwards that the test left this thread's context
stack as it found it: a test that leaks a pushed context fails.
"""

from __future__ import annotations

import gc

import pytest

import cuctx
from cuctx import _driver
from cuctx._driver import ThreadState
from cuctx._driver.cuda import probe

_cuda_driver, CUDA_REASON = probe()
HAVE_GPU = _cuda_driver is not None

BACKENDS = [
    pytest.param("sim", id="sim"),
    pytest.param("cuda", id="cuda", marks=[
        pytest.mark.gpu,
        pytest.mark.skipif(not HAVE_GPU, reason=f"needs a GPU: {CUDA_REASON}"),
    ]),
]


def fresh(name: str) -> _driver.Backend:
    if name == "sim":
        _driver._loaded.pop("sim", None)
    return cuctx.set_backend(name)


def _current(backend) -> int:
    return int(backend.driver.cuCtxGetCurrent()[1])


@pytest.fixture(params=BACKENDS)
def backend(request):
    b = fresh(request.param)
    before = _current(b)
    yield b
    leaked = 0
    if before == 0:  # empty the stack again, counting what the test left on it
        while b.driver.cuCtxPopCurrent()[0] == 0:
            leaked += 1
    b.tls.state = ThreadState()  # a fresh per-thread state for the next test
    for device in b.devices.values():  # what Device.set_current retained, as cudaSetDevice does
        device._runtime_primary = None
    gc.collect()
    assert leaked == 0 and (before == 0 or _current(b) == before), \
        f"the test left {leaked} context(s) pushed on this thread's stack"


@pytest.fixture
def sim():
    """The sim alone, for what only the sim can show (fault injection, its device model)."""
    return fresh("sim")


@pytest.fixture
def gpu():
    if not HAVE_GPU:
        pytest.skip(f"needs a GPU: {CUDA_REASON}")
    return fresh("cuda")
