"""`python -m cuctx`: what a newcomer types first. Each test runs the command in a subprocess,
as a user would, and checks what it prints and its exit status."""

import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys

import pytest

from conftest import BACKENDS, HAVE_GPU
from scenarios import child_env, run_python

from cuctx._driver import native
from cuctx.examples import EXAMPLES

NATIVE_BUILT = native.extension()[0] is not None  # what `info` in a subprocess will find


def cli(*args, backend, **env):
    return run_python("-m", "cuctx", *args, CUCTX_BACKEND=backend, **env)


def info_fields(stdout: str) -> dict[str, str]:
    """The `key : value` lines of `info` (keys padded to one width), up to the device table."""
    lines = stdout.splitlines()
    fields = dict(line.split(" : ", 1) for line in lines[: lines.index("")])
    return {key.strip(): value for key, value in fields.items()}


def one_line_error(proc) -> str:
    """The error a failed command printed: exactly one line on stderr, no traceback."""
    assert proc.returncode == 1, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


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
def test_info_shows_versions_and_where_things_are(name, tmp_path):
    proc = cli("info", "--json", backend=name, CUCTX_CACHE_DIR=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    import cuda.bindings
    import numpy as np
    import cuctx

    assert info["versions"]["cuctx"] == cuctx.__version__
    assert info["versions"]["python"] == ".".join(map(str, sys.version_info[:3]))
    assert info["versions"]["cuda_bindings"] == cuda.bindings.__version__
    assert info["versions"]["numpy"] == np.__version__
    assert info["versions"]["os"] and info["versions"]["nvrtc"]
    assert info["compile_cache"] == str(tmp_path)
    assert info["environment"]["CUCTX_CACHE_DIR"] == str(tmp_path)
    assert info["environment"]["CUCTX_BACKEND"] == name
    assert info["simulated"] is (name == "sim")
    assert info["native_fast_path"] is NATIVE_BUILT  # (CUCTX_NATIVE is not set here)
    assert info["native_reason"]
    if name == "sim":
        assert info["libcuda"] is None
    else:  # the library the driver calls go to
        assert pathlib.Path(info["libcuda"]).name.startswith("libcuda")
        assert pathlib.Path(info["libcuda"]).exists()


def test_info_says_when_the_compiled_path_is_turned_off():
    proc = cli("info", backend="sim", CUCTX_NATIVE="0")
    assert proc.returncode == 0, proc.stderr
    assert info_fields(proc.stdout)["native fast path"] == "no (turned off by CUCTX_NATIVE=0)"


def test_info_says_when_the_cache_is_off():
    proc = cli("info", backend="sim", CUCTX_CACHE_DIR="")
    assert proc.returncode == 0, proc.stderr
    assert info_fields(proc.stdout)["compile cache"] == "off (CUCTX_CACHE_DIR is empty)"
    assert (
        json.loads(cli("info", "--json", backend="sim", CUCTX_CACHE_DIR="").stdout)["compile_cache"]
        is None
    )


@pytest.mark.parametrize("name", BACKENDS)
def test_info_table_names_backend_and_devices(name):
    proc = cli("info", backend=name)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    fields = info_fields(proc.stdout)
    for key in (
        "cuctx",
        "Python",
        "OS",
        "cuda-bindings",
        "NVRTC",
        "NumPy",
        "libcuda",
        "compile cache",
        "environment",
    ):
        assert fields[key], key
    assert fields["backend"].startswith(f"{name} (")
    assert fields["native fast path"].startswith("yes (" if NATIVE_BUILT else "no (")
    assert f"CUCTX_BACKEND={name}" in fields["environment"]
    if name == "sim":  # what the sim reports is marked as modelled, not measured
        assert "simulated" in fields["driver"] and "simulated" in fields["timings"]
        assert fields["libcuda"].startswith("none")
    else:
        assert "simulated" not in fields["driver"] and "timings" not in fields
    header = next(i for i, line in enumerate(lines) if line.startswith("#"))
    assert "memory free/total" in lines[header]
    assert len(lines) - header - 2 == int(fields["devices"])


def test_version():
    import cuctx

    proc = cli("--version", backend="sim")
    assert proc.returncode == 0 and proc.stdout.strip() == f"cuctx {cuctx.__version__}"


EXAMPLE_NAMES = ", ".join(EXAMPLES)


@pytest.mark.parametrize(
    "args, wrong, see",
    [
        ([], "say which command to run: info or demo", "--help"),
        (
            ["nosuchcommand"],
            "there is no command 'nosuchcommand': the commands are info and demo",
            "--help",
        ),
        (["--bogus"], "unrecognized arguments: --bogus", "--help"),
        (["info", "--bogus"], "unrecognized arguments: --bogus", "info --help"),
        (["info", "--js"], "unrecognized arguments: --js", "info --help"),  # no abbreviations
        (["info", "extra"], "unrecognized arguments: extra", "info --help"),
        (
            ["demo", "nope"],
            f"there is no example 'nope': the examples are {EXAMPLE_NAMES}",
            "demo --help",
        ),
        (
            ["demo", "nope", "x"],
            f"there is no example 'nope' or 'x': the examples are {EXAMPLE_NAMES}",
            "demo --help",
        ),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else None,
)
def test_a_mistake_on_the_command_line_is_one_line_naming_the_help_to_read(args, wrong, see):
    proc = cli(*args, backend="sim")
    assert one_line_error(proc) == f"python -m cuctx: error: {wrong}; see 'python -m cuctx {see}'"
    assert proc.stdout == ""
    helped = cli(*see.split(), backend="sim")  # the advice works
    assert helped.returncode == 0 and helped.stdout.startswith("usage: python -m cuctx")


@pytest.mark.parametrize("args", [["info", "--json", "--bogus"], ["info", "--json=yes"]])
def test_a_mistake_on_the_command_line_with_json_is_a_json_object(args):
    proc = cli(*args, backend="sim")
    error = json.loads(one_line_error(proc))
    assert error["type"] == "UsageError"
    assert error["error"].endswith("; see 'python -m cuctx info --help'")
    assert proc.stdout == ""


@pytest.mark.parametrize("json_flag", [[], ["--json"]])
def test_ctrl_c_is_one_line_and_exit_status_130(json_flag):
    # `info` stands in for any command that is running when the user presses Ctrl-C: it says
    # it runs and waits for a signal, so SIGINT arrives while it runs, whatever the timing.
    # Python's own SIGINT handler, as in a terminal: a child inherits an ignored SIGINT from
    # a parent started in the background (`pytest &` in a script), and would never see it.
    code = (
        "import signal, sys, cuctx.__main__ as cli\n"
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "cli._info = lambda args: (print('running', flush=True), signal.pause())\n"
        f"sys.exit(cli.main(['info', *{json_flag!r}]))"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(CUCTX_BACKEND="sim"),
    )
    try:
        assert proc.stdout.readline() == "running\n"
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()  # nothing left behind if it failed
        proc.wait()
    assert proc.returncode == 130
    if json_flag:
        assert json.loads(stderr) == {"error": "", "type": "KeyboardInterrupt"}
    else:
        assert stderr == "python -m cuctx: error: KeyboardInterrupt\n"


@pytest.mark.parametrize("command", [["info"], ["demo"]])
def test_a_bad_backend_name_is_one_line_not_a_traceback(command):
    line = one_line_error(cli(*command, backend="no-such-backend"))
    assert line.startswith("python -m cuctx: error: ValueError: ")
    assert "'no-such-backend'" in line and "CUCTX_BACKEND" in line


def test_a_bad_racecheck_setting_is_one_line_and_a_json_object_with_json():
    line = one_line_error(cli("info", backend="sim", CUCTX_RACECHECK="bogus"))
    assert line.startswith("python -m cuctx: error: ValueError: CUCTX_RACECHECK='bogus': use ")
    error = json.loads(
        one_line_error(cli("info", "--json", backend="sim", CUCTX_RACECHECK="bogus"))
    )
    assert error["type"] == "ValueError" and "CUCTX_RACECHECK='bogus'" in error["error"]


def test_errors_are_a_json_object_with_json():
    proc = cli("info", "--json", backend="no-such-backend")
    error = json.loads(one_line_error(proc))
    assert error["type"] == "ValueError" and "'no-such-backend'" in error["error"]
    assert proc.stdout == ""


@pytest.mark.skipif(HAVE_GPU, reason="needs a machine without a usable NVIDIA driver")
def test_cuda_backend_without_a_driver_is_one_line():
    line = one_line_error(cli("info", backend="cuda"))
    assert line.startswith("python -m cuctx: error: BackendUnavailableError: ")
    assert "CUCTX_BACKEND=sim" in line  # what to do about it
    error = json.loads(one_line_error(cli("info", "--json", backend="cuda")))
    assert error["type"] == "BackendUnavailableError"


def test_a_failing_example_names_itself_in_one_line():
    # A sim without devices: the first example's Device(0) fails.
    line = one_line_error(cli("demo", "context_stack", backend="sim", CUCTX_SIM_DEVICES="0"))
    assert line.startswith("python -m cuctx: error: ")
    assert "in the example context_stack" in line
    assert "python -m cuctx.examples.context_stack" in line  # where the traceback is


@pytest.mark.parametrize("command", ["info", "demo"])
def test_a_reader_that_leaves_early_gets_no_error_message(command):
    # `python -m cuctx info | head -1`: stdout is a pipe whose reader has gone.
    read, write = os.pipe()
    os.close(read)
    proc = subprocess.run(
        [sys.executable, "-m", "cuctx", command],
        stdout=write,
        stderr=subprocess.PIPE,
        text=True,
        timeout=120,
        env=dict(os.environ, CUCTX_BACKEND="sim"),
    )
    os.close(write)
    assert proc.stderr == ""


@pytest.mark.parametrize("name", BACKENDS)
def test_demo_runs_every_example_and_says_what_it_shows(name, tmp_path):
    proc = cli("demo", backend=name, TMPDIR=str(tmp_path))  # (where its timelines go)
    assert proc.returncode == 0, proc.stderr
    assert "RaceWarning" not in proc.stderr, proc.stderr  # the sim checks every run
    out = proc.stdout
    for example in EXAMPLES.values():  # each one introduced: what it is, what to look at
        assert f"== {example.title} (python -m cuctx demo {example.name})" in out
        assert f"Shows: {example.shows}" in out and f"Look at: {example.look_at}" in out
    assert "using a destroyed context: ContextDestroyedError" in out
    # the stack walk that left a destroyed context current with the raw driver
    assert "after destroying A, current = <Context created device 0" in out
    assert "after destroying B, current = None" in out
    assert "stack empty again: current = None" in out
    assert f"launches counted in managed memory: {out.count(': [0.0, 2.0, 4.0, 6.0]')}" in out
    assert "copy/compute/copy on 4 streams: correct" in out
    assert "sum on another stream, with the wait: 1.0000 (correct)" in out
    assert out.count("cuctx.racecheck: read-after-write race; fix: side.wait(") == 1
    assert "outputs of eager and AutoGraph: equal" in out  # the decoding loop
    assert "AutoGraph: 192 calls: " in out
    if name == "sim":  # deterministic on the sim; a race on a GPU
        # an H100's choices: the first structure eager twice, built at its third call (its
        # build pays over 3 calls), each later one eager once, built at its second
        assert "AutoGraph: 192 calls: 185 patched (8 nodes each)" in out
        assert "without the wait: 0.0000 (stale" in out
        assert "ms of simulated GPU time" in out
        assert "time per token: measured on a GPU only" in out
    else:  # timings are the GPU's, not modelled
        assert "ms of GPU time" in out and "ms of simulated GPU time" not in out
        assert "time per token: eager" in out


def test_demo_runs_the_examples_named():
    proc = cli("demo", "stream_overlap", backend="sim")
    assert proc.returncode == 0, proc.stderr
    assert "copy/compute/copy on four streams" in proc.stdout
    assert "context stack walk" not in proc.stdout


@pytest.mark.parametrize("args", [["--help"], ["info", "--help"], ["demo", "--help"]])
def test_help_names_examples_by_what_they_show(args):
    proc = cli(*args, backend="sim")
    assert proc.returncode == 0, proc.stderr
    assert "seed" not in proc.stdout.lower()
    if args == ["--help"]:  # what happens on an error (the tests above hold it to that)
        text = " ".join(proc.stdout.split())
        assert (
            "one line on stderr and exit status 1, for a mistake on the command line too" in text
            and '"type": "UsageError"' in text
            and "exit status 130" in text
        )
    if args[0] == "demo":
        for example in EXAMPLES.values():
            assert f"{example.name}: {example.title}" in proc.stdout


def test_the_installed_script_names_itself():
    script = shutil.which("cuctx", path=os.path.dirname(sys.executable))
    if script is None:
        pytest.skip("the `cuctx` script is not installed next to this Python (pip install -e .)")
    proc = subprocess.run(
        [script, "info"],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, CUCTX_BACKEND="no-such-backend"),
    )
    assert one_line_error(proc).startswith("cuctx: error: ValueError: ")
