"""Profiles, the per-test environment, the time budget of the long run, and the counts.

``CUCTX_FUZZ`` picks the profile: unset or ``ci`` runs a fixed, derandomized set of examples
that fits in about a minute on a 2-core machine (both machines together); ``long`` runs fresh
random batches until the time budget is spent (scripts/gpu-check runs it on the GPU).
"""

from __future__ import annotations

import contextlib
import functools
import gc
import json
import os
import time

from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

import cuctx

from . import kernels
from .machine import Env
from .model import STATS

_COMMON = {
    "deadline": None,
    "database": None,
    "print_blob": True,
    "suppress_health_check": [
        HealthCheck.too_slow,
        HealthCheck.filter_too_much,
        HealthCheck.data_too_large,
    ],
}
settings.register_profile(
    "cuctx-fuzz-ci", max_examples=200, stateful_step_count=30, derandomize=True, **_COMMON
)
# One batch of the long run; batches repeat (with fresh seeds) until the budget is spent.
# CUCTX_FUZZ_SHRINK=0 reports a failing example as found, unshrunk (shrinking a GPU example
# can take longer than a device run may).
_PHASES = [p for p in Phase if p is not Phase.shrink or os.environ.get("CUCTX_FUZZ_SHRINK") != "0"]
settings.register_profile(
    "cuctx-fuzz-long",
    max_examples=50,
    stateful_step_count=60,
    derandomize=False,
    phases=_PHASES,
    **_COMMON,
)

PROFILE = os.environ.get("CUCTX_FUZZ", "ci") or "ci"
if PROFILE not in ("ci", "long"):
    raise ValueError(f"CUCTX_FUZZ must be 'ci' or 'long', not {PROFILE!r}")
# CUCTX_FUZZ_EXAMPLES=N runs at most N examples of the CI profile in each test (scripts/gpu-check
# asks for fewer in its second pass, where contexts made and reset cost ~0.1 s each on a GPU).
CI_CAP = int(os.environ["CUCTX_FUZZ_EXAMPLES"]) if os.environ.get("CUCTX_FUZZ_EXAMPLES") else None
# Seconds of the long run, shared by the fuzz tests by weight (see `run`).
LONG_BUDGET_S = float(os.environ.get("CUCTX_FUZZ_SECONDS", "200"))


def make_env(backend, cache_dir: str) -> Env:
    """Load the library and read the limits the model needs. Warm the primary context: what
    a driver allocates once per context on first use (the code, stream and event pools,
    shared memory carve-outs, host function and cluster machinery) belongs in the memory
    baseline of every example, not in a leak."""
    library = kernels.load(cache_dir)
    device = cuctx.Device(0)
    p = device.properties
    attrs = {k: library[k].attributes(device) for k in kernels.TWINS}
    with device:
        err, least, greatest = backend.driver.cuCtxGetStreamPriorityRange()
        assert not err, err

    def warm() -> None:
        with device:
            stream = cuctx.Stream()
            start, end = cuctx.Event(timing=True), cuctx.Event()
            start.record(stream)
            counter = cuctx.zeros(1, "uint32", stream=stream)
            optin = p.max_shared_memory_per_block_optin - attrs["count"].shared_size_bytes
            library["count"][1, 32, optin, stream](counter)
            cuctx.launch(library["count"], 2, 32, counter, stream=stream, cooperative=True)
            if p.cluster_launch:
                cuctx.launch(library["count"], 2, 32, counter, stream=stream, cluster=2)
            stream.launch_host_func(int)
            end.record(stream)
            counter.to_host(stream=stream)
            stream.synchronize()
            del counter, stream, start, end
            gc.collect()

    warm()
    limits = {
        "grid": (p.max_grid_dim_x, p.max_grid_dim_y, p.max_grid_dim_z),
        "block": (p.max_block_dim_x, p.max_block_dim_y, p.max_block_dim_z),
        "threads": p.max_threads_per_block,
        "kernel_threads": {k: a.max_threads_per_block for k, a in attrs.items()},
        "static_shared": {k: a.shared_size_bytes for k, a in attrs.items()},
        "shared_optin": p.max_shared_memory_per_block_optin,
        "clusters": bool(p.cluster_launch),
        "sms": p.multiprocessor_count,
    }
    return Env(
        backend,
        library,
        limits,
        (int(least), int(greatest)),
        anchor=device.primary_context,
        warm=warm,
        warmed=device.primary_context,
    )


def run(machine_cls, env: Env, weight: float, examples: int | None = None) -> None:
    """Run the machine under the active profile (``examples`` overrides the CI profile's
    count). The long profile repeats batches until its share (``weight``) of the time budget
    is spent; a failure stops it with the example."""
    factory = lambda: machine_cls(env)
    if PROFILE == "ci":
        ci = settings.get_profile("cuctx-fuzz-ci")
        count = ci.max_examples if examples is None else examples
        if CI_CAP is not None:
            count = min(count, CI_CAP)
        _run_frozen(factory, settings(ci, max_examples=count))
        return
    deadline = time.monotonic() + LONG_BUDGET_S * weight
    batch = settings.get_profile("cuctx-fuzz-long")
    while time.monotonic() < deadline:
        _run_frozen(factory, batch)


def _run_frozen(factory, profile: settings) -> None:
    """Run the examples, each with what was alive before it frozen (gc.freeze): Hypothesis
    keeps every example's choices, tens of thousands of objects by the end, and without this
    the examples' own gc.collect() calls, which visit them all, cost most of the run. Nothing
    an example judges is frozen: the previous one was checked and released in its teardown,
    and the next reads its memory baseline after the freeze. Afterwards what the examples left
    is collected, and everything alive frozen again, as tests/conftest.py does."""

    @functools.wraps(factory)  # Hypothesis derives the examples from the factory's source
    def frozen_factory():
        gc.collect()
        gc.freeze()
        return factory()

    try:
        run_state_machine_as_test(frozen_factory, settings=profile)
    finally:
        gc.unfreeze()
        gc.collect()
        gc.freeze()


@contextlib.contextmanager
def counted(request, name: str):
    """Count what the block's fuzzing does; print the counts past pytest's output capture
    (so gpu-check's log shows them), failed or not."""
    STATS.__init__()
    try:
        yield
    finally:
        capture = request.config.pluginmanager.get_plugin("capturemanager")
        with capture.global_and_fixture_disabled():
            print(f"\n{summary(name)}")


def summary(name: str) -> str:
    """One line of counts, and the same as JSON under $OUT when it is set."""
    s = STATS
    top = ", ".join(f"{k} {v}" for k, v in s.rules.most_common())
    errors = ", ".join(f"{k} {v}" for k, v in s.errors.most_common())
    line = (
        f"cuctx fuzz {name} ({PROFILE}): {s.examples} examples, {s.steps} steps; "
        f"rules: {top}; errors raised as the model expected: {errors or 'none'}"
    )
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, f"fuzz-counts-{name}.json"), "w") as f:
            json.dump(
                {
                    "profile": PROFILE,
                    "examples": s.examples,
                    "steps": s.steps,
                    "rules": dict(s.rules),
                    "errors": dict(s.errors),
                },
                f,
                indent=1,
            )
    return line
