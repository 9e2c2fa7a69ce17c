"""The race checker on by default on the sim ("warn"), off on the cuda backend: the missing
wait after arrays made on the default stream is a `RaceWarning` at the user's line, naming
the wait and the fix; CUCTX_RACECHECK=off|raise|warn; the default follows `set_backend`;
explicit `cuctx.racecheck` blocks inside it (their mode wins, each race reported once); an
"off" block steps the checker aside. (The suite itself runs under it: pyproject's
filterwarnings makes an unexpected RaceWarning fail the test that caused it.)"""

from __future__ import annotations

import gc
import inspect
import queue
import textwrap
import threading
import warnings

import numpy as np
import pytest

import cuctx
from cuctx import _trace
from conftest import HAVE_GPU, fresh
from scenarios import ADD_SOURCE, add, run_python

pytestmark = pytest.mark.usefixtures("nvrtc_cache")
N = 1024


def here() -> int:
    return inspect.currentframe().f_back.f_lineno


@pytest.fixture
def kernel(sim):
    """`add` (out = x + a) on the sim, device 0's primary context current."""
    library = cuctx.Library.from_source(ADD_SOURCE, sim_kernels={"add": add})
    with cuctx.Device(0):
        yield library["add"]


def races(caught) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, cuctx.RaceWarning)]


# -- the motivating case: arrays made without stream= ---------------------------------------


def test_arrays_made_on_the_default_stream_and_used_on_a_created_one_warn(kernel):
    s = cuctx.Stream()
    made = here() + 1
    out, x = cuctx.zeros(N, np.float32), cuctx.to_device(np.ones(N, np.float32))  # no stream=
    with pytest.warns(cuctx.RaceWarning) as caught:
        line = here() + 1
        kernel[N // 256, 256, 0, s](out, x, 1.0, N)  # (float* out: read and written)
    assert len(caught) == 2  # out's zeros and x's upload, on the legacy default stream
    for text in (str(w.message) for w in caught):
        assert text.startswith(
            f"read-after-write race on a float32 array of shape (1024,) "
            f"allocated at {__file__}:{made}:"
        )
        assert "missing: nothing orders the launch of 'add' on s after the " in text
        assert "s did not wait for cuctx.legacy_stream()" in text
        assert text.endswith(f"fix: s.wait(cuctx.legacy_stream()) before line {line}")
    assert {(w.filename, w.lineno) for w in caught} == {(__file__, line)}  # the user's line
    cuctx.synchronize()


def test_a_copy_on_a_created_stream_warns_too_where_it_reads_stale_zeros(kernel):
    s = cuctx.Stream()
    x = cuctx.full(N, 1.0, np.float32)  # zeroed, then filled, on the default stream
    with pytest.warns(
        cuctx.RaceWarning,
        match=r"copy on s after the fill on "
        r"cuctx\.legacy_stream\(\)(.|\n)*fix: s\.wait\(cuctx\.legacy_stream\(\)\)",
    ):
        host = x.to_host(stream=s)
    assert host.tolist() == [0.0] * N  # what it did before, silently (the sim runs the copy
    cuctx.synchronize()  # first: the default stream's fill waits for no one)


def test_with_the_wait_nothing_is_reported_and_the_data_is_right(kernel):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        s = cuctx.Stream()
        x = cuctx.to_device(np.ones(N, np.float32))
        out = cuctx.zeros(N, np.float32)
        s.wait(cuctx.legacy_stream())  # the fix the warning names
        kernel[N // 256, 256, 0, s](out, x, 1.0, N)
        got = out.to_host(stream=s)
    assert races(caught) == []
    assert got.tolist() == [2.0] * N


def test_the_default_streams_of_two_contexts_are_told_apart(kernel):
    x = cuctx.zeros(N, np.float32)  # on the primary context's default stream
    primary = x.context
    other = cuctx.Context.create(cuctx.Device(0))
    try:
        copy = cuctx.empty(N, np.float32)
        with pytest.warns(cuctx.RaceWarning) as caught:
            line = here() + 1
            cuctx.copy(copy, x)  # on other's default stream
    finally:
        cuctx.Context.pop()
    [text] = races(caught)
    assert (
        "copy on cuctx.legacy_stream() of other after the fill on cuctx.legacy_stream() "
        "of primary" in text
    )
    assert text.endswith(f"fix: primary.synchronize() before line {line}")
    primary.synchronize()
    other.synchronize()
    other.destroy()


# -- the environment and the backend ---------------------------------------------------------

RACY = """
import numpy as np
import cuctx
with cuctx.Device(0):
    s = cuctx.Stream()
    x = cuctx.zeros(64, np.float32)  # on the default stream
    x.fill(2.0, stream=s)            # no wait
    cuctx.synchronize()
print("done")
"""


@pytest.mark.parametrize(
    "name",
    [
        "sim",
        pytest.param(
            "cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not HAVE_GPU, reason="needs a GPU")]
        ),
    ],
)
def test_the_environment_variable_and_the_backend_decide(name, tmp_path):
    script = tmp_path / "racy.py"
    script.write_text(RACY)

    def run(**env):
        return run_python(str(script), clean=True, CUCTX_BACKEND=name, **env)

    default = run()
    assert default.returncode == 0 and "done" in default.stdout
    if name == "sim":  # on by default, in "warn" mode, at the user's line
        assert "racy.py:7: RaceWarning: write-after-write race" in default.stderr
        assert "fix: s.wait(cuctx.legacy_stream()) before line 7" in default.stderr
    else:  # off by default on a GPU
        assert "Race" not in default.stderr
    for off in ("off", "0"):
        quiet = run(CUCTX_RACECHECK=off)
        assert quiet.returncode == 0 and "Race" not in quiet.stderr, quiet.stderr
    warned = run(CUCTX_RACECHECK="warn")
    assert warned.returncode == 0 and "RaceWarning" in warned.stderr
    raised = run(CUCTX_RACECHECK="raise")
    assert raised.returncode != 0 and "cuctx.errors.RaceError" in raised.stderr


def test_an_unknown_value_names_the_accepted_ones_at_the_first_use_and_each_after():
    code = (
        "import cuctx\n"
        "for attempt in range(2):\n"
        "    try:\n"
        "        cuctx.zeros(1)\n"
        "    except ValueError as exc:\n"
        "        print(exc)\n"
    )
    proc = run_python("-c", code, clean=True, CUCTX_RACECHECK="yes")
    assert proc.returncode == 0, proc.stderr  # the import itself succeeds
    lines = proc.stdout.splitlines()
    assert len(lines) == 2 and lines[0] == lines[1]
    assert lines[0].startswith("CUCTX_RACECHECK='yes': use 'raise', 'warn' or 'off'")


def test_a_switch_to_a_new_sim_starts_the_checker_over(sim):
    s1, s2 = cuctx.Stream(), cuctx.Stream()
    x = cuctx.empty(N, np.float32, stream=s1)
    x.fill(1.0, stream=s1)
    fresh("sim")  # a new simulated GPU: the same addresses, none of that history
    with cuctx.Device(0):
        s = cuctx.Stream()
        y = cuctx.empty(N, np.float32, stream=s)
        y.fill(2.0, stream=s)
        assert y.ptr == x.ptr
        x.fill(3.0, stream=s2)  # an object of the old sim: not checked against the new one
        with pytest.warns(cuctx.RaceWarning, match="write-after-write"):
            y.fill(4.0, stream=cuctx.Stream())  # the new sim is checked
        cuctx.synchronize()
    with x.context:
        cuctx.synchronize()


@pytest.mark.gpu
def test_the_default_follows_set_backend(gpu):
    """On the cuda backend nothing listens (the fast paths run) and races are not reported;
    back on the sim the checker is on again."""
    assert not _trace.sinks
    with cuctx.Device(0):
        x = cuctx.zeros(N, np.float32)
        x.fill(1.0, stream=cuctx.Stream())  # a race, not reported on a GPU by default
        cuctx.synchronize()
    fresh("sim")
    assert _trace.sinks
    with cuctx.Device(0):
        x = cuctx.zeros(N, np.float32)
        with pytest.warns(cuctx.RaceWarning):
            x.fill(1.0, stream=cuctx.Stream())
        cuctx.synchronize()


# -- explicit blocks while the default checker runs ------------------------------------------


def test_a_block_mode_wins_inside_it_and_sees_work_queued_before_it(kernel):
    s = cuctx.Stream()
    x = cuctx.zeros(N, np.float32)  # queued before the block, on the default stream
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with cuctx.racecheck("raise") as rc:
            with pytest.raises(cuctx.RaceError, match=r"fix: s\.wait"):
                x.fill(1.0, stream=s)
        x.fill(2.0, stream=s)  # the same pair of lines is not reported again...
    assert races(caught) == []  # ...and was not also warned about: reported once
    [finding] = rc.findings
    assert finding.kind == "write-after-write" and finding.second.stream is s
    cuctx.synchronize()


def test_collect_and_nested_blocks(kernel):
    s1, s2 = cuctx.Stream(), cuctx.Stream()
    x = cuctx.empty(N, np.float32)
    cuctx.synchronize()
    with cuctx.racecheck("raise") as outer:
        with cuctx.racecheck("collect") as inner:  # the innermost block's mode wins
            x.fill(1.0, stream=s1)
            x.fill(2.0, stream=s2)
        with pytest.raises(cuctx.RaceError):
            x.fill(3.0, stream=s1)  # after the inner block: the outer one's mode
    assert [f.kind for f in inner.findings] == ["write-after-write"]
    assert [f.kind for f in outer.findings] == ["write-after-write"] * 2  # it lists both
    cuctx.synchronize()


def test_an_off_block_steps_the_checker_aside_and_it_starts_over_after(kernel):
    s1, s2 = cuctx.Stream(), cuctx.Stream()
    x = cuctx.empty(N, np.float32)
    cuctx.synchronize()
    assert _trace.sinks  # the default checker listens: every call takes the checked path
    x.fill(1.0, stream=s1)
    with cuctx.racecheck("off"):
        assert not _trace.sinks  # the fast paths run
        x.fill(2.0, stream=s2)  # a race, not reported
    x.fill(3.0, stream=s2)  # after the block: the fill on s1 before it is forgotten
    with pytest.warns(cuctx.RaceWarning):
        x.fill(4.0, stream=s1)  # what runs after the block is checked again
    cuctx.synchronize()


def test_blocks_check_on_their_own_where_nothing_runs_by_default(kernel):
    with cuctx.racecheck("off"):  # as on the cuda backend, or with CUCTX_RACECHECK=off
        s1, s2 = cuctx.Stream(), cuctx.Stream()
        x = cuctx.empty(N, np.float32)
        x.fill(1.0, stream=s1)  # before the block: unknown to it
        with cuctx.racecheck("collect") as rc:
            x.fill(2.0, stream=s1)
            x.fill(3.0, stream=s2)
        assert [(f.first.stream, f.second.stream) for f in rc.findings] == [(s1, s2)]
        cuctx.synchronize()


def test_a_bad_mode_names_the_modes():
    with pytest.raises(ValueError, match="use 'raise', 'warn', 'collect' or 'off'"):
        cuctx.racecheck("on")


# -- what orders work, as the default checker needs it ---------------------------------------


def test_a_free_racing_a_use_under_an_error_filter_raises_from_the_next_call(kernel):
    """A free runs from a finalizer: where a warnings filter makes the RaceWarning an error
    (as this suite's does), the thread's next cuctx call raises it."""
    s1, s2 = cuctx.Stream(), cuctx.Stream()
    x = cuctx.empty(N, np.float32, stream=s1)
    out = cuctx.empty(N, np.float32, stream=s2)
    cuctx.synchronize()
    kernel[1, 1, 0, s2](out, x, 1.0, 0)  # (n = 0: the sim's twin reads nothing of x)
    with warnings.catch_warnings():
        warnings.simplefilter("error", cuctx.RaceWarning)
        del x
        gc.collect()  # freed on s1 while s2 may still read it: the finalizer cannot raise
        with pytest.raises(cuctx.RaceWarning, match="free while in use"):
            s2.record()
    cuctx.synchronize()


def test_a_synchronize_on_one_thread_orders_what_another_submits_after(kernel):
    """Work handed between threads after a synchronize (a queue, a join) is no race: cuctx
    cannot see Python's queues, so what any thread saw finish counts for every thread."""
    handed: queue.Queue = queue.Queue()
    ctx = cuctx.current_context()

    def produce():
        with ctx:
            s = cuctx.Stream()
            x = cuctx.full(N, 5.0, np.float32, stream=s)
            s.synchronize()
            handed.put(x)

    worker = threading.Thread(target=produce)
    worker.start()
    x = handed.get(timeout=30)
    out = cuctx.zeros(N, np.float32)
    kernel[N // 256, 256](out, x, 1.0, N)  # on the default stream: no wait, no race
    assert out.to_host().tolist() == [6.0] * N
    worker.join()


def test_work_of_a_destroyed_context_is_over(kernel):
    x = cuctx.zeros(N, np.float32)
    other = cuctx.Context.create(cuctx.Device(0))
    try:
        x.context.synchronize()
        copy = cuctx.empty(N, np.float32)  # in `other`
        cuctx.copy(copy, x)  # reads x on `other`'s stream
    finally:
        cuctx.Context.pop()
    other.destroy()  # its work ended with it
    x.fill(1.0)  # no write-after-read with the copy
    cuctx.synchronize()


# -- the suite's own configuration -----------------------------------------------------------

SAMPLE = """
import numpy as np
import cuctx

def test_racy():
    cuctx.set_backend("sim")
    with cuctx.Device(0):
        x = cuctx.zeros(16, np.float32)
        x.fill(1.0, stream=cuctx.Stream())
"""


def test_an_unexpected_race_fails_the_test_that_made_it(tmp_path):
    from test_project import ROOT

    (tmp_path / "test_sample.py").write_text(textwrap.dedent(SAMPLE))
    proc = run_python(
        "-m",
        "pytest",
        "-c",
        str(ROOT / "pyproject.toml"),
        "-p",
        "no:cacheprovider",
        "--rootdir",
        str(tmp_path),
        "test_sample.py",
        cwd=tmp_path,
        clean=True,
    )
    assert proc.returncode == 1, proc.stdout
    assert "FAILED test_sample.py::test_racy - cuctx.errors.RaceWarning" in proc.stdout
