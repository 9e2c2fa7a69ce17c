"""Dev tool: where an AutoGraph build's time goes, step by step, for the 50-kernel step
(docs' form) and a chain of tiny kernels: the call recorded, its graph constructed from the
recording, instantiated, the compiled patcher made; beside raw cuda.bindings adding the same
kernel nodes and instantiating them (on a GPU), and a profile of the build's Python.

    python scripts/probe_autograph_build.py [--profile]
"""

import cProfile
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import numpy as np  # noqa: E402

import cuctx  # noqa: E402
from cuctx import _record  # noqa: E402
from cuctx.graphs._autograph_build import construct, patcher  # noqa: E402
from cuctx.graphs._autograph_record import Recording  # noqa: E402
from _autograph_loops import FMA_SOURCE, axpb_twin, step50, tiny_chain  # noqa: E402

ROUNDS = 7


def record(fn, *args) -> Recording:
    auto = cuctx.autograph(fn)
    recording = Recording(auto._arena)
    _record.start(recording)
    try:
        fn(*args)
    finally:
        _record.stop()
    return recording


def best(fn) -> float:
    times = []
    for _ in range(ROUNDS):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times) * 1e6


def steps_of(recording: Recording) -> None:
    n = len(recording.keys)
    native = recording.ctx._backend.native
    held = {}

    def do_construct():
        held["graph"], held["nodes"], _ = construct(recording)

    def do_instantiate():
        held["exe"] = held["graph"].instantiate()

    def driver_instantiate():  # the driver's share of do_instantiate
        drv = recording.ctx._backend.driver
        with recording.ctx:
            err, exe = drv.cuGraphInstantiate(held["graph"]._handle, 0)
            assert not err, err
            drv.cuGraphExecDestroy(exe)

    def do_patcher():
        if native is not None:
            patcher(native, held["exe"], held["nodes"])

    def do_destroy():
        held.pop("exe").destroy()

    parts = {}
    for _ in range(ROUNDS):
        for name, step in (
            ("construct", do_construct),
            ("driver's instantiate+destroy", driver_instantiate),
            ("instantiate", do_instantiate),
            ("patcher", do_patcher),
            ("destroy", do_destroy),
        ):
            t0 = time.perf_counter()
            step()
            parts.setdefault(name, []).append((time.perf_counter() - t0) * 1e6)
    line = "  ".join(f"{k} {min(v):8.1f} ({min(v) / n:5.2f}/node)" for k, v in parts.items())
    print(f"  {n} operations, us best of {ROUNDS}: {line}")
    if native is not None and getattr(native, "builds", None):
        print("  (kernel nodes added in C: native.builds)")
    if cuctx.backend().name == "cuda":
        raw(recording)
    if "--profile" in sys.argv:
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(20):
            do_construct()
            do_instantiate()
            do_patcher()
            do_destroy()
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(18)


def raw(recording: Recording) -> None:
    """The same kernel nodes through cuda.bindings (one parameter struct reused), and the
    instantiate, as a careful Python user would."""
    from cuda.bindings import driver as drv
    from cuctx.graphs._nodes import KernelParams
    from cuctx.kernels._launcher import Launcher

    launches = [(k, v) for k, v in zip(recording.keys, recording.values) if k.__class__ is Launcher]
    ctx = recording.ctx
    first = launches[0][0]
    params = KernelParams(first.kernel, first.config, ctx)
    held = {}

    def add():
        err, graph = drv.cuGraphCreate(0)
        prev = []
        for _launcher, data in launches:
            params.buffer[: len(data)] = data
            err, node = drv.cuGraphAddKernelNode(graph, prev, len(prev), params.struct)
            assert not err, err
            prev = [node]
        held["graph"] = graph

    def inst():
        err, held["exe"] = drv.cuGraphInstantiate(held["graph"], 0)
        assert not err, err

    def destroy():
        drv.cuGraphExecDestroy(held.pop("exe"))
        drv.cuGraphDestroy(held.pop("graph"))

    with ctx:
        parts = {}
        for _ in range(ROUNDS):
            for name, step in (("add", add), ("instantiate", inst), ("destroy", destroy)):
                t0 = time.perf_counter()
                step()
                parts.setdefault(name, []).append((time.perf_counter() - t0) * 1e6)
    n = len(launches)
    print(
        "  raw cuda.bindings: "
        + "  ".join(f"{k} {min(v):8.1f} ({min(v) / n:5.2f}/node)" for k, v in parts.items())
    )


def main() -> None:
    print(f"backend: {cuctx.backend()}")
    sim = cuctx.backend().sim is not None
    n = 1024 if sim else 65536
    kernel = cuctx.Library.from_source(FMA_SOURCE, sim_kernels={"axpb": axpb_twin})["axpb"]
    stream = cuctx.Stream()
    with stream:
        step = step50(kernel, stream, n, "docs")
        x = cuctx.full(n, 1.0, np.float32)
        step(x)
        stream.synchronize()
        print("50-kernel step, docs' form:")
        steps_of(record(step, x))
    for size in (50, 1000):
        _, s, _, chain = tiny_chain(size)
        chain()
        s.synchronize()
        print(f"chain of {size} tiny kernels:")
        steps_of(record(chain))


if __name__ == "__main__":
    with cuctx.racecheck("off"):
        main()
