"""The example `python -m cuctx demo isolated_kernel_evaluation`: six candidate kernels, of
which two fault, one hangs and one is wrong; the table says so and the program goes on."""

import pytest

from conftest import BACKENDS, requires_nvrtc
from scenarios import run_python


@requires_nvrtc
@pytest.mark.parametrize("name", BACKENDS)
def test_the_evaluation_table_names_each_outcome_and_the_program_goes_on(name, tmp_path):
    proc = run_python(
        "-m",
        "cuctx.examples.isolated_kernel_evaluation",
        timeout=300,
        CUCTX_BACKEND=name,
        CUCTX_CACHE_DIR=str(tmp_path),
    )
    assert proc.returncode == 0, proc.stderr
    rows = {line.split()[0]: line for line in proc.stdout.splitlines() if line.startswith("scale_")}
    assert list(rows) == [
        "scale_simple",
        "scale_overrun",
        "scale_grid_stride",
        "scale_squared",
        "scale_spin",
        "scale_unguarded",
    ]
    for correct in ("scale_simple", "scale_grid_stride"):
        assert rows[correct].split()[1] == "correct"
    assert "wrong answer (max error 1)" in rows["scale_squared"]
    for fault in ("scale_overrun", "scale_unguarded"):
        assert "fault: CUDA_ERROR_ILLEGAL_ADDRESS" in rows[fault]
        assert rows[fault].endswith(" s")  # how long until a new worker served
    assert "timeout after 3 s" in rows["scale_spin"] and rows["scale_spin"].endswith(" s")
    assert (
        "6 candidates: 2 correct, 1 wrong, 2 faults, 1 timeout; the worker was replaced 3 times"
    ) in proc.stdout
    assert "the caller's own arrays still work: x sums to 32768.0" in proc.stdout
