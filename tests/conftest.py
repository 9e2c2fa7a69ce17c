"""Every scenario runs on each backend available: the sim everywhere, cuda where a GPU is.

The ``backend`` fixture switches cuctx to one backend for the test (a fresh sim for each
test, so no state leaks) and checks afterwards that the test left this thread's context
stack as it found it: a test that leaks a pushed context fails.

The hot paths (launch, record, wait, context switches) have a compiled path and the checked
Python paths. A module marked ``pytest.mark.paths()`` runs each of its tests on the compiled
path, the generated Python fast paths and the checked paths with the race checker watching
(ids ``[sim-native]``, ``[sim-python]``, ``[sim-checked]``); ``paths("python", "native")``
names some of them. Others run on what the backend loaded (the compiled path where it is
built, unless ``CUCTX_NATIVE=0``).

On the sim the race checker watches every test, as it watches every run by default
(docs/checks.md; run the suite with ``CUCTX_RACECHECK`` unset): pyproject's
``filterwarnings`` makes a `cuctx.RaceWarning` fail the test that caused it. Only the
"native" and "python" variants step it aside, since under a trace sink every call takes the
checked path and they would not reach the path they name.
"""

from __future__ import annotations

import gc
import os
import random
import sys
import time
from collections import Counter, defaultdict
from contextlib import contextmanager, nullcontext
from typing import Any

import pytest

import cuctx
import cuctx.sim
from cuctx import _driver
from cuctx._driver import ThreadState
from cuctx._driver.cuda import probe
from cuctx.graphs import _autograph, _autograph_policy
from cuctx.kernels import _codegen
from cuctx.kernels._compiler import nvrtc_version

_cuda_driver, CUDA_REASON = probe()
HAVE_GPU = _cuda_driver is not None


def _nvrtc_missing() -> str | None:
    try:
        nvrtc_version()
    except RuntimeError as exc:
        return str(exc)
    return None


NVRTC_MISSING = _nvrtc_missing()
requires_nvrtc = pytest.mark.skipif(
    NVRTC_MISSING is not None, reason=f"NVRTC cannot be loaded: {NVRTC_MISSING}"
)
# For tests of what a launch fast path does: CUCTX_FASTPATH=0 turns them off (both kinds).
requires_fast_paths = pytest.mark.skipif(
    not _codegen.ENABLED, reason="launch fast paths are turned off (CUCTX_FASTPATH=0)"
)

# CUCTX_TEST_BACKENDS="cuda" (scripts/gpu-check's first pass): the variants of the other
# backends skip. The sim's run in CI exactly so (the README's test command); on the device
# machine they only took its time.
_ONLY_BACKENDS = os.environ.get("CUCTX_TEST_BACKENDS")


def _variant(name: str, *marks) -> Any:
    if _ONLY_BACKENDS is not None and name not in _ONLY_BACKENDS.split(","):
        marks = (
            *marks,
            pytest.mark.skip(
                reason=f"the {name} variant runs elsewhere (CUCTX_TEST_BACKENDS={_ONLY_BACKENDS}; "
                "the sim's in CI)"
            ),
        )
    return pytest.param(name, id=name, marks=list(marks))


BACKENDS = [
    _variant("sim"),
    _variant(
        "cuda",
        pytest.mark.gpu,
        pytest.mark.skipif(not HAVE_GPU, reason=f"needs a GPU: {CUDA_REASON}"),
    ),
]


def fresh(name: str) -> _driver.Backend:
    if name == "sim":
        _driver._loaded.pop("sim", None)
    return cuctx.set_backend(name)


def _empty_stack(backend) -> list[int]:
    """Pop this thread's whole context stack; return the handles that were on it, top first.
    Popping is safe even for destroyed contexts; pushing them back would not be, so none are."""
    handles = []
    while True:
        err, handle = backend.driver.cuCtxPopCurrent()
        if err:
            return handles
        handles.append(int(handle))


PATHS = ("python", "native", "checked")


@pytest.fixture
def path(request) -> str:
    """Which path the hot paths take: "native" (compiled), "python" (the checked paths and
    their generated fast paths), both with the race checker off; "checked" (the checked
    paths, under the race checker, as on the sim by default), or "default" (what the
    backend loaded, and the race checker as the backend has it)."""
    return getattr(request, "param", "default")


# CUCTX_TEST_PATHS="checked" (scripts/gpu-check's second pass, CUCTX_NATIVE=0): run only
# these of the named path variants. The second pass exists for the tests that run on what the
# backend loaded; the "python" variants already ran in the first pass exactly as they would
# here, and the "native" ones would skip.
_ONLY_PATHS = os.environ.get("CUCTX_TEST_PATHS")


def pytest_generate_tests(metafunc):
    marker = metafunc.definition.get_closest_marker("paths")
    if marker is not None and "path" in metafunc.fixturenames:
        names = marker.args or PATHS
        if _ONLY_PATHS is not None:
            ran = pytest.mark.skip(
                reason=f"this path variant ran in the first pass (CUCTX_TEST_PATHS={_ONLY_PATHS})"
            )
            names = [
                n if n in _ONLY_PATHS.split(",") else pytest.param(n, marks=ran) for n in names
            ]
        metafunc.parametrize("path", names, indirect=True)


@contextmanager
def on_path(b: _driver.Backend, path: str):
    """Run with ``b``'s hot paths on ``path`` (see `path`), restoring its slot after."""
    native = b.native
    if path == "python":
        b.native = None
    elif path == "native" and native is None:
        pytest.skip(f"the compiled fast path is off: {b.native_reason}")
    checker = {"python": "off", "native": "off", "checked": "warn"}.get(path)
    try:
        with cuctx.racecheck(checker) if checker else nullcontext():
            yield b
    finally:
        b.native = native


# pytest -n: the other test processes allocate and free on the same GPU meanwhile.
GPU_SHARED = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1


def pytest_runtest_setup(item):
    """A test of the cuda backend (its parameter's `gpu` mark: `backend`'s, or a subprocess
    run on "cuda") that must have the GPU alone skips under pytest -n."""
    if item.get_closest_marker("gpu") is not None:
        _needs_the_gpu_alone(item)


def _needs_the_gpu_alone(node) -> None:
    """A test marked ``device_memory`` judges the GPU's free memory (cuMemGetInfo), which
    every process on the GPU changes; one marked ``host_timing`` judges what depends on the
    host's own speed (AutoGraph's decisions from measured costs, a timeline's overlap), which
    a machine running a test process per core slows several-fold (an H200 host with 32 of
    them: AutoGraph built no graph for the decoding loop it builds for alone). On the cuda
    backend both skip under pytest -n, and scripts/gpu-check runs them after its parallel
    pass, in one process. On the sim each process has its own virtual GPU and clock."""
    if GPU_SHARED:
        for marker, why in _ALONE.items():
            if node.get_closest_marker(marker):
                pytest.skip(
                    f"{why}, which the other test processes change: run it without "
                    "-n (scripts/gpu-check does)"
                )


_ALONE = {
    "device_memory": "judges (or takes for a moment) the GPU's free memory",
    "host_timing": "judges what the host's own speed decides",
}


@pytest.fixture(params=BACKENDS)
def backend(request, path):
    """The backend for one test, on an empty context stack (other libraries on the GPU,
    such as torch or cuda.core, leave their contexts current on the main thread)."""
    with on_path(fresh(request.param), path) as b, _primary_held(b, request):
        yield from _checked_stack(b)


# Handles of the devices whose primary context this process holds (cuda: for the whole run).
_held: dict[int, list[int]] = {}


@contextmanager
def _primary_held(b: _driver.Backend, request):
    """Hold every device's primary context during the test (cuDevicePrimaryCtxRetain), as the
    other code of a real program does (PyTorch and CuPy keep it for good). Without a hold,
    each test's last reference destroys the context and the next test creates it again:
    about 0.1 s alone, and seconds a test when a process per CPU does the same on one GPU
    (the driver serializes context creation). On the cuda backend the hold lasts the whole
    run (a device reset leaves it in place, as the driver promises); the sim is fresh for each
    test and takes it afresh. A test that judges when cuctx itself releases the primary
    context is marked ``primary_unheld`` and runs without the hold."""
    drv = b.driver
    key = id(b)
    if key not in _held:
        err, count = drv.cuDeviceGetCount()
        handles = [drv.cuDeviceGet(i)[1] for i in range(0 if err else count)]
        for handle in handles:
            drv.cuDevicePrimaryCtxRetain(handle)
        _held[key] = handles
    unheld = request.node.get_closest_marker("primary_unheld") is not None
    if unheld:
        for handle in _held[key]:
            drv.cuDevicePrimaryCtxRelease(handle)
    try:
        yield
    finally:
        if unheld:
            for handle in _held[key]:
                drv.cuDevicePrimaryCtxRetain(handle)
        if b.sim is not None:  # this sim is not used again: forget its hold with it
            del _held[key]


def _checked_stack(b: _driver.Backend):
    _empty_stack(b)
    yield b
    leaked = _empty_stack(b)
    # Lazy initialisation and Device.set_current leave a primary context current for good, as
    # the runtime API does: at the bottom of the stack, that one is no leak.
    runtime = {
        d._runtime_primary.handle for d in b.devices.values() if d._runtime_primary is not None
    }
    if leaked and leaked[-1] in runtime:
        leaked.pop()
    b.tls.state = ThreadState()  # a fresh per-thread state for the next test
    for device in b.devices.values():  # what Device.set_current retained, as cudaSetDevice does
        device._runtime_primary = None
    gc.collect()
    assert not leaked, f"the test left {len(leaked)} context(s) pushed on this thread's stack"


@pytest.fixture
def sim(path):
    """The sim alone, for what only the sim can show (fault injection, its device model)."""
    with on_path(fresh("sim"), path) as b:
        yield b


@pytest.fixture
def gpu(request, path):
    """The cuda backend for GPU-only tests (interop with torch, CuPy, Numba, cuda.core)."""
    if not HAVE_GPU:
        pytest.skip(f"needs a GPU: {CUDA_REASON}")
    _needs_the_gpu_alone(request.node)
    with on_path(fresh("cuda"), path) as b, _primary_held(b, request):
        yield from _foreign_cleanup(b)


def _foreign_cleanup(b: _driver.Backend):
    yield b
    _release_foreign_caches()
    _empty_stack(b)  # the other libraries may have made their contexts current
    b.tls.state = ThreadState()


@pytest.fixture
def nvrtc_cache(tmp_path_factory, monkeypatch):
    """One compile cache for the whole run, apart from the user's own: modules that compile
    use it with ``pytestmark = pytest.mark.usefixtures("nvrtc_cache")``."""
    path = tmp_path_factory.getbasetemp() / "nvrtc-cache"
    monkeypatch.setenv("CUCTX_CACHE_DIR", str(path))
    return path


@pytest.fixture
def graphs_pay(monkeypatch):
    """AutoGraph's costs out of its decisions: they are modelled on the sim and measured on a
    GPU, where they vary from machine to machine; the tests of AutoGraph's mechanics take
    them out (a graph is built once a structure repeats, and stays), its policy's tests put
    them back (`costs_decide`)."""
    monkeypatch.setattr(_autograph, "SWITCH_AFTER", 10**9)
    monkeypatch.setattr(_autograph_policy.Policy, "too_costly", lambda self, entry: None)


@pytest.fixture
def costs_decide(graphs_pay, monkeypatch):
    """AutoGraph's costs back in its decisions (see `graphs_pay`)."""
    monkeypatch.setattr(_autograph, "SWITCH_AFTER", _autograph_policy.SWITCH_AFTER)
    monkeypatch.setattr(_autograph_policy.Policy, "too_costly", _TOO_COSTLY)


_TOO_COSTLY = _autograph_policy.Policy.too_costly  # (taken before any test replaces it)


def _release_foreign_caches() -> None:
    """Give back the device memory other libraries cache in the primary context they share
    with cuctx. Later tests reset the device, which destroys that context for every library
    in the process (as cudaDeviceReset does); a CuPy pool block kept past it is freed at
    interpreter exit into the destroyed context, and CuPy's finalizer then fails while the
    interpreter is torn down ("Error in sys.excepthook")."""
    gc.collect()  # the test's arrays go back to their pools first
    cupy = sys.modules.get("cupy")
    if cupy is not None:
        cupy.cuda.Device().synchronize()
        cupy.get_default_memory_pool().free_all_blocks()
        cupy.get_default_pinned_memory_pool().free_all_blocks()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def busy(stream, ms: float) -> None:
    """Queue work that takes ``ms`` milliseconds on ``stream``: virtual time on the sim
    (`cuctx.sim.stream_busy`), a sleeping host function on a GPU."""
    if stream._backend.sim is not None:
        cuctx.sim.stream_busy(stream, int(ms * 1_000_000))
    else:
        stream.launch_host_func(time.sleep, ms / 1000)


# CUCTX_TEST_SHUFFLE=SEED: the tests run in an order shuffled by the integer SEED (the same
# order in every process of pytest -n, as xdist requires), to show a test that passes only
# after or before another. Such orders found state that outlived its test and hid bugs: a
# stream's queue taken by a late stream of an earlier context with the same handles, and a
# compiled lookup that kept a destroyed context. The Ray tests are not ready for it: their
# clusters are set up per module, and a shuffle sets them up again and again.
_SHUFFLE = os.environ.get("CUCTX_TEST_SHUFFLE")


def pytest_collection_modifyitems(config, items):
    if not _SHUFFLE:
        return
    try:
        seed = int(_SHUFFLE)
    except ValueError:
        raise pytest.UsageError(
            f"CUCTX_TEST_SHUFFLE={_SHUFFLE!r}: give an integer seed (the order it shuffles "
            "the tests in is the same for the same seed)"
        ) from None
    random.Random(seed).shuffle(items)


def pytest_report_header(config):
    return f"tests shuffled: CUCTX_TEST_SHUFFLE={_SHUFFLE}" if _SHUFFLE else None


def pytest_collection_finish(session):
    """Freeze what collection made (modules, tests, their parameters: it lives for the whole
    run), so that garbage collections skip it. Tests call gc.collect() often (every `backend`
    teardown does, so finalizers run while its backend is current), and a full collection
    visits every tracked object: with cuda.bindings imported one took about 50 ms, and they
    were most of the suite's CPU time (91 of 107 s in tests/core and tests/memory). What
    tests make is collected as before."""
    gc.collect()
    gc.freeze()


# The tests running now, by node id (from every worker under pytest -n), to name them when
# the run is interrupted: scripts/gpu-check stops a pass that runs too long with SIGINT.
_running: dict[str, None] = {}


def pytest_runtest_logstart(nodeid, location):
    _running[nodeid] = None


def pytest_runtest_logreport(report):
    if report.when == "teardown":
        _running.pop(report.nodeid, None)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """The tests that were running if the run was interrupted; then skipped tests grouped by
    reason, one line per reason with counts.

    Without a GPU about half the suite skips for one reason; pytest's ``-rs`` prints a line per
    skipped test, which buries failures. pyproject's ``-rfExX`` keeps pytest's own lines for
    failures, errors and xfails; asking for ``-rs``/``-ra`` brings back pytest's skip lines,
    and then this summary stays out of the way."""
    if exitstatus == pytest.ExitCode.INTERRUPTED and _running:
        terminalreporter.write_sep("=", f"{len(_running)} test(s) running when interrupted")
        for nodeid in _running:
            terminalreporter.write_line(nodeid)
    skipped = terminalreporter.stats.get("skipped", [])
    if not skipped or any(c in config.option.reportchars for c in "sSaA"):
        return
    counts: Counter[str] = Counter()
    files: defaultdict[str, set[str]] = defaultdict(set)
    for report in skipped:
        path, _, reason = report.longrepr
        reason = reason.removeprefix("Skipped: ")
        counts[reason] += 1
        files[reason].add(path)
    terminalreporter.write_sep("=", f"{len(skipped)} skipped, by reason")
    for reason, count in counts.most_common():
        where = len(files[reason])
        terminalreporter.write_line(f"{count:4} in {where} file{'s' * (where != 1)}: {reason}")
