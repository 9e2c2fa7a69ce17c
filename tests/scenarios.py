"""Scenarios several test modules share: the `add` kernel with its sim twin, a library loaded
for one test, a graph run to completion, a block on the Python paths, a Python child
process, two streams handing a value over, and the race checker retiring its history.

Fixtures that every test may ask for by name (``backend``, ``sim``, ``gpu``, ``nvrtc_cache``)
are in conftest.py; what a test module builds from, imports from here.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

import cuctx
from conftest import busy

# The checkout's sources: a child process imports this cuctx, installed or not.
SRC = pathlib.Path(cuctx.__file__).resolve().parents[1]

ADD_SOURCE = r"""
extern "C" __global__ void add(float* out, const float* x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = x[i] + a;
}
"""


def add(grid, block, out, x, a: float, n):
    """The sim twin of ADD_SOURCE's `add`."""
    out.view(np.float32, n)[:] = x.view(np.float32, n) + np.float32(a)


def add_arrays(n: int = 8) -> tuple[cuctx.DeviceArray, cuctx.DeviceArray]:
    """`add`'s output (zeros) and input (0, 1, ..., n-1), float32 on the current context,
    ready for work on any of its streams (made on the current stream, then synchronized)."""
    arrays = cuctx.zeros(n, np.float32), cuctx.to_device(np.arange(n, dtype=np.float32))
    cuctx.current_stream().synchronize()
    return arrays


def run_graph(graph: cuctx.Graph, times: int = 1) -> None:
    """Instantiate ``graph`` and launch it ``times`` times on the current stream (ordered
    after the arrays' allocation and upload), then wait for it."""
    exe = graph.instantiate()
    for _ in range(times):
        exe.launch()
    cuctx.current_stream().synchronize()


@contextlib.contextmanager
def python_paths(backend: Any) -> Iterator[None]:
    """Inside the block, ``backend``'s compiled paths are off: its checked Python paths (and
    their generated fast paths) take every call."""
    native = backend.native
    backend.native = None
    try:
        yield
    finally:
        backend.native = native


def library_fixture(source: str, **twins: Callable[..., Any]) -> Any:
    """A ``lib`` fixture: the source loaded on the test's backend, with these sim twins, while
    device 0's primary context is current. In a test module: ``lib = library_fixture(...)``."""

    @pytest.fixture
    def lib(backend) -> Iterator[cuctx.Library]:
        library = cuctx.Library.from_source(source, sim_kernels=twins)
        with cuctx.Device(0):
            yield library

    return lib


def child_env(clean: bool = False, **env: str) -> dict[str, str]:
    """This process's environment for a child (without its CUCTX_ settings where ``clean``),
    with ``env`` over it and the checkout's sources first on PYTHONPATH."""
    environ = {k: v for k, v in os.environ.items() if not (clean and k.startswith("CUCTX_"))}
    environ.update(env)
    environ["PYTHONPATH"] = os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])
    return environ


def run_python(
    *args: str,
    input: str | None = None,
    cwd: os.PathLike | None = None,
    timeout: float = 120,
    clean: bool = False,
    **env: str,
) -> subprocess.CompletedProcess[str]:
    """``python ARGS`` in a fresh interpreter, as a user would run it: the environment of
    `child_env`, output captured as text, killed after ``timeout`` seconds."""
    return subprocess.run(
        [sys.executable, *args],
        input=input,
        cwd=cwd,
        capture_output=True,
        text=True,
        env=child_env(clean, **env),
        timeout=timeout,
    )


class Handoff:
    """A value that ``producer`` changes from "old" to "new" after ``ms`` of queued work; a
    host function on another stream reads it, so what it saw tells whether that stream's
    work ran after the producer's."""

    def __init__(self, producer: cuctx.Stream, ms: float = 20) -> None:
        self.box = ["old"]
        busy(producer, ms)
        producer.launch_host_func(self.box.__setitem__, 0, "new")

    def seen_by(self, consumer: cuctx.Stream) -> list[str]:
        """Queue the read on ``consumer``, wait for it; the values read (one)."""
        seen: list[str] = []
        consumer.launch_host_func(lambda: seen.append(self.box[0]))
        consumer.synchronize()
        return seen


def driver_calls(
    monkeypatch: pytest.MonkeyPatch, driver: Any, *names: str
) -> list[tuple[str, tuple]]:
    """The calls of the driver functions ``names`` from now on, in order, as (name, args);
    each still reaches the driver."""
    calls: list[tuple[str, tuple]] = []
    for name in names:
        real = getattr(driver, name)
        monkeypatch.setattr(
            driver,
            name,
            lambda *args, real=real, name=name: calls.append((name, args)) or real(*args),
            raising=False,
        )
    return calls


def retire_history() -> None:
    """The race checker forgets what the host has seen finish, as it does at a synchronize
    once enough operations ran (twice: a stream idle since the first time loses its clock at
    the second)."""
    from cuctx.tools._racecheck_run import _WATCH

    with _WATCH.lock:
        _WATCH._sweep()
        _WATCH._sweep()
