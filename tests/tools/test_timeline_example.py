"""The example `python -m cuctx demo contexts_on_one_gpu`: it writes its timelines where
--out says and prints the overlap numbers that tell what the pictures show; without
matplotlib it writes the traces and says, once, that it skips the pictures and why."""

import importlib.util
import json
import pathlib

import pytest

from conftest import BACKENDS, requires_nvrtc
from scenarios import run_python

EXAMPLE = "cuctx.examples.contexts_on_one_gpu"
PNG = b"\x89PNG\r\n\x1a\n"


def timelines(out: str) -> list[str]:
    """The timelines the example wrote, as the names of its `written:` lines."""
    return [
        pathlib.Path(line.split("written: ")[1].split(", ")[0]).stem
        for line in out.splitlines()
        if line.startswith("  written: ")
    ]


@requires_nvrtc
@pytest.mark.host_timing  # the overlaps: under 32 test processes an H200 host showed none
@pytest.mark.parametrize("name", BACKENDS)
def test_the_example_writes_timelines_and_prints_the_overlaps(name, tmp_path):
    if name == "cuda" and importlib.util.find_spec("cupti") is None:
        pytest.skip(
            "needs cupti-python on a GPU (pip install 'cuctx[timeline]'): without "
            "activity records the timeline's event pairs cannot show overlap"
        )
    proc = run_python("-m", EXAMPLE, "--out", str(tmp_path), CUCTX_BACKEND=name)
    assert proc.returncode == 0, proc.stderr
    assert "RaceWarning" not in proc.stderr, proc.stderr  # the sim checks every run
    out = proc.stdout
    assert f"timelines written to {tmp_path}" in out
    assert "two contexts on one device: kernels of both at once 0.000 ms (they take turns)" in out
    overlap = float(out.split("copy/compute overlap ")[-1].split(" ms")[0])
    assert overlap > 0  # one stream's copies ran while the other's kernel did
    for part in ("two_streams", "two_contexts"):
        trace = json.loads((tmp_path / f"{part}.json").read_text())
        threads = [
            e for e in trace["traceEvents"] if e.get("name") == "thread_name" and e["pid"] != 0
        ]
        assert len(threads) >= 2  # a track per stream
    if "Device.partition is not available" not in out:
        side = float(out.split("kernels of both at once ")[-1].split(" ms")[0])
        assert side > 0 and (tmp_path / "green_contexts.json").exists()
    parts = timelines(out)
    assert parts[:2] == ["two_streams", "two_contexts"]
    if importlib.util.find_spec("matplotlib") is None:  # what the next test forces
        assert out.count("pictures skipped: ") == 1 and not list(tmp_path.glob("*.png"))
    else:  # a picture beside each trace
        assert "pictures skipped" not in out
        for part in parts:
            assert (tmp_path / f"{part}.png").read_bytes()[:8] == PNG


@requires_nvrtc
def test_without_matplotlib_it_says_once_that_it_skips_the_pictures(tmp_path):
    code = (
        "import runpy, sys\n"
        "sys.modules['matplotlib'] = None  # as if it were not installed\n"
        f"runpy.run_module({EXAMPLE!r}, run_name='__main__')"
    )
    proc = run_python("-c", code, "--out", str(tmp_path), CUCTX_BACKEND="sim")
    assert proc.returncode == 0, proc.stderr
    skipped = [line for line in proc.stdout.splitlines() if "pictures skipped" in line]
    assert len(skipped) == 1, proc.stdout
    assert "needs matplotlib: pip install 'cuctx[timeline]'" in skipped[0]  # why, what to do
    parts = timelines(proc.stdout)
    assert len(parts) == 3  # the traces are all there
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"{p}.json" for p in parts)
    assert f"timelines written to {tmp_path}" in proc.stdout
