"""Interpreter exit after GPU work is silent: nothing cuctx or the libraries it shares the
device with keep is finalised into a destroyed context during teardown."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import CUDA_REASON, HAVE_GPU
from scenarios import run_python

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.gpu
@pytest.mark.skipif(not HAVE_GPU, reason=f"needs a GPU: {CUDA_REASON}")
def test_exit_after_cupy_interop_and_a_device_reset_is_silent():
    """The CuPy round trip, then the tests that reset the device, in one test process: CuPy
    kept the kernels it loaded past the reset and failed to unload them while the interpreter
    was torn down ("Error in sys.excepthook" after the whole GPU suite). The round trip now
    runs in a process of its own."""
    pytest.importorskip("cupy")
    run = run_python(
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "tests/memory/test_interop.py",
        "tests/core/test_stream.py",
        "-k",
        "cupy or reset",
        cwd=ROOT,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert "Error in sys.excepthook" not in run.stderr + run.stdout
    assert "Exception ignored" not in run.stderr + run.stdout


EXIT_WITH_ARRAYS = """
import numpy as np, cuctx
kept = [cuctx.zeros(256, np.float32) for _ in range(4)]   # module globals at exit
cycle = [cuctx.zeros(16, np.float32), kept[0][:8]]
cycle.append(cycle)                                         # garbage only a collection finds
ctx = cuctx.Context.create(cuctx.Device(0))
inside = cuctx.zeros(8, np.float32)
cuctx.Context.pop()
import json  # a module older than cuctx's, holding arrays: torn down after cuctx's modules
json.cuctx_arrays = [cuctx.zeros(8, np.float32) for _ in range(4)]
print(float(kept[1].to_host().sum()))
"""


@pytest.mark.parametrize(
    "backend",
    [
        "sim",
        pytest.param(
            "cuda",
            marks=[
                pytest.mark.gpu,
                pytest.mark.skipif(not HAVE_GPU, reason=f"needs a GPU: {CUDA_REASON}"),
            ],
        ),
    ],
)
def test_exit_with_arrays_still_alive_is_silent(backend):
    """Arrays that live until the interpreter exits (globals, a cycle, one of a created
    context, some held by a module torn down after cuctx's): their frees are not run during
    teardown, and nothing is printed."""
    run = run_python("-c", EXIT_WITH_ARRAYS, cwd=ROOT, CUCTX_BACKEND=backend)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert run.stdout.strip() == "0.0"
    assert run.stderr == "", run.stderr[-2000:]
