"""`python -m cuctx info`: a readable table and JSON for scripts."""

import json
import os
import subprocess
import sys

import pytest

from conftest import BACKENDS


def cli(*args, backend):
    env = dict(os.environ, CUCTX_BACKEND=backend)
    return subprocess.run([sys.executable, "-m", "cuctx", *args], capture_output=True,
                          text=True, env=env, timeout=120)


@pytest.mark.parametrize("name", BACKENDS)
def test_info_json_describes_every_device(name):
    proc = cli("info", "--json", backend=name)
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info["backend"] == name and info["devices"]
    for ordinal, device in enumerate(info["devices"]):
        assert device["ordinal"] == ordinal
        assert 0 < device["free_memory"] <= device["total_memory"]
        assert device["properties"]["multiprocessor_count"] > 0


@pytest.mark.parametrize("name", BACKENDS)
def test_info_table_names_backend_and_devices(name):
    proc = cli("info", backend=name)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith(f"backend : {name} (")
    header = next(i for i, line in enumerate(lines) if line.startswith("#"))
    assert "memory free/total" in lines[header]
    assert len(lines) - header - 2 == int(lines[2].split(":")[1])


def test_unknown_command_fails_with_usage():
    proc = cli("frobnicate", backend="sim")
    assert proc.returncode == 2 and "usage:" in proc.stderr


@pytest.mark.parametrize("name", BACKENDS)
def test_demo_runs_every_example(name):
    proc = cli("demo", backend=name)
    assert proc.returncode == 0, proc.stderr
    assert "using a destroyed context: ContextDestroyedError" in proc.stdout
    assert "stack empty again: current = None" in proc.stdout
    assert "launches counted in managed memory:" in proc.stdout
    assert "copy/compute/copy on 4 streams: correct" in proc.stdout
    assert "sum on another stream, with the wait: 1.0000 (correct)" in proc.stdout
    if name == "sim":  # deterministic on the sim; a race on a GPU
        assert "without the wait: 0.0000 (stale" in proc.stdout
    bad = cli("demo", "nope", backend=name)
    assert bad.returncode == 2 and "no example named nope" in bad.stderr
