"""`@cuctx.autograph` against eager cuctx, raw CUDA graphs, C and PyTorch: issue 16's goals in
one run, each printed at the end as measured, goal, met or not met.

(a) The 50-kernel step: 64K floats, ``o = x*a + b`` 50 times, a new input and a new output
    array each call and one temporary inside; us per step over a loop of steps, then one
    synchronize. cuctx eager, AutoGraph, and a raw replay of the same 50 nodes captured once
    with fixed buffers; in PyTorch with one operation per kernel (``torch.addcmul(b, t, a)``,
    0-d tensors) eager and ``torch.compile(step, backend="cudagraphs")`` (the caller clones
    the output it returns, which the next call overwrites). Goals: AutoGraph <= 1.1x the raw
    replay, <= 0.6x torch.compile, >= 4x faster than eager.
(b) A chain of tiny kernels (each waits for the one before), 10 calls in a row then a
    synchronize, us per kernel: eager, AutoGraph, raw replay, the C program's replay
    (benchmarks/graphs_c.c), torch.cuda.CUDAGraph. Goals: >= 4x eager, <= 1.1x raw replay.
(c) Decoding: the issue's decoding-like loop of 5-8 small kernels (a temporary inside, a
    scalar and the output new every call, a new structure every 16 calls), and the decoding
    example's loop (cuctx/examples/decoding_loop.py: larger kernels); us per call over a
    cold start: eager, AutoGraph, capture + update every call (llama.cpp's way), torch
    re-capturing a CUDAGraph every call. Goals: AutoGraph fastest of them on both, and >= 2x
    eager with small kernels.
(d) Patching one kernel node of a 1000-node executable: AutoGraph's patch from the recorded
    bytes and `GraphExec.update_node`, against C (cuGraphExecKernelNodeSetParams). Goal:
    AutoGraph's <= 1.2x C.
(e) The compiled launcher against the C program (benchmarks/launch.py's measurement).
    Goal: <= 1.0x C.
Then the sim's host-cost model (HOST_* in cuctx/_driver/sim/_timing.py) beside what
AutoGraph measured on this machine.

Run on a GPU: ``python benchmarks/autograph.py``. ``CUCTX_BACKEND=sim`` runs small sizes as a
smoke test; the C and PyTorch baselines are skipped with the reason, and its times are the
sim's host times, not a GPU's.
"""

from __future__ import annotations

import ctypes
import struct
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
from cuda.bindings.driver import CUstream_flags, CUstreamCaptureMode

import cuctx
from _bench import compare, run, start
from _autograph_loops import (capture_and_update, end_to_end, small_token, torch_decoder,
                              torch_small)
from graphs import STEP_SOURCE, best_us, c_program, step_twin, update_costs
from graphs import Sizes as CSizes
from cuctx._driver.sim import _timing
from cuctx.examples import decoding_loop as dl
from cuctx.kernels._compiler import compile_source

FMA_SOURCE = r"""
extern "C" __global__ void axpb(float* o, const float* x, float a, float b, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) o[i] = x[i] * a + b;
}
"""


def axpb_twin(grid, block, o, x, a, b, n):
    """The sim's stand-in for `axpb`."""
    o.view(np.float32, n)[:] = x.view(np.float32, n) * np.float32(a) + np.float32(b)


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
GOALS: list[tuple[str, float | None, str, float, str]] = []  # what, value, sense, target, note


def goal(what: str, value: float | None, sense: str, target: float, note: str = "") -> None:
    """A goal to print at the end (``value`` None: not measured, ``note`` says why)."""
    GOALS.append((what, value, sense, target, note))


def check(result: tuple, operation: str):
    """The values of a raw driver call; its error as an exception."""
    if result[0]:
        raise RuntimeError(f"{operation} failed: {result[0]!r}")
    return result[1] if len(result) == 2 else result[1:]


def raw_graph(launches: list[tuple[object, tuple, tuple, list]]):
    """``launches`` (function, grid, block, ctypes values) captured once with raw driver calls
    on a raw stream and instantiated: (replay, synchronize)."""
    drv = cuctx.backend().driver
    stream = check(drv.cuStreamCreate(int(CUstream_flags.CU_STREAM_NON_BLOCKING)),
                   "cuStreamCreate")
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

def step50(sizes: Sizes, torch, why_no_torch: str | None) -> cuctx.AutoGraph:
    n, steps = sizes.n, sizes.steps
    kernel = cuctx.Library.from_source(FMA_SOURCE, sim_kernels={"axpb": axpb_twin})["axpb"]
    stream = cuctx.Stream()
    fma = kernel[-(-n // 256), 256, 0, stream]
    a, b = 0.5, 1.0

    def step(x: cuctx.DeviceArray) -> cuctx.DeviceArray:
        t = cuctx.empty(n, np.float32, stream=stream)  # the temporary
        fma(t, x, a, b, n)
        for _ in range(48):
            fma(t, t, a, b, n)
        o = cuctx.empty(n, np.float32, stream=stream)  # the output, new every call
        fma(o, t, a, b, n)
        return o
    graphed = cuctx.autograph(step)
    inputs = [cuctx.full(n, 1.0, np.float32, stream=stream) for _ in range(steps)]
    for x in inputs[:10]:  # eager first, then a graph once it pays
        graphed(x)

    def loop(fn: Callable) -> Callable[[], None]:
        def run() -> None:
            for x in inputs:
                fn(x)
        return run
    x0, t0, o0 = inputs[0], cuctx.empty(n, np.float32, stream=stream), \
        cuctx.empty(n, np.float32, stream=stream)
    grid = (-(-n // 256), 1, 1)
    scalars = [ctypes.c_float(a), ctypes.c_float(b), ctypes.c_int(n)]
    pointers = [(t0, x0)] + [(t0, t0)] * 48 + [(o0, t0)]
    replay, raw_sync = raw_graph([(kernel._function, grid, (256, 1, 1),
                                   [ctypes.c_void_p(dst.ptr), ctypes.c_void_p(src.ptr), *scalars])
                                  for dst, src in pointers])
    sync = stream.synchronize
    candidates = {"cuctx eager": lambda: end_to_end(loop(step), sync, steps),
                  "cuctx AutoGraph": lambda: end_to_end(loop(graphed), sync, steps),
                  "raw replay": lambda: end_to_end(lambda: [replay() for _ in range(steps)],
                                                   raw_sync, steps)}
    if torch is not None:
        candidates.update(torch_step(torch, sizes))
    best = compare(f"the 50-kernel step, {n} floats, {steps} steps then a synchronize, per "
                   "step", candidates, unit="us", reference="cuctx AutoGraph",
                   rounds=sizes.rounds)
    if why_no_torch:
        print(f"  (no torch baseline: {why_no_torch})")
    same = np.array_equal(graphed(inputs[0]).to_host(), step(inputs[0]).to_host())
    s = graphed.stats()
    print(f"  AutoGraph: {s['calls']} calls, {s['updates']} patched, {s['replays']} replayed, "
          f"{s['builds']} builds, {s['eager']} eager; {s['patched_nodes']} nodes patched "
          f"({s['patched_nodes'] / max(s['updates'], 1):.1f} per patched call); results "
          f"{'equal to eager' if same else 'DIFFERENT from eager'}")
    auto = best["cuctx AutoGraph"]
    goal("50-kernel step: AutoGraph / raw replay", auto / best["raw replay"], "<=", 1.1)
    goal("50-kernel step: eager / AutoGraph", best["cuctx eager"] / auto, ">=", 4.0)
    compiled = best.get("torch.compile cudagraphs")
    goal("50-kernel step: AutoGraph / torch.compile(cudagraphs)",
         None if compiled is None else auto / compiled, "<=", 0.6,
         why_no_torch or "torch.compile(backend='cudagraphs') did not run (see above)")
    return graphed


def torch_step(torch, sizes: Sizes) -> dict[str, Callable[[], float]]:
    """The step in PyTorch, one operation per kernel: eager, and torch.compile's CUDA graphs
    when it compiles here."""
    a, b = torch.tensor(0.5, device="cuda"), torch.tensor(1.0, device="cuda")

    def step(x):
        t = torch.addcmul(b, x, a)
        for _ in range(48):
            t = torch.addcmul(b, t, a)
        return torch.addcmul(b, t, a)
    inputs = [torch.ones(sizes.n, device="cuda") for _ in range(sizes.steps)]
    sync = torch.cuda.synchronize

    def loop(fn):
        def run():
            for x in inputs:
                fn(x)
        return run
    candidates = {"torch eager": lambda: end_to_end(loop(step), sync, sizes.steps)}
    try:
        compiled = torch.compile(step, backend="cudagraphs")
        for x in inputs[:5]:  # traced, recorded, then replayed
            compiled(x).clone()
        sync()
        candidates["torch.compile cudagraphs"] = \
            lambda: end_to_end(loop(lambda x: compiled(x).clone()), sync, sizes.steps)
    except Exception as exc:  # noqa: BLE001 - whatever keeps torch.compile from running here
        print(f"  (no torch.compile baseline: {type(exc).__name__}: {exc})")
    return candidates


# -- (b) the chain --------------------------------------------------------------------------

def chain(sizes: Sizes, c: dict[str, float] | None) -> cuctx.AutoGraph:
    n = sizes.chain
    kernel = cuctx.Library.from_source(STEP_SOURCE, sim_kernels={"step": step_twin})["step"]
    stream = cuctx.Stream()
    x = cuctx.zeros(1024, np.float32, stream=stream)
    launcher = kernel[1, 32, 0, stream]

    def eager() -> None:
        for i in range(n):
            launcher(x, 1, i)
    graphed = cuctx.autograph(eager)
    for _ in range(20):  # eager until a graph pays, then built
        graphed()
        if graphed.stats()["builds"]:
            break
    replay, raw_sync = raw_graph([(kernel._function, (1, 1, 1), (32, 1, 1),
                                   [ctypes.c_void_p(x.ptr), ctypes.c_int(1), ctypes.c_int(i)])
                                  for i in range(n)])
    sync = stream.synchronize
    runs = {"cuctx eager": (eager, sync), "cuctx AutoGraph": (graphed, sync),
            "raw replay": (replay, raw_sync)}
    torch, _ = torch_or_reason()
    if torch is not None and getattr(torch.cuda, "_compile_kernel", None) is not None:
        runs["torch CUDAGraph replay"] = torch_chain(torch, n)
    candidates = {name: (lambda run=run, s=s: end_to_end(run, s, n, CALLS_IN_A_ROW))
                  for name, (run, s) in runs.items()}
    best = compare(f"a chain of {n} tiny kernels, {CALLS_IN_A_ROW} calls in a row then a "
                   "synchronize, per kernel", candidates, unit="us", reference="cuctx AutoGraph",
                   rounds=sizes.rounds)
    if c is not None:
        print(f"  C (one call, then a synchronize): replay {c['replay_us_per_node']:.3f}, "
              f"eager {c['eager_us_per_kernel']:.3f} us per kernel")
    auto = best["cuctx AutoGraph"]
    goal(f"{n}-kernel chain: eager / AutoGraph", best["cuctx eager"] / auto, ">=", 4.0)
    goal(f"{n}-kernel chain: AutoGraph / raw replay", auto / best["raw replay"], "<=", 1.1)
    return graphed


def torch_chain(torch, n: int):
    """The chain in a torch.cuda.CUDAGraph, captured once: its replay and a synchronize."""
    step = torch.cuda._compile_kernel(STEP_SOURCE, "step")
    x = torch.zeros(1024, device="cuda")
    stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        graph.capture_begin()
        for i in range(n):
            step(grid=(1, 1, 1), block=(32, 1, 1), args=[x, 1, i])
        graph.capture_end()

    def replay() -> None:
        with torch.cuda.stream(stream):
            graph.replay()
    return replay, stream.synchronize


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
    candidates = {"eager": lambda: run("eager", token), "AutoGraph": autograph_run,
                  "capture + update": lambda: run("capture + update", update())}
    if torch is not None:
        candidates["torch re-capture"] = torch_small(torch, token.size, calls)
    best = compare(f"a decoding-like loop of 5-8 small kernels, {calls} calls (a new "
                   "structure every 16), per call", candidates, unit="us", reference="AutoGraph",
                   rounds=sizes.rounds)
    if why_no_torch:
        print(f"  (no torch baseline: {why_no_torch})")
    reference = outputs["eager"].to_host()
    print("  last outputs equal to eager: " + ", ".join(
        f"{name} {'yes' if np.array_equal(out.to_host(), reference) else 'NO'}"
        for name, out in outputs.items() if name != "eager"))
    s = last["AutoGraph"].stats()
    print(f"  AutoGraph (last run): {s['updates']} patched, {s['replays']} replayed, "
          f"{s['builds']} builds, {s['eager']} eager of {s['calls']}")
    fastest = min(best, key=best.get)
    goal("small decoding loop: eager / AutoGraph", best["eager"] / best["AutoGraph"], ">=", 2.0)
    goal(f"small decoding loop: fastest / AutoGraph (fastest: {fastest})",
         best[fastest] / best["AutoGraph"], ">=", 1.0)
    return last["AutoGraph"]


def decoding_example(sizes: Sizes) -> None:
    tokens = sizes.tokens
    library = cuctx.Library.from_source(dl.SOURCE, sim_kernels=dl.TWINS)
    models = {name: dl.Model.create(library, tokens)
              for name in ("eager", "AutoGraph", "capture + update")}

    def autograph_run() -> float:  # a cold start every run
        return dl.run(models["AutoGraph"], cuctx.autograph(dl.decode_token), tokens) * 1e6

    def update_run() -> float:
        model = models["capture + update"]
        return dl.run(model, capture_and_update(model.stream, dl.decode_token)(), tokens) * 1e6
    candidates = {
        "eager": lambda: dl.run(models["eager"], dl.decode_token, tokens) * 1e6,
        "AutoGraph": autograph_run, "capture + update": update_run}
    torch, why_no_torch = torch_or_reason()
    if torch is not None and getattr(torch.cuda, "_compile_kernel", None) is not None:
        t_run, _ = torch_decoder(torch, tokens)
        candidates["torch re-capture"] = lambda: best_us(t_run, 1) / tokens
    elif torch is not None:
        why_no_torch = f"torch {torch.__version__} has no torch.cuda._compile_kernel"
    best = compare(f"the decoding example: {tokens} tokens, a new structure every "
                   f"{dl.CHUNK}, per token", candidates, unit="us", reference="AutoGraph",
                   rounds=sizes.rounds)
    if why_no_torch:
        print(f"  (no torch baseline: {why_no_torch})")
    reference = models["eager"].out.to_host()
    print("  outputs equal to eager: " + ", ".join(
        f"{name} {'yes' if np.array_equal(m.out.to_host(), reference) else 'NO'}"
        for name, m in models.items() if name != "eager"))
    fastest = min(best, key=best.get)
    goal(f"decoding example: fastest / AutoGraph (fastest: {fastest})",
         best[fastest] / best["AutoGraph"], ">=", 1.0)


# -- (d) patching one node, (e) the launcher ------------------------------------------------

def patch_one(sizes: Sizes, graphed: cuctx.AutoGraph, c: dict[str, float] | None,
              why_no_c: str | None) -> None:
    """AutoGraph's patch of one kernel node (the chain's executable, from recorded bytes)
    and GraphExec.update_node, us per patch, against C."""
    entry = graphed._last  # the chain's structure, built
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
    print(f"  AutoGraph (compiled, from recorded bytes): "
          f"{'-' if ours is None else f'{ours:.3f}'}; GraphExec.update_node: "
          f"{update_node:.3f}; C: {'-' if c_patch is None else f'{c_patch:.3f}'}")
    goal("one node patched: AutoGraph / C", None if ours is None or c_patch is None
         else ours / c_patch, "<=", 1.2,
         why_no_c or "no compiled path (cuctx.backend().native is None)")


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
    goal("compiled launcher / C program", ours / c, "<=", 1.0,
         "" if cuctx.backend().native else "no compiled path")


# -- the model and the run --------------------------------------------------------------------

def model_beside_measured(graphs: list[cuctx.AutoGraph]) -> None:
    """The sim's host costs beside what AutoGraph measured here (a GPU), us."""
    print("\n== the sim's host-cost model (HOST_* in cuctx/_driver/sim/_timing.py), us")
    if cuctx.backend().sim is not None:
        print("  (on the sim the model is what decides: nothing measured to compare)")
        return
    eager = [e.eager_s / e.size for g in graphs for e in g._cache.values()
             if e.eager_s is not None and e.size]
    launches = [e.replay_s for g in graphs for e in g._cache.values() if e.replay_s is not None]
    measured = {
        "an operation enqueued eagerly": (_timing.HOST_EAGER_OP_NS, min(eager, default=None)),
        "a graph launch (its nodes' share included)":
            (_timing.HOST_GRAPH_LAUNCH_NS, min(launches, default=None)),
        "a patched kernel node": (_timing.HOST_PATCH_NODE_NS, _least(graphs, "patch_s")),
        "a node of a whole update": (_timing.HOST_WHOLE_NODE_NS,
                                     _least(graphs, "whole_node_s")),
        "a node of a build": (_timing.HOST_BUILD_NODE_NS, _least(graphs, "build_node_s"))}
    for what, (model_ns, seconds) in measured.items():
        seen = "not measured in this run" if seconds is None else f"{seconds * 1e6:.2f} measured"
        print(f"  {what:<44} {model_ns / 1e3:7.2f} modelled, {seen}")


def _least(graphs: list[cuctx.AutoGraph], name: str) -> float | None:
    values = [getattr(g._policy, name) for g in graphs if getattr(g._policy, name) is not None]
    return min(values, default=None)


def print_goals() -> None:
    print("\n== goals (issue 16)")
    for what, value, sense, target, note in GOALS:
        if value is None:
            print(f"  {what:<62} not measured ({note})")
            continue
        met = value >= target if sense == ">=" else value <= target
        print(f"  {what:<62} {value:7.2f}  goal {sense} {target:<4}  "
              f"{'met' if met else 'NOT met'}")
    if cuctx.backend().sim is not None:
        print("  (on the sim: its host times, not a GPU's; the goals are for a GPU)")


def main() -> None:
    backend, _ = start("the sim runs small sizes as a smoke test; its times are its host "
                       "times, and the raw baseline is the sim's driver")
    sizes = GPU if backend.name == "cuda" else SIM
    c, why_no_c = None, "the C program needs a GPU; this run is on the sim"
    if backend.name == "cuda":
        cc = cuctx.Device(0).compute_capability
        image = compile_source(STEP_SOURCE, arch=f"sm_{cc.major}{cc.minor}",
                               cache_dir=False).image
        try:
            c, why_no_c = c_program(CSizes(sizes.chain, (1,), sizes.rounds), image), None
        except (OSError, subprocess.CalledProcessError) as exc:
            why_no_c = f"the C program did not build or run: {exc}"
    torch, why_no_torch = torch_or_reason()
    with cuctx.Device(0):
        graphs = [step50(sizes, torch, why_no_torch)]
        graphs.append(chain(sizes, c))
        graphs.append(decoding_small(sizes, torch, why_no_torch))
        decoding_example(sizes)
        patch_one(sizes, graphs[1], c, why_no_c)
        launcher_vs_c()
    model_beside_measured(graphs)
    print_goals()


if __name__ == "__main__":
    run(main)
