"""CUDA graphs and AutoGraph: cuctx against raw cuda.bindings, C and PyTorch, in one run.

(a) A chain of N tiny kernels (each waits for the one before), end to end including the
    synchronize, in us per kernel: cuctx eager; `@cuctx.autograph`; the same chain captured
    with raw driver calls and replayed; the C program's replay (benchmarks/graphs_c.c);
    `torch.cuda.CUDAGraph` replay. Twice: calls in a row then one synchronize (a loop that
    calls the function again and again: the host prepares the next call while the GPU runs
    this one), and one call then a synchronize (the latency of a single call: AutoGraph's
    recording of the call comes before its graph runs). Goals, on calls in a row: AutoGraph
    >= 4x faster than cuctx eager, and <= 1.2x the raw replay per node.
(b) The decoding loop of cuctx/examples/decoding_loop.py (a few dozen kernels per token, the
    sequence length changes every token, the structure every 64 tokens), us per token over a
    whole run from a cold start: eager; AutoGraph; capture + whole update every token
    (llama.cpp's way, through cuctx's stream.capture and exe.update); PyTorch re-capturing a
    CUDAGraph for every token (its graphs cannot be updated). Goal: AutoGraph fastest.
(c) Updating an executable of N nodes of which k changed: per-node patches
    (exe.update_node) vs a whole update (exe.update) vs re-instantiating, cuctx and C; the
    crossover measured next to the one AutoGraph's decision function picks.

Run on a GPU machine: ``python benchmarks/graphs.py`` (the C program is built with gcc
against libcuda into /tmp). ``CUCTX_BACKEND=sim`` runs small sizes as a smoke test: the C
and PyTorch baselines are skipped with the reason, and times are the sim's host times.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
from cuda.bindings.driver import CUstream_flags, CUstreamCaptureMode

import cuctx
from _bench import compare, run, start
from cuctx.kernels._compiler import compile_source
from cuctx.examples import decoding_loop as dl

STEP_SOURCE = r"""
extern "C" __global__ void step(float* x, int a, int i) {
    if (threadIdx.x == 0) x[i & 1023] = x[i & 1023] * 0.5f + (float)a;
}
"""


def step_twin(grid, block, x, a, i):
    """The sim's stand-in for `step`."""
    v = x.view(np.float32, 1024)
    v[i & 1023] = v[i & 1023] * np.float32(0.5) + np.float32(a)


@dataclass(frozen=True)
class Sizes:
    nodes: int  # kernels in the chain, nodes in the updated graph
    ks: tuple[int, ...]  # changed nodes in the update benchmark
    tokens: int  # tokens per decoding run
    rounds: int  # measurements per candidate; the best counts


CALLS_IN_A_ROW = 10  # a loop calling the function again and again
GPU_SIZES = Sizes(nodes=1000, ks=(1, 10, 100, 1000), tokens=256, rounds=5)
SIM_SIZES = Sizes(nodes=40, ks=(1, 4, 40), tokens=130, rounds=2)


def end_to_end(run: Callable[[], object], sync: Callable[[], object], count: int,
               calls: int = 1) -> float:
    """us per item of ``calls`` calls of ``run`` in a row (``count`` items each), up to the
    end of their work."""
    sync()
    begin = time.perf_counter()
    for _ in range(calls):
        run()
    sync()
    return (time.perf_counter() - begin) / (count * calls) * 1e6


def best_us(fn: Callable[[], object], rounds: int) -> float:
    """us of the fastest of ``rounds`` calls of ``fn``."""
    best = float("inf")
    for _ in range(rounds):
        begin = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - begin)
    return best * 1e6


def check(result: tuple, operation: str):
    """The values of a raw driver call; its error as an exception."""
    if result[0]:
        raise RuntimeError(f"{operation} failed: {result[0]!r}")
    return result[1] if len(result) == 2 else result[1:]


# -- baselines outside cuctx ---------------------------------------------------------------

def c_program(sizes: Sizes, image: bytes) -> dict[str, float]:
    """Build and run benchmarks/graphs_c.c once; its "NAME VALUE" lines as a dict."""
    tmp = Path(tempfile.gettempdir())
    cubin, exe = tmp / "cuctx_graphs_step.cubin", tmp / "cuctx_graphs_c"
    cubin.write_bytes(image)
    cuda = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    subprocess.run(["gcc", "-O2", "-o", str(exe), str(Path(__file__).with_name("graphs_c.c")),
                    f"-I{cuda}/include", "-lcuda"], check=True)
    out = subprocess.run([str(exe), str(cubin), "step", str(sizes.nodes), "10",
                          *map(str, sizes.ks)], check=True, capture_output=True, text=True)
    lines = (line.split() for line in out.stdout.splitlines())
    return {name: float(value) for name, value in lines}


def raw_replay(backend, kernel: cuctx.Kernel, x: cuctx.DeviceArray, n: int):
    """The chain captured with raw driver calls on a raw stream, instantiated once: a replay
    (cuGraphLaunch) and the stream's synchronize."""
    drv = backend.driver
    stream = check(drv.cuStreamCreate(int(CUstream_flags.CU_STREAM_NON_BLOCKING)),
                   "cuStreamCreate")
    p, a, i = ctypes.c_void_p(x.ptr), ctypes.c_int(1), ctypes.c_int(0)
    packed = (ctypes.c_void_p * 3)(ctypes.addressof(p), ctypes.addressof(a), ctypes.addressof(i))
    check((drv.cuStreamBeginCapture(
        stream, CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)[0], None),
          "cuStreamBeginCapture")
    for index in range(n):  # the driver copies the parameters at each launch
        i.value = index
        drv.cuLaunchKernel(kernel._function, 1, 1, 1, 32, 1, 1, 0, stream,
                           ctypes.addressof(packed), 0)
    graph = check(drv.cuStreamEndCapture(stream), "cuStreamEndCapture")
    exe = check(drv.cuGraphInstantiate(graph, 0), "cuGraphInstantiate")
    launch, synchronize = drv.cuGraphLaunch, drv.cuStreamSynchronize
    return (lambda: launch(exe, stream)), (lambda: synchronize(stream))


def torch_or_reason():
    """(torch, None) when PyTorch can run kernels on this GPU, else (None, why not)."""
    if cuctx.backend().name != "cuda":
        return None, "PyTorch needs a GPU; this run is on the sim"
    try:
        import torch
    except ImportError as exc:
        return None, f"PyTorch cannot be imported ({exc})"
    if not torch.cuda.is_available():
        return None, "PyTorch sees no CUDA device"
    if getattr(torch.cuda, "_compile_kernel", None) is None:
        return None, f"torch {torch.__version__} has no torch.cuda._compile_kernel"
    return torch, None


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
        with torch.cuda.stream(stream):  # (replay() launches on the current stream)
            graph.replay()
    return replay, stream.synchronize


# -- (a) the chain --------------------------------------------------------------------------

def chain(sizes: Sizes, raw: str, c: dict[str, float] | None, why_no_c: str | None) -> None:
    n = sizes.nodes
    library = cuctx.Library.from_source(STEP_SOURCE, sim_kernels={"step": step_twin})
    kernel = library["step"]
    stream = cuctx.Stream()
    x = cuctx.zeros(1024, np.float32, stream=stream)
    launcher = kernel[1, 32, 0, stream]

    def eager() -> None:
        for i in range(n):
            launcher(x, 1, i)
    graphed = cuctx.autograph(eager)
    for _ in range(4):  # seen twice, built, then replayed
        graphed()
    sync = stream.synchronize
    replay, raw_sync = raw_replay(cuctx.backend(), kernel, x, n)
    torch, why_no_torch = torch_or_reason()
    runs = {"cuctx eager": (eager, sync), "cuctx AutoGraph": (graphed, sync),
            f"raw {raw} replay": (replay, raw_sync)}
    if torch is not None:
        runs["torch CUDAGraph replay"] = torch_chain(torch, n)
    best = {}
    for calls, what in ((CALLS_IN_A_ROW, f"{CALLS_IN_A_ROW} calls in a row"),
                        (1, "one call")):
        candidates = {name: (lambda run=run, s=s, k=calls: end_to_end(run, s, n, k))
                      for name, (run, s) in runs.items()}
        if c is not None and calls == 1:  # (the C program measures one call)
            candidates["C graph replay"] = lambda: c["replay_us_per_node"]
            candidates["C eager"] = lambda: c["eager_us_per_kernel"]
        measured = compare(f"a chain of {n} tiny kernels, {what} then a synchronize, per "
                           "kernel", candidates, unit="us", reference="cuctx AutoGraph",
                           rounds=sizes.rounds * (1 if calls > 1 else 4))
        best = best or measured  # the goals are on calls in a row
    for name, why in (("C", why_no_c), ("torch", why_no_torch)):
        if why:
            print(f"  (no {name} baseline: {why})")
    if c is not None:
        print(f"  C: capture {c['capture_ms']:.3f} ms, instantiate {c['instantiate_ms']:.3f} ms "
              f"for {n} nodes")
    stats = graphed.stats()
    print(f"  AutoGraph: {stats['calls']} calls, {stats['replays']} replays, "
          f"{stats['builds']} builds, {stats['eager']} eager")
    auto = best["cuctx AutoGraph"]
    print(f"  goals, on {CALLS_IN_A_ROW} calls in a row:")
    goal("AutoGraph >= 4x faster than cuctx eager", best["cuctx eager"] / auto, ">=", 4.0,
         "eager / AutoGraph")
    goal(f"AutoGraph <= 1.2x the raw {raw} replay per node", auto / best[f"raw {raw} replay"],
         "<=", 1.2, "AutoGraph / raw")


def goal(what: str, value: float, sense: str, target: float, ratio: str) -> None:
    met = value >= target if sense == ">=" else value <= target
    sim = " (on the sim: host times, not a GPU result)" if cuctx.backend().sim else ""
    print(f"  goal: {what}: {ratio} = {value:.2f} ({'met' if met else 'NOT met'}){sim}")


# -- (b) the decoding loop -------------------------------------------------------------------

def capture_and_update() -> Callable[[dl.Model, int], None]:
    """llama.cpp's way: every token captured, then the executable updated (or instantiated
    when the structure changed) and launched."""
    state: dict[str, cuctx.GraphExec] = {}

    def token(m: dl.Model, n: int) -> None:
        with m.stream.capture() as graph:
            dl.decode_token(m, n)
        exe = state.get("exe")
        if exe is not None:
            try:
                exe.update(graph)
            except cuctx.GraphUpdateError:  # a new structure: a new executable
                exe.destroy()
                exe = None
        if exe is None:
            exe = state["exe"] = graph.instantiate()
        exe.launch(m.stream)
    return token


def torch_decoder(torch, tokens: int):
    """The same model in PyTorch tensors and kernels, re-captured into a new CUDAGraph every
    token (the sequence length changes, and a torch graph cannot be updated): a run of
    ``tokens`` tokens and its output rows."""
    kernels = {name: torch.cuda._compile_kernel(dl.SOURCE, name) for name in dl.TWINS}
    rng = np.random.default_rng(0)  # the weights of Model.create(seed=0), in its order
    weights = [tuple(torch.from_numpy(rng.standard_normal((dl.DIM, dl.DIM)).astype(np.float32)
                                      / np.float32(np.sqrt(dl.DIM))).cuda() for _ in range(2))
               for _ in range(dl.LAYERS)]
    zeros = lambda *shape: torch.zeros(shape, device="cuda")  # noqa: E731
    caches = [zeros(tokens, dl.DIM) for _ in range(dl.LAYERS)]
    h, a, q, o = (zeros(dl.DIM) for _ in range(4))
    parts, out = zeros(-(-tokens // dl.CHUNK), dl.DIM + 2), zeros(tokens, dl.DIM)
    stream = torch.cuda.Stream()

    def k(name: str, *args) -> None:
        kernels[name](grid=(1, 1, 1), block=(dl.DIM, 1, 1), args=list(args))

    def enqueue(n: int) -> None:  # decoding_loop.decode_token, kernel for kernel
        chunks = -(-n // dl.CHUNK)
        k("embed", h, n)
        for (w_attention, w_mlp), cache in zip(weights, caches):
            k("rmsnorm", a, h)
            k("matvec", q, w_attention, a)
            k("store", cache, q, n)
            for c in range(chunks):
                k("attend", parts[c], cache, q, c * dl.CHUNK, min((c + 1) * dl.CHUNK, n))
            k("combine", o, parts, chunks)
            k("add", h, o)
            k("rmsnorm", a, h)
            k("matvec", o, w_mlp, a)
            k("act", o)
            k("add", h, o)
        k("emit", out, h, n)

    def run() -> None:
        previous = None
        with torch.cuda.stream(stream):
            for n in range(1, tokens + 1):
                graph = torch.cuda.CUDAGraph()
                graph.capture_begin()
                enqueue(n)
                graph.capture_end()
                graph.replay()
                previous = graph  # noqa: F841 - kept until the next token's replay is queued
        stream.synchronize()
    return run, out


def decoding(sizes: Sizes) -> None:
    tokens = sizes.tokens
    library = cuctx.Library.from_source(dl.SOURCE, sim_kernels=dl.TWINS)
    models = {name: dl.Model.create(library, tokens)
              for name in ("eager", "AutoGraph", "capture + update")}
    last: dict[str, object] = {}

    def autograph_run() -> float:
        step = last["AutoGraph"] = cuctx.autograph(dl.decode_token)  # a cold start every run
        return dl.run(models["AutoGraph"], step, tokens) * 1e6
    candidates = {
        "eager": lambda: dl.run(models["eager"], dl.decode_token, tokens) * 1e6,
        "AutoGraph": autograph_run,
        "capture + update": lambda: dl.run(models["capture + update"], capture_and_update(),
                                           tokens) * 1e6}
    torch, why_no_torch = torch_or_reason()
    if torch is not None:
        t_run, t_out = torch_decoder(torch, tokens)
        candidates["torch re-capture"] = lambda: best_us(t_run, 1) / tokens
    best = compare(f"decoding loop: {tokens} tokens, a new structure every {dl.CHUNK}, "
                   "per token", candidates, unit="us", reference="AutoGraph",
                   rounds=sizes.rounds)
    if why_no_torch:
        print(f"  (no torch baseline: {why_no_torch})")
    reference = models["eager"].out.to_host()
    outputs = {name: m.out.to_host() for name, m in models.items()}
    if torch is not None:
        outputs["torch re-capture"] = t_out.cpu().numpy()
    print("  outputs equal to eager: " + ", ".join(
        f"{name} {'yes' if np.array_equal(out, reference) else 'NO'}"
        for name, out in outputs.items() if name != "eager"))
    stats = last["AutoGraph"].stats()
    print(f"  AutoGraph (last run): {stats['replays']} replays, {stats['updates']} served by "
          f"patching, {stats['builds']} builds, {stats['eager']} eager of {stats['calls']}")
    fastest = min(best, key=best.get)
    goal(f"AutoGraph fastest (fastest: {fastest})", best[fastest] / best["AutoGraph"], ">=", 1.0,
         "fastest / AutoGraph")


# -- (c) updates ------------------------------------------------------------------------------

def scalars(n: int, changed: int, value: int) -> list[int]:
    """Each node's scalar: 1, except ``value`` for the first ``changed`` nodes spread evenly
    over the chain (as in graphs_c.c)."""
    stride = n // changed if changed else 0
    return [value if changed and i % stride == 0 and i // stride < changed else 1
            for i in range(n)]


def build_chain(kernel: cuctx.Kernel, x: cuctx.DeviceArray, n: int, changed: int,
                value: int) -> tuple[cuctx.Graph, list[cuctx.GraphNode]]:
    """The chain as an explicit graph, with `scalars`."""
    graph, nodes, after = cuctx.Graph(), [], ()
    for i, a in enumerate(scalars(n, changed, value)):
        after = graph.launch(kernel, 1, 32, x, a, i, after=after)
        nodes.append(after)
    return graph, nodes


def autograph_updates(kernel: cuctx.Kernel, x: cuctx.DeviceArray, n: int,
                      ks: tuple[int, ...], rounds: int) -> dict[int, float | None]:
    """What AutoGraph's own policy does: the chain under @cuctx.autograph, called with k nodes
    changed and back, `rounds` times per k; its mean us per update (from its stats), None
    where it ran the calls eagerly instead."""
    stream = cuctx.Stream()
    launcher = kernel[1, 32, 0, stream]

    def chain(values: list[int]) -> None:
        for i, a in enumerate(values):
            launcher(x, a, i)
    graphed = cuctx.autograph(chain)
    base = scalars(n, 0, 1)
    graphed(base)
    graphed(base)  # seen twice: built
    per_update: dict[int, float | None] = {}
    for k in ks:
        changed = scalars(n, k, 2)
        before = graphed.stats()
        for _ in range(rounds):
            graphed(changed)
            graphed(base)
        after = graphed.stats()
        count = after["updates"] - before["updates"]
        per_update[k] = (after["update_s"] - before["update_s"]) / count * 1e6 if count else None
    stream.synchronize()
    return per_update


def update_costs(kernel: cuctx.Kernel, x: cuctx.DeviceArray, n: int, k: int,
                 rounds: int) -> dict[str, float]:
    """us of each way to bring an executable of the chain to a version with k nodes changed;
    each measurement flips between the two versions, so every one really changes k nodes."""
    base, nodes = build_chain(kernel, x, n, 0, 1)
    changed, _ = build_chain(kernel, x, n, k, 2)
    versions, flips = (base, changed), iter(range(1 << 30))
    exe = base.instantiate()
    stride = n // k

    def patches() -> None:
        value = 2 if next(flips) % 2 else 1
        for j in range(k):
            exe.update_node(nodes[j * stride], x, value, j * stride)

    def whole() -> None:
        exe.update(versions[next(flips) % 2])

    def rebuild_and_update() -> None:
        exe.update(build_chain(kernel, x, n, k, 2 if next(flips) % 2 else 1)[0])

    holder = [exe]

    def reinstantiate() -> None:
        fresh = versions[next(flips) % 2].instantiate()
        holder[0].destroy()
        holder[0] = fresh
    costs = {"patches": best_us(patches, rounds), "update": best_us(whole, rounds),
             "build + update": best_us(rebuild_and_update, rounds),
             "re-instantiate": best_us(reinstantiate, rounds)}
    holder[0].destroy()
    return costs


def crossover(ks: tuple[int, ...], patches: dict[int, float], whole: dict[int, float]) -> str:
    """Where per-node patches stop being cheaper than a whole update, by linear
    interpolation between the measured k."""
    for lo, hi in zip(ks, ks[1:]):
        d_lo, d_hi = patches[lo] - whole[lo], patches[hi] - whole[hi]
        if d_lo < 0 <= d_hi:
            return f"k ~ {lo + (hi - lo) * -d_lo / (d_hi - d_lo):.0f}"
    if patches[ks[0]] >= whole[ks[0]]:
        return f"below k = {ks[0]} (a whole update is cheaper at every k measured)"
    return f"above k = {ks[-1]} (patches are cheaper at every k measured)"


def updates(sizes: Sizes, c: dict[str, float] | None) -> None:
    n, ks = sizes.nodes, sizes.ks
    library = cuctx.Library.from_source(STEP_SOURCE, sim_kernels={"step": step_twin})
    kernel = library["step"]
    x = cuctx.zeros(1024, np.float32)
    cuctx.synchronize()  # zeroed on the default stream; it is used on streams of their own
    costs = {k: update_costs(kernel, x, n, k, sizes.rounds * 2) for k in ks}
    print(f"\n== updating an executable of {n} nodes, k of them changed (us; lower is better)")
    header = f"  {'k':>5} {'patches':>9} {'update':>9} {'build+upd':>10} {'re-inst':>9}"
    if c is not None:
        header += f" | {'C patch':>9} {'C update':>9} {'C capt+upd':>10} {'C re-inst':>9}"
    print(header)
    for k in ks:
        row = costs[k]
        line = (f"  {k:>5} {row['patches']:9.1f} {row['update']:9.1f} "
                f"{row['build + update']:10.1f} {row['re-instantiate']:9.1f}")
        if c is not None:
            line += (f" | {c[f'patch_us_k{k}']:9.1f} {c[f'update_us_k{k}']:9.1f} "
                     f"{c[f'capture_update_us_k{k}']:10.1f} {c[f'reinstantiate_us_k{k}']:9.1f}")
        print(line)
    auto = autograph_updates(kernel, x, n, ks, sizes.rounds * 2)
    column = lambda name: {k: costs[k][name] for k in ks}  # noqa: E731
    print(f"  measured crossover, patches vs update: "
          f"{crossover(ks, column('patches'), column('update'))}; patches vs build + update: "
          f"{crossover(ks, column('patches'), column('build + update'))}")
    if c is not None:
        c_column = lambda name: {k: c[f"{name}_us_k{k}"] for k in ks}  # noqa: E731
        print(f"  C crossover, patches vs update: "
              f"{crossover(ks, c_column('patch'), c_column('update'))}")
    print("  AutoGraph patches changed nodes or rebuilds the graph and updates it as a whole "
          "(build + update); what its policy did, us per update:")
    for k in ks:
        cheaper = min(("patches", "build + update"), key=lambda way: costs[k][way])
        if auto[k] is None:
            print(f"    k = {k:>5}: ran the calls eagerly (graph calls did not pay)")
            continue
        chose = min(("patches", "build + update"), key=lambda way: abs(costs[k][way] - auto[k]))
        print(f"    k = {k:>5}: {auto[k]:9.1f} us, like {chose}; the cheaper measured: {cheaper} "
              f"({'matches' if chose == cheaper else 'DOES NOT match'})")


# -- the run ----------------------------------------------------------------------------------

def main() -> None:
    backend, raw = start("the sim runs small sizes as a smoke test; its times are its host "
                         "times, and the raw baseline is the sim's driver")
    sizes = GPU_SIZES if backend.name == "cuda" else SIM_SIZES
    c, why_no_c = None, None
    if backend.name == "cuda":
        cc = cuctx.Device(0).compute_capability
        image = compile_source(STEP_SOURCE, arch=f"sm_{cc.major}{cc.minor}", cache_dir=False).image
        try:
            c = c_program(sizes, image)
        except (OSError, subprocess.CalledProcessError) as exc:
            why_no_c = f"the C program did not build or run: {exc}"
    else:
        why_no_c = "the C program needs a GPU; this run is on the sim"
    with cuctx.Device(0):
        chain(sizes, raw, c, why_no_c)
        decoding(sizes)
        updates(sizes, c)


if __name__ == "__main__":
    run(main)
