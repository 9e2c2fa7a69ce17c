"""benchmarks/isolation.py runs on the sim (a smoke test: its numbers are the sim's) and
prints every measurement against its goal."""

import pathlib

from scenarios import run_python

BENCHMARK = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "isolation.py"


def test_the_isolation_benchmark_prints_each_goal():
    proc = run_python(str(BENCHMARK), "--quick", "--no-ray", timeout=300, CUCTX_BACKEND="sim")
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stdout.splitlines() if "[goal <=" in line]
    assert "first use (a pool made after the worker)" in proc.stdout
    for what in (
        "worker processes",
        "first use (a pool made before the worker)",
        "fault -> exception",
        "fault -> next call served, cold",
        "fault -> next call served, warm standby",
        "file descriptors leaked",
        "zombie processes",
        "device memory not given back",
    ):
        assert any(line.strip().startswith(what) for line in lines), what
    for leak in ("file descriptors leaked", "zombie processes"):  # none, on any machine
        assert next(line for line in lines if leak in line).endswith("met")
