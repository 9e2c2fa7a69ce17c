"""The generated fast path of a launcher: its source is kept and readable (linecache,
inspect, tracebacks), CUCTX_FASTPATH turns it off, and one launcher serves every thread.
Sim and GPU."""

from __future__ import annotations

import inspect
import linecache
import re
import threading
import traceback

import numpy as np
import pytest

import cuctx
from cuctx.kernels import _codegen, _launcher, _plan

from conftest import requires_fast_paths
from scenarios import ADD_SOURCE, add, add_arrays, library_fixture, run_python

pytestmark = [pytest.mark.usefixtures("nvrtc_cache"), pytest.mark.paths("python")]

lib = library_fixture(ADD_SOURCE, add=add)


@pytest.fixture
def packs(monkeypatch):
    """How often the checked path packed arguments (the fast path never calls Plan.pack)."""
    calls = []
    pack = _plan.Plan.pack
    monkeypatch.setattr(_plan.Plan, "pack", lambda *a: (calls.append(1), pack(*a))[1])
    return calls


@requires_fast_paths
def test_the_source_is_kept_named_and_readable(lib):
    out, x = add_arrays()
    launcher = lib["add"][1, 8]
    assert launcher.fast_source is None  # nothing generated before the first launch
    launcher(out, x, 1.0, 8)
    source = launcher.fast_source
    assert source.startswith("def launch(args):") and "pack_into(buffer" in source
    name = launcher._fast.__code__.co_filename
    # Numbered ("... #2>") when another test of this process generated other source under
    # the same name (another kernel called add, on another backend or path).
    assert re.fullmatch(
        r"<cuctx fast launch add \(DeviceArray, DeviceArray, float, int\)"
        r"( #\d+)?>",
        name,
    )
    assert "".join(linecache.getlines(name)) == source
    assert inspect.getsource(launcher._fast) == source


@requires_fast_paths
def test_a_traceback_from_inside_the_fast_path_shows_its_line(lib):
    out, x = add_arrays()
    launcher = lib["add"][1, 8]
    launcher(out, x, 1.0, 8)  # generates the fast path and this thread's state

    def driver_call():
        raise RuntimeError("the driver call failed")

    buffer, _ = launcher._local.state
    launcher._local.state = (buffer, driver_call)
    with pytest.raises(RuntimeError) as info:
        launcher(out, x, 2.0, 8)
    text = "".join(traceback.format_exception(info.value))
    name = launcher._fast.__code__.co_filename
    line = launcher.fast_source.splitlines().index("    err, = go()") + 1
    assert f'File "{name}", line {line}, in launch\n    err, = go()\n' in text


def test_fast_paths_can_be_turned_off(lib, monkeypatch, packs):
    monkeypatch.setattr(_codegen, "ENABLED", False)
    out, x = add_arrays()
    launcher = lib["add"][1, 8]
    for k in range(3):
        launcher(out, x, float(k), 8)
    assert launcher.fast_source is None and launcher._fast is None
    assert len(packs) == 3  # every launch took the checked path
    assert out.to_host().tolist() == list(range(2, 10))


def test_cuctx_fastpath_0_in_the_environment_turns_them_off():
    code = "import cuctx.kernels._codegen as c; print(c.ENABLED)"
    for value, expected in (("0", "False"), ("1", "True")):
        proc = run_python("-c", code, CUCTX_FASTPATH=value)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() == expected


@requires_fast_paths
def test_one_launcher_serves_every_thread_on_its_fast_path(lib, packs):
    out, x = add_arrays()
    launcher = lib["add"][1, 8]
    launcher(out, x, 1.0, 8)  # the fast path, made on this thread
    results = {}

    def work(k):
        with cuctx.Device(0):
            mine = cuctx.zeros(8, np.float32)
            before = len(packs)
            for _ in range(5):
                launcher(mine, x, float(k), 8)
            # The thread's first launch makes its parameter buffer on the checked path;
            # the others run the fast path with it.
            results[k] = (len(packs) - before, mine)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(1, 4)]
    for t in threads:
        t.start()
        t.join()  # one at a time: each counts its own checked launches
    cuctx.current_stream().synchronize()
    for k, (checked, mine) in results.items():
        assert checked == 1
        assert mine.to_host().tolist() == (np.arange(8) + k).tolist()


@requires_fast_paths
def test_the_fast_path_follows_argument_types_that_changed(lib, packs):
    out, x = add_arrays()
    launcher = lib["add"][1, 8]
    launcher(out, x, 1.0, 8)
    first = launcher._fast
    follow = _launcher._FOLLOW_AFTER
    for _ in range(follow + 3):  # other types for good: a few checked launches, then fast
        launcher(out, x, np.float32(2), np.int32(8))
    assert len(packs) == 1 + follow and launcher._fast is not first
    assert "(DeviceArray, DeviceArray, float32, int32)" in launcher._fast.__code__.co_filename
    for _ in range(follow + 3):  # back: the first fast path, kept, not generated again
        launcher(out, x, 3.0, 8)
    assert launcher._fast is first and len(packs) == 1 + 2 * follow
    assert out.to_host().tolist() == list(range(3, 11))
