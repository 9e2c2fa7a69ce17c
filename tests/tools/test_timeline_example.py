"""The example `python -m cuctx demo contexts_on_one_gpu`: it writes its timelines where
--out says and prints the overlap numbers that tell what the pictures show."""

import importlib.util
import json

import pytest

from conftest import BACKENDS, requires_nvrtc
from scenarios import run_python


@requires_nvrtc
@pytest.mark.parametrize("name", BACKENDS)
def test_the_example_writes_timelines_and_prints_the_overlaps(name, tmp_path):
    if name == "cuda" and importlib.util.find_spec("cupti") is None:
        pytest.skip("needs cupti-python on a GPU (pip install 'cuctx[timeline]'): without "
                    "activity records the timeline's event pairs cannot show overlap")
    proc = run_python("-m", "cuctx.examples.contexts_on_one_gpu", "--out", str(tmp_path),
                      CUCTX_BACKEND=name)
    assert proc.returncode == 0, proc.stderr
    assert "RaceWarning" not in proc.stderr, proc.stderr  # the sim checks every run
    out = proc.stdout
    assert f"timelines written to {tmp_path}" in out
    assert "two contexts on one device: kernels of both at once 0.000 ms (they take turns)" \
        in out
    overlap = float(out.split("copy/compute overlap ")[-1].split(" ms")[0])
    assert overlap > 0  # one stream's copies ran while the other's kernel did
    for part in ("two_streams", "two_contexts"):
        trace = json.loads((tmp_path / f"{part}.json").read_text())
        threads = [e for e in trace["traceEvents"] if e.get("name") == "thread_name"
                   and e["pid"] != 0]
        assert len(threads) >= 2  # a track per stream
    if "Device.partition is not available" not in out:
        side = float(out.split("kernels of both at once ")[-1].split(" ms")[0])
        assert side > 0 and (tmp_path / "green_contexts.json").exists()
