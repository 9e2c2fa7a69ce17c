"""Dev tool: where the time of AutoGraph's calls goes in the loops whose shape changes
(benchmarks/_autograph_loops.py's small decoding-like loop and 64-call loop): eager and
AutoGraph runs from a cold start, us per call; AutoGraph's own split (stats: recording,
replay, update, build, eager); the policy's reasons in the last run; with ``--profile`` a
profile of one run of each.

    python scripts/probe_autograph_calls.py [--profile]
"""

import cProfile
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import numpy as np  # noqa: E402

import cuctx  # noqa: E402
from cuctx.graphs import _autograph, _autograph_policy  # noqa: E402
from cuctx.graphs._graph import Graph  # noqa: E402
from _autograph_loops import (
    FMA_SOURCE,
    LENGTH_CALLS,
    SMALL,
    axpb_twin,  # noqa: E402
    length_token,
    small_token,
)

RUNS = 5


def loop(fn, stream, x, calls, first):
    for k in range(first, first + calls):
        fn(cuctx.empty(SMALL, np.float32, stream=stream), x, k)


def timed(make, stream, x, calls, first):
    stream.synchronize()
    fn = make()
    t0 = time.perf_counter()
    loop(fn, stream, x, calls, first)
    stream.synchronize()
    return (time.perf_counter() - t0) / calls * 1e6, fn


BUILT = []  # (nodes, us) of every build AutoGraph measured in this process


def log_builds() -> None:
    """Log each build AutoGraph measures, and the time of its construct and instantiate
    (``c+i``: what it measured should be their sum)."""
    add, construct, instantiate = (
        _autograph_policy.BuildCosts.add,
        _autograph.construct,
        Graph.instantiate,
    )
    parts = []

    def logged(self, nodes, seconds, context=0):
        BUILT.append((nodes, round(seconds * 1e6, 1), "c+i", [round(p, 1) for p in parts]))
        parts.clear()
        return add(self, nodes, seconds, context)

    def timed(fn):
        def run(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                parts.append((time.perf_counter() - t0) * 1e6)

        return run

    _autograph_policy.BuildCosts.add = logged
    _autograph.construct = timed(construct)
    Graph.instantiate = timed(instantiate)


def main() -> None:
    log_builds()
    print(f"backend: {cuctx.backend()}")
    kernel = cuctx.Library.from_source(FMA_SOURCE, sim_kernels={"axpb": axpb_twin})["axpb"]
    stream = cuctx.Stream()
    x = cuctx.full(SMALL, 1.0, np.float32, stream=stream)
    for name, make_token, first, calls in (
        ("small decoding loop", small_token, 0, 256),
        ("64-call loop", length_token, 1, LENGTH_CALLS),
    ):
        token = make_token(kernel, stream)
        print(f"== {name}, {calls} calls, us per call")
        for run in range(RUNS):
            eager, _ = timed(lambda t=token: t, stream, x, calls, first)
            auto, fn = timed(lambda t=token: cuctx.autograph(t), stream, x, calls, first)
            s = fn.stats()
            split = ", ".join(
                f"{k} {s[k + '_s'] * 1e6 / calls:.1f}"
                for k in ("recording", "replay", "update", "build", "eager")
            )
            print(
                f"  run {run}: eager {eager:7.1f}  AutoGraph {auto:7.1f}  "
                f"(replays {s['replays']}, updates {s['updates']}, builds {s['builds']}, "
                f"eager {s['eager']}; per call: {split})"
            )
            print(
                f"    builds measured (nodes, us): {BUILT}; the fit (fixed us, us a node): "
                f"{[round(v * 1e6, 2) for v in _autograph_policy.BUILDS.fit() or ()]}"
            )
            BUILT.clear()
            if run == 0 or s["eager"] > 12:  # the first run, and runs mostly eager
                for reason in s["reasons"][-12:]:
                    print(f"    call {reason['call']}: {reason['action']}: {reason['reason']}")
        if "--profile" in sys.argv:
            for label, make in (
                ("eager", lambda t=token: t),
                ("AutoGraph", lambda t=token: cuctx.autograph(t)),
            ):
                fn = make()
                prof = cProfile.Profile()
                prof.enable()
                loop(fn, stream, x, calls, first)
                stream.synchronize()
                prof.disable()
                print(f"-- profile: {label}")
                pstats.Stats(prof).sort_stats("tottime").print_stats(22)


def steady() -> None:
    """One structure (the small loop's first, 5 kernels) once built: us per call of its
    pieces, each alone: AutoGraph's graph call (the output made by the caller), the same
    eagerly, the caller's ``cuctx.empty`` of the output, one launch."""
    kernel = cuctx.Library.from_source(FMA_SOURCE, sim_kernels={"axpb": axpb_twin})["axpb"]
    stream = cuctx.Stream()
    x = cuctx.full(SMALL, 1.0, np.float32, stream=stream)
    token = small_token(kernel, stream)
    auto = cuctx.autograph(token)
    outs = [cuctx.empty(SMALL, np.float32, stream=stream) for _ in range(16)]
    for i in range(16):
        auto(outs[i], x, i % 16)
    fma = kernel[-(-SMALL // 256), 256, 0, stream]

    def per_call(fn, n=2000):
        best = float("inf")
        for _ in range(5):
            stream.synchronize()
            t0 = time.perf_counter()
            for i in range(n):
                fn(i)
            best = min(best, time.perf_counter() - t0)
        return best / n * 1e6

    before = auto.stats()
    pieces = {
        "AutoGraph call (5 kernels)": lambda i: auto(outs[i % 16], x, i % 16),
        "eager call (5 kernels)": lambda i: token(outs[i % 16], x, i % 16),
        "cuctx.empty + its free": lambda i: cuctx.empty(SMALL, np.float32, stream=stream),
        "one launch (bound)": lambda i: fma(outs[0], x, 0.5, 1.0, SMALL),
        "python call of a no-op": lambda i: None,
    }
    print("== one structure, built: us per call of each piece")
    for name, fn in pieces.items():
        print(f"  {name:32s} {per_call(fn):7.2f}")
    after = auto.stats()
    print(
        "  (AutoGraph: "
        + ", ".join(
            f"{k} +{after[k] - before[k]}" for k in ("replays", "updates", "builds", "eager")
        )
        + ")"
    )


def per_call() -> None:
    """The small loop once from a cold start, each call timed alone (the caller's
    ``cuctx.empty`` apart): us by what the call did (its stats' difference), median and
    total over the run."""
    kernel = cuctx.Library.from_source(FMA_SOURCE, sim_kernels={"axpb": axpb_twin})["axpb"]
    stream = cuctx.Stream()
    x = cuctx.full(SMALL, 1.0, np.float32, stream=stream)
    auto = cuctx.autograph(small_token(kernel, stream))
    kinds: dict[str, list[float]] = {}
    empties = []
    stream.synchronize()
    for k in range(256):
        t0 = time.perf_counter()
        out = cuctx.empty(SMALL, np.float32, stream=stream)
        t1 = time.perf_counter()
        before = auto.stats()
        t2 = time.perf_counter()
        auto(out, x, k)
        t3 = time.perf_counter()
        after = auto.stats()
        kind = next(
            key for key in ("builds", "eager", "updates", "replays") if after[key] > before[key]
        )
        kinds.setdefault(kind, []).append((t3 - t2) * 1e6)
        empties.append((t1 - t0) * 1e6)
    stream.synchronize()
    print("== the small loop, each call alone (us): median, total over the run")
    for kind, times in kinds.items():
        print(
            f"  {kind:8s} {len(times):4d} calls  median {sorted(times)[len(times) // 2]:7.1f}"
            f"  total {sum(times):8.1f}"
        )
    print(f"  caller's cuctx.empty: median {sorted(empties)[128]:.1f}, total {sum(empties):.1f}")


if __name__ == "__main__":
    with cuctx.racecheck("off"):
        steady()
        per_call()
        if "--steady" not in sys.argv:
            main()
