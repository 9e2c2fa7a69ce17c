"""`@cuctx.autograph` against eager cuctx, raw CUDA graphs, C and PyTorch: issues 16's and 22's
goals in one run, each printed at the end as measured, goal, met or not met.

(a) The 50-kernel step: 64K floats, ``o = x*a + b`` 50 times, a new input and a new output
    array each call and one temporary inside; us per step over a loop of steps, then one
    synchronize. Written three ways (_autograph_loops.FORMS): the launcher bound once outside
    (``fma = kernel[grid, 256, 0, stream]``), the docs' form (``kernel[grid, 256](...)``
    inside, on the current stream) and ``cuctx.launch`` inside; cuctx eager and AutoGraph of
    each, a raw replay of the same 50 nodes captured once with fixed buffers, and PyTorch with
    one operation per kernel (``torch.addcmul(b, t, a)``) eager and
    ``torch.compile(step, backend="cudagraphs")`` (the caller clones the output it returns,
    which the next call overwrites). Goals: the docs' form (and the bound one) <= 1.1x the
    raw replay, <= 0.55x torch.compile, >= 4x eager; the forms within 10% of each other,
    eagerly and under AutoGraph.
(b) A chain of tiny kernels (each waits for the one before), 10 calls in a row then a
    synchronize, us per kernel: eager, AutoGraph, raw replay, the C program's replay
    (benchmarks/graphs_c.c), torch.cuda.CUDAGraph. Goals: >= 4x eager, <= 1.1x raw replay;
    and AutoGraph's build of the chain <= 1.5x the C program's capture + instantiate of the
    same launches.
(c) Loops whose shape changes: the issue's decoding-like loop of 5-8 small kernels (a
    temporary inside, a scalar and the output new every call, a new structure every 16
    calls), the loop of 64 calls whose lengths change every call and whose structure changes
    at call 17 (_autograph_loops.length_token), and the decoding example's loop
    (cuctx/examples/decoding_loop.py: larger kernels); us per call over a cold start: eager,
    AutoGraph, capture + update every call (llama.cpp's way), torch re-capturing a CUDAGraph
    every call. Goals: AutoGraph >= 2x eager on the small loops, >= 75% of the 64 calls
    served by graphs, and the fastest of the candidates on the decoding example.
(d) Patching one kernel node of a 1000-node executable: AutoGraph's patch from the recorded
    bytes and `GraphExec.update_node`, against C (cuGraphExecKernelNodeSetParams). Goal:
    AutoGraph's <= 1.2x C.
(e) The compiled launcher against the C program (benchmarks/launch.py's measurement).
    Goal: <= 1.0x C.
Then each loop once from a cold start for AutoGraph's decisions alone (calls, replays,
updates, builds, eager), on a GPU beside the sim's for the same calls (a child process on
the sim backend), and the sim's host-cost model beside what AutoGraph measured here.

Run on a GPU: ``python benchmarks/autograph.py``. ``CUCTX_BACKEND=sim`` runs small sizes as a
smoke test (the decisions with the GPU's call counts); the C and PyTorch baselines are
skipped with the reason, and its times are the sim's host times, not a GPU's.
``--decisions STEPS SMALL_CALLS TOKENS CHAIN`` prints the decisions alone, as JSON.
``--processes N`` runs the whole benchmark in N processes, one after another, and ends with
each goal line's median over them (a process lands fast or slow as a whole: a line near its
goal can flip from one process to the next). Each process stays on one CPU with its C
baselines (`_bench.one_cpu`).
"""

from __future__ import annotations

import ctypes
import json
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
from cuda.bindings.driver import CUstream_flags, CUstreamCaptureMode

import cuctx
from _bench import compare, one_cpu, run, start
from _autograph_loops import (
    FMA_SOURCE,
    FORMS,
    LENGTH_CALLS,
    axpb_twin,
    capture_and_update,
    decisions,
    end_to_end,
    graphed,
    length_token,
    small_token,
    step50,
    tiny_chain,
    torch_chain,
    torch_decoder,
    torch_small,
    torch_step,
)
from _autograph_report import (
    goal,
    model_beside_measured,
    over_processes,
    print_decisions,
    print_goals,
)
from graphs import STEP_SOURCE, best_us, c_program, step_twin, update_costs
from graphs import Sizes as CSizes
from cuctx import _record
from cuctx.examples import decoding_loop as dl
from cuctx.graphs._autograph_build import construct
from cuctx.graphs._autograph_record import Recording
from cuctx.kernels._compiler import compile_source


@dataclass(frozen=True)
class Sizes:
    n: int  # floats per array of the 50-kernel step
    steps: int  # steps per timed loop
    chain: int  # kernels in the chain, nodes of the patched executable
    small_calls: int  # calls of the small decoding-like loop
    tokens: int  # tokens of the decoding example
    rounds: int  # measurements per candidate; the best counts


GPU = Sizes(n=65536, steps=200, chain=1000, small_calls=256, tokens=256, rounds=5)
SIM = Sizes(n=1024, steps=8, chain=40, small_calls=40, tokens=70, rounds=1)
CALLS_IN_A_ROW = 10
FORM_NAMES = {"bound": "bound launcher", "docs": "docs' form", "launch": "cuctx.launch"}


def check(result: tuple, operation: str):
    """The values of a raw driver call; its error as an exception."""
    if result[0]:
        raise RuntimeError(f"{operation} failed: {result[0]!r}")
    return result[1] if len(result) == 2 else result[1:]


def raw_graph(launches: list[tuple[object, tuple, tuple, list]]):
    """``launches`` (function, grid, block, ctypes values) captured once with raw driver calls
    on a raw stream and instantiated: (replay, synchronize)."""
    drv = cuctx.backend().driver
    stream = check(drv.cuStreamCreate(int(CUstream_flags.CU_STREAM_NON_BLOCKING)), "cuStreamCreate")
    mode = CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
    check((drv.cuStreamBeginCapture(stream, mode)[0], None), "cuStreamBeginCapture")
    for function, grid, block, values in launches:  # the driver copies the parameters
        packed = (ctypes.c_void_p * len(values))(*map(ctypes.addressof, values))
        drv.cuLaunchKernel(function, *grid, *block, 0, stream, ctypes.addressof(packed), 0)
    graph = check(drv.cuStreamEndCapture(stream), "cuStreamEndCapture")
    exe = check(drv.cuGraphInstantiate(graph, 0), "cuGraphInstantiate")
    launch, synchronize = drv.cuGraphLaunch, drv.cuStreamSynchronize
    return (lambda: launch(exe, stream)), (lambda: synchronize(stream))


def torch_or_reason():
    """(torch, None) when PyTorch runs on this GPU, else (None, why not)."""
    if cuctx.backend().name != "cuda":
        return None, "PyTorch needs a GPU; this run is on the sim"
    try:
        import torch
    except ImportError as exc:
        return None, f"PyTorch cannot be imported ({exc})"
    if not torch.cuda.is_available():
        return None, "PyTorch sees no CUDA device"
    return torch, None


# -- (a) the 50-kernel step ---------------------------------------------------------------


def step_forms(sizes: Sizes, torch, why_no_torch: str | None) -> list[cuctx.AutoGraph]:
    n, steps = sizes.n, sizes.steps
    kernel = cuctx.Library.from_source(FMA_SOURCE, sim_kernels={"axpb": axpb_twin})["axpb"]
    stream = cuctx.Stream()
    inputs = [cuctx.full(n, 1.0, np.float32, stream=stream) for _ in range(steps)]
    steps_of = {form: step50(kernel, stream, n, form) for form in FORMS}
    graphs = {form: cuctx.autograph(step) for form, step in steps_of.items()}
    with stream:  # the docs' form and cuctx.launch run on the current stream
        for fn in graphs.values():
            for x in inputs[:10]:  # eager first, then a graph once it pays
                fn(x)

    def loop(fn: Callable) -> Callable[[], float]:
        def calls() -> None:
            with stream:
                for x in inputs:
                    fn(x)

        return lambda: end_to_end(calls, stream.synchronize, steps)

    x0, t0, o0 = (
        inputs[0],
        cuctx.empty(n, np.float32, stream=stream),
        cuctx.empty(n, np.float32, stream=stream),
    )
    grid = (-(-n // 256), 1, 1)
    scalars = [ctypes.c_float(0.5), ctypes.c_float(1.0), ctypes.c_int(n)]
    pointers = [(t0, x0)] + [(t0, t0)] * 48 + [(o0, t0)]
    replay, raw_sync = raw_graph(
        [
            (
                kernel._function,
                grid,
                (256, 1, 1),
                [ctypes.c_void_p(dst.ptr), ctypes.c_void_p(src.ptr), *scalars],
            )
            for dst, src in pointers
        ]
    )
    candidates = {}
    for form in FORMS:
        candidates[f"eager, {FORM_NAMES[form]}"] = loop(steps_of[form])
        candidates[f"AutoGraph, {FORM_NAMES[form]}"] = loop(graphs[form])
    candidates["raw replay"] = lambda: end_to_end(
        lambda: [replay() for _ in range(steps)], raw_sync, steps
    )
    if torch is not None:
        candidates.update(torch_step(torch, n, steps))
    best = compare(
        f"the 50-kernel step, {n} floats, {steps} steps then a synchronize, per step",
        candidates,
        unit="us",
        reference="AutoGraph, docs' form",
        rounds=sizes.rounds,
    )
    if why_no_torch:
        print(f"  (no torch baseline: {why_no_torch})")
    with stream:
        expected = steps_of["bound"](x0).to_host()
        for form, fn in graphs.items():
            s = fn.stats()
            same = np.array_equal(fn(x0).to_host(), expected)
            print(
                f"  AutoGraph, {FORM_NAMES[form]}: {s['calls']} calls, {s['updates']} "
                f"patched, {s['replays']} replayed, {s['builds']} builds, {s['eager']} "
                f"eager; results {'equal to eager' if same else 'DIFFERENT from eager'}"
            )
    compiled = best.get("torch.compile cudagraphs")
    for form in ("docs", "bound"):
        auto, what = best[f"AutoGraph, {FORM_NAMES[form]}"], f"50-kernel step, {FORM_NAMES[form]}"
        goal(f"{what}: AutoGraph / raw replay", auto / best["raw replay"], "<=", 1.1)
        goal(
            f"{what}: AutoGraph / torch.compile(cudagraphs)",
            None if compiled is None else auto / compiled,
            "<=",
            0.55,
            why_no_torch or "torch.compile(backend='cudagraphs') did not run (see above)",
        )
        goal(f"{what}: eager / AutoGraph", best[f"eager, {FORM_NAMES[form]}"] / auto, ">=", 4.0)
    for form in ("docs", "launch"):
        for way in ("AutoGraph", "eager"):
            goal(
                f"50-kernel step, {way}: {FORM_NAMES[form]} / bound launcher",
                best[f"{way}, {FORM_NAMES[form]}"] / best[f"{way}, bound launcher"],
                "<=",
                1.1,
            )
    return list(graphs.values())


# -- (b) the chain --------------------------------------------------------------------------


def chain(sizes: Sizes, c: dict[str, float] | None) -> cuctx.AutoGraph:
    n = sizes.chain
    kernel, stream, x, eager = tiny_chain(n)
    graphed_chain = cuctx.autograph(eager)
    for _ in range(20):  # eager until a graph pays, then built
        graphed_chain()
        if graphed_chain.stats()["builds"]:
            break
    replay, raw_sync = raw_graph(
        [
            (
                kernel._function,
                (1, 1, 1),
                (32, 1, 1),
                [ctypes.c_void_p(x.ptr), ctypes.c_int(1), ctypes.c_int(i)],
            )
            for i in range(n)
        ]
    )
    sync = stream.synchronize
    runs = {
        "cuctx eager": (eager, sync),
        "cuctx AutoGraph": (graphed_chain, sync),
        "raw replay": (replay, raw_sync),
    }
    torch, _ = torch_or_reason()
    if torch is not None and getattr(torch.cuda, "_compile_kernel", None) is not None:
        runs["torch CUDAGraph replay"] = torch_chain(torch, n)
    candidates = {
        name: (lambda run=run, s=s: end_to_end(run, s, n, CALLS_IN_A_ROW))
        for name, (run, s) in runs.items()
    }
    best = compare(
        f"a chain of {n} tiny kernels, {CALLS_IN_A_ROW} calls in a row then a "
        "synchronize, per kernel",
        candidates,
        unit="us",
        reference="cuctx AutoGraph",
        rounds=sizes.rounds,
    )
    if c is not None:
        print(
            f"  C (one call, then a synchronize): replay {c['replay_us_per_node']:.3f}, "
            f"eager {c['eager_us_per_kernel']:.3f} us per kernel"
        )
    auto = best["cuctx AutoGraph"]
    goal(f"{n}-kernel chain: eager / AutoGraph", best["cuctx eager"] / auto, ">=", 4.0)
    goal(f"{n}-kernel chain: AutoGraph / raw replay", auto / best["raw replay"], "<=", 1.1)
    build = build_us(graphed_chain, sizes.rounds)
    c_build = None if c is None else c["capture_instantiate_ms"] * 1e3
    print(
        f"\n== building the {n}-kernel chain's graph (us): AutoGraph {build:.0f} "
        f"({build / n:.2f} per node); C capture + instantiate "
        f"{'-' if c_build is None else f'{c_build:.0f} ({c_build / n:.2f} per node)'}"
    )
    goal(
        f"a build of the {n}-kernel chain: AutoGraph / C capture + instantiate",
        None if c_build is None else build / c_build,
        "<=",
        1.5,
        "the C program needs a GPU" if c is None else "",
    )
    return graphed_chain


def build_us(fn: cuctx.AutoGraph, rounds: int) -> float:
    """us of AutoGraph building the graph of one call of ``fn`` as a build does (the call
    recorded, its graph constructed from the recording and instantiated; the launch and the
    destruction aside, as in the C program's figure), the best of 3 * ``rounds`` (at least
    15), as the C program takes the best of 3 * ROUNDS."""
    recording = Recording(fn._arena)
    _record.start(recording)
    try:
        fn._fn()
    finally:
        _record.stop()

    best = float("inf")
    for _ in range(3 * max(rounds, 5)):  # each destroyed after its timing, as in the C program
        begin = time.perf_counter()
        exe = construct(recording)[0].instantiate()
        best = min(best, time.perf_counter() - begin)
        exe.destroy()
        del exe
    return best * 1e6


# -- (c) decoding ---------------------------------------------------------------------------


def decoding_small(sizes: Sizes, torch, why_no_torch: str | None) -> cuctx.AutoGraph:
    calls = sizes.small_calls
    kernel = cuctx.Library.from_source(FMA_SOURCE, sim_kernels={"axpb": axpb_twin})["axpb"]
    stream = cuctx.Stream()
    token = small_token(kernel, stream)
    x = cuctx.full(token.size, 1.0, np.float32, stream=stream)
    scratch = cuctx.empty(token.size, np.float32, stream=stream)  # capture + update's
    outputs: dict[str, cuctx.DeviceArray] = {}
    last: dict[str, cuctx.AutoGraph] = {}

    def run(name: str, fn: Callable) -> float:
        def calls_of() -> None:
            for k in range(calls):
                out = cuctx.empty(token.size, np.float32, stream=stream)
                fn(out, x, k)
            outputs[name] = out

        return end_to_end(calls_of, stream.synchronize, calls)

    def autograph_run() -> float:
        last["AutoGraph"] = graphed = cuctx.autograph(token)  # a cold start every run
        return run("AutoGraph", graphed)

    update = capture_and_update(stream, lambda out, x, k: token(out, x, k, scratch))
    candidates = {
        "eager": lambda: run("eager", token),
        "AutoGraph": autograph_run,
        "capture + update": lambda: run("capture + update", update()),
    }
    if torch is not None:
        candidates["torch re-capture"] = torch_small(torch, token.size, calls)
    best = compare(
        f"a decoding-like loop of 5-8 small kernels, {calls} calls (a new "
        "structure every 16), per call",
        candidates,
        unit="us",
        reference="AutoGraph",
        rounds=sizes.rounds,
    )
    if why_no_torch:
        print(f"  (no torch baseline: {why_no_torch})")
    reference = outputs["eager"].to_host()
    print(
        "  last outputs equal to eager: "
        + ", ".join(
            f"{name} {'yes' if np.array_equal(out.to_host(), reference) else 'NO'}"
            for name, out in outputs.items()
            if name != "eager"
        )
    )
    s = last["AutoGraph"].stats()
    print(
        f"  AutoGraph (last run): {s['updates']} patched, {s['replays']} replayed, "
        f"{s['builds']} builds, {s['eager']} eager of {s['calls']}"
    )
    fastest = min(best, key=best.get)
    goal("small decoding loop: eager / AutoGraph", best["eager"] / best["AutoGraph"], ">=", 2.0)
    goal(
        f"small decoding loop: fastest / AutoGraph (fastest: {fastest})",
        best[fastest] / best["AutoGraph"],
        ">=",
        1.0,
    )
    return last["AutoGraph"]


def length_loop(sizes: Sizes) -> cuctx.AutoGraph:
    """The 64-call loop whose lengths change: eager against AutoGraph from a cold start."""
    kernel = cuctx.Library.from_source(FMA_SOURCE, sim_kernels={"axpb": axpb_twin})["axpb"]
    stream = cuctx.Stream()
    token = length_token(kernel, stream)
    x = cuctx.full(token.size, 1.0, np.float32, stream=stream)
    last: dict[str, cuctx.AutoGraph] = {}

    def run(fn: Callable) -> float:
        def calls() -> None:
            for n in range(1, LENGTH_CALLS + 1):
                fn(cuctx.empty(token.size, np.float32, stream=stream), x, n)

        return end_to_end(calls, stream.synchronize, LENGTH_CALLS)

    def autograph_run() -> float:
        last["AutoGraph"] = cuctx.autograph(token)  # a cold start every run
        return run(last["AutoGraph"])

    best = compare(
        f"a loop of {LENGTH_CALLS} calls whose lengths change every call, its "
        "structure at call 17 (4, then 5 small kernels), per call",
        {"eager": lambda: run(token), "AutoGraph": autograph_run},
        unit="us",
        reference="AutoGraph",
        rounds=sizes.rounds,
    )
    share = graphed(last["AutoGraph"])
    print(f"  AutoGraph (last run): {share:.0%} of the calls served by graphs")
    goal(f"{LENGTH_CALLS}-call loop: calls served by graphs (share)", share, ">=", 0.75)
    goal(
        f"{LENGTH_CALLS}-call loop: eager / AutoGraph", best["eager"] / best["AutoGraph"], ">=", 2.0
    )
    return last["AutoGraph"]


def decoding_example(sizes: Sizes) -> None:
    tokens = sizes.tokens
    library = cuctx.Library.from_source(dl.SOURCE, sim_kernels=dl.TWINS)
    models = {
        name: dl.Model.create(library, tokens)
        for name in ("eager", "AutoGraph", "capture + update")
    }

    def autograph_run() -> float:  # a cold start every run
        return dl.run(models["AutoGraph"], cuctx.autograph(dl.decode_token), tokens) * 1e6

    def update_run() -> float:
        model = models["capture + update"]
        return dl.run(model, capture_and_update(model.stream, dl.decode_token)(), tokens) * 1e6

    candidates = {
        "eager": lambda: dl.run(models["eager"], dl.decode_token, tokens) * 1e6,
        "AutoGraph": autograph_run,
        "capture + update": update_run,
    }
    torch, why_no_torch = torch_or_reason()
    if torch is not None and getattr(torch.cuda, "_compile_kernel", None) is not None:
        t_run, _ = torch_decoder(torch, tokens)
        candidates["torch re-capture"] = lambda: best_us(t_run, 1) / tokens
    elif torch is not None:
        why_no_torch = f"torch {torch.__version__} has no torch.cuda._compile_kernel"
    best = compare(
        f"the decoding example: {tokens} tokens, a new structure every {dl.CHUNK}, per token",
        candidates,
        unit="us",
        reference="AutoGraph",
        rounds=sizes.rounds,
    )
    if why_no_torch:
        print(f"  (no torch baseline: {why_no_torch})")
    reference = models["eager"].out.to_host()
    print(
        "  outputs equal to eager: "
        + ", ".join(
            f"{name} {'yes' if np.array_equal(m.out.to_host(), reference) else 'NO'}"
            for name, m in models.items()
            if name != "eager"
        )
    )
    fastest = min(best, key=best.get)
    goal(
        f"decoding example: fastest / AutoGraph (fastest: {fastest})",
        best[fastest] / best["AutoGraph"],
        ">=",
        1.0,
    )


# -- (d) patching one node, (e) the launcher ------------------------------------------------


def patch_one(
    sizes: Sizes, built: cuctx.AutoGraph, c: dict[str, float] | None, why_no_c: str | None
) -> None:
    """AutoGraph's patch of one kernel node (the chain's executable, from recorded bytes)
    and GraphExec.update_node, us per patch, against C."""
    entry = built._last  # the chain's structure, built
    patcher, values = entry.patcher, entry.values
    j = len(values) // 2
    flipped = list(values)
    flipped[j] = values[j][:8] + struct.pack("<i", 2) + values[j][12:]  # the scalar `a`
    versions = (flipped, values)
    rounds = 2000 if cuctx.backend().name == "cuda" else 20
    ours = None
    if patcher is not None:

        def patches() -> None:
            for r in range(rounds):
                patcher.patch([j], versions[r & 1])

        ours = best_us(patches, sizes.rounds) / rounds
    kernel = cuctx.Library.from_source(STEP_SOURCE, sim_kernels={"step": step_twin})["step"]
    x = cuctx.zeros(1024, np.float32)
    update_node = update_costs(kernel, x, sizes.chain, 1, sizes.rounds * 4)["patches"]
    c_patch = None if c is None else c["patch_us_k1"]
    print(f"\n== patching one kernel node of a {sizes.chain}-node executable (us)")
    print(
        f"  AutoGraph (compiled, from recorded bytes): "
        f"{'-' if ours is None else f'{ours:.3f}'}; GraphExec.update_node: "
        f"{update_node:.3f}; C: {'-' if c_patch is None else f'{c_patch:.3f}'}"
    )
    goal(
        "one node patched: AutoGraph / C",
        None if ours is None or c_patch is None else ours / c_patch,
        "<=",
        1.2,
        why_no_c or "no compiled path (cuctx.backend().native is None)",
    )


def launcher_vs_c() -> None:
    if cuctx.backend().name != "cuda":
        goal("compiled launcher / C program", None, "<=", 1.0, "needs a GPU")
        return
    import launch  # benchmarks/launch.py: the same measurement, its C program

    cc = cuctx.Device(0).compute_capability
    image = compile_source(launch.SOURCE, arch=f"sm_{cc.major}{cc.minor}", cache_dir=False).image
    cubin = Path(tempfile.gettempdir()) / "cuctx_launch_empty.cubin"
    cubin.write_bytes(image)
    try:
        c_measure = launch.c_program(cubin)
    except (OSError, subprocess.CalledProcessError) as exc:
        goal("compiled launcher / C program", None, "<=", 1.0, f"no C program: {exc}")
        return
    kernel = cuctx.Library.from_bytes(image)["empty"]
    with cuctx.Device(0):
        stream, data = cuctx.Stream(), cuctx.zeros(256, np.float32)
    launcher = kernel[1, 32, 0, stream]
    launcher(data, 3)

    def batch() -> None:
        for _ in range(launch.BATCH):
            launcher(data, 3)

    ours = c = float("inf")
    for _ in range(5):
        c = min(c, c_measure()["CUkernel"])
        ours = min(ours, launch.timed(batch, stream.synchronize))
    print(f"\n== the compiled launcher: {ours:.0f} ns per launch, C {c:.0f} ns")
    goal(
        "compiled launcher / C program",
        ours / c,
        "<=",
        1.0,
        "" if cuctx.backend().native else "no compiled path",
    )


# -- the run ----------------------------------------------------------------------------------


def main() -> None:
    backend, _ = start(
        "the sim runs small sizes as a smoke test; its times are its host "
        "times, and the raw baseline is the sim's driver"
    )
    one_cpu()
    sizes = GPU if backend.name == "cuda" else SIM
    c, why_no_c = None, "the C program needs a GPU; this run is on the sim"
    if backend.name == "cuda":
        cc = cuctx.Device(0).compute_capability
        image = compile_source(STEP_SOURCE, arch=f"sm_{cc.major}{cc.minor}", cache_dir=False).image
        try:
            c, why_no_c = c_program(CSizes(sizes.chain, (1,), sizes.rounds), image), None
        except (OSError, subprocess.CalledProcessError) as exc:
            why_no_c = f"the C program did not build or run: {exc}"
    torch, why_no_torch = torch_or_reason()
    with cuctx.Device(0):
        graphs = step_forms(sizes, torch, why_no_torch)
        graphs.append(chain(sizes, c))
        graphs.append(decoding_small(sizes, torch, why_no_torch))
        graphs.append(length_loop(sizes))
        decoding_example(sizes)
        patch_one(sizes, graphs[3], c, why_no_c)
        launcher_vs_c()
        counts = (GPU.steps, GPU.small_calls, GPU.tokens, GPU.chain)
        print_decisions(decisions(*counts), list(map(str, counts)))
    model_beside_measured(graphs)
    print_goals()


def main_decisions(args: list[str]) -> None:
    """``--decisions STEPS SMALL_CALLS TOKENS CHAIN``: the loops' decisions, one JSON line."""
    with cuctx.Device(0):
        found = decisions(*map(int, args))
    print(json.dumps(found))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--decisions"]:
        run(lambda: main_decisions(sys.argv[2:]))
    elif sys.argv[1:2] == ["--processes"]:
        over_processes(int(sys.argv[2]), sys.argv[3:])
    else:
        run(main)
