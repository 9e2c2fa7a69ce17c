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
    run = run_python("-m", "pytest", "-q", "-p", "no:cacheprovider",
                     "tests/memory/test_interop.py", "tests/core/test_stream.py",
                     "-k", "cupy or reset", cwd=ROOT, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert "Error in sys.excepthook" not in run.stderr + run.stdout
    assert "Exception ignored" not in run.stderr + run.stdout
