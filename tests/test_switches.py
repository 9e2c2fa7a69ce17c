"""The documented switches keep the tests green: CUCTX_FASTPATH=0 (no launch fast paths) and
CUCTX_NATIVE=0 (no compiled path). CI runs the suite with neither set, so a test that takes a
fast path for granted fails only in a run nobody makes (three modules had, unseen). This runs
the modules that test the launch paths, where such tests live, in a child pytest with each
switch; a test whose subject a switch turns off skips there with the reason
(`requires_fast_paths`, or the `paths` marker's skip). The whole suite with each switch is
the fuller check: `CUCTX_FASTPATH=0 python -m pytest -x -q`, the same with CUCTX_NATIVE=0."""

import pathlib

import pytest

from scenarios import run_python

ROOT = pathlib.Path(__file__).resolve().parent.parent
LAUNCH_TESTS = [
    "tests/kernels/test_launch.py",
    "tests/kernels/test_codegen.py",
    "tests/kernels/test_native.py",
    "tests/kernels/test_launcher_trace.py",
]


@pytest.mark.parametrize(
    "switch, skipped",
    [
        ("CUCTX_FASTPATH", "launch fast paths are turned off (CUCTX_FASTPATH=0)"),
        ("CUCTX_NATIVE", "the compiled fast path is off: turned off by CUCTX_NATIVE=0"),
    ],
    ids=["CUCTX_FASTPATH=0", "CUCTX_NATIVE=0"],
)
def test_the_launch_tests_pass_with_a_switch_off(switch, skipped, nvrtc_cache):
    # On the sim only (the switches act on host code, the same on both backends; a GPU run
    # of the whole suite with CUCTX_NATIVE=0 is scripts/gpu-check's), with no other
    # CUCTX_ setting than the switch and the compile cache.
    proc = run_python(
        "-m",
        "pytest",
        "-q",
        "-x",
        "-p",
        "no:cacheprovider",
        "-k",
        "not cuda",
        *LAUNCH_TESTS,
        cwd=ROOT,
        timeout=600,
        clean=True,
        CUCTX_CACHE_DIR=str(nvrtc_cache),
        **{switch: "0"},
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert skipped in proc.stdout  # the switch took effect: its tests said why they skipped
