"""The loops benchmarks/autograph.py times, and the baselines written as their authors write
them: capture + update every call (llama.cpp's way, through cuctx's stream.capture and
exe.update) and PyTorch re-capturing a CUDAGraph every call (its graphs cannot be updated).

Each loop is also run once from a cold start for AutoGraph's decisions alone (`decisions`):
the same calls on a GPU and on the sim, whose counts the benchmark prints side by side.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np

import cuctx
from cuctx.examples import decoding_loop as dl

SMALL = 1024  # floats per array of the small decoding-like loops
FMA_SOURCE = r"""
extern "C" __global__ void axpb(float* o, const float* x, float a, float b, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) o[i] = x[i] * a + b;
}
"""


def axpb_twin(grid, block, o, x, a, b, n):
    """The sim's stand-in for `axpb`."""
    o.view(np.float32, n)[:] = x.view(np.float32, n) * np.float32(a) + np.float32(b)


# -- the 50-kernel step, as users write it ---------------------------------------------------

FORMS = ("bound", "docs", "launch")  # fma bound outside; kernel[grid, block](...); cuctx.launch


def step50(kernel: cuctx.Kernel, stream: cuctx.Stream, n: int, form: str) -> Callable:
    """The 50-kernel step, ``o = x*a + b`` 50 times through a temporary, a new output each
    call, written in one of `FORMS`: a launcher bound once outside (``fma = kernel[grid,
    256, 0, stream]``), the docs' form (``kernel[grid, 256](...)`` inside, on the current
    stream: run it inside ``with stream:``) or ``cuctx.launch`` inside."""
    grid, a, b = -(-n // 256), 0.5, 1.0
    if form == "docs":
        return _docs_step(kernel, grid, n)
    if form == "launch":
        return _launch_step(kernel, grid, n)
    fma = kernel[grid, 256, 0, stream]

    def step(x: cuctx.DeviceArray) -> cuctx.DeviceArray:
        t = cuctx.empty(n, np.float32, stream=stream)  # the temporary
        fma(t, x, a, b, n)
        for _ in range(48):
            fma(t, t, a, b, n)
        o = cuctx.empty(n, np.float32, stream=stream)  # the output, new every call
        fma(o, t, a, b, n)
        return o

    return step


def _docs_step(axpb: cuctx.Kernel, grid: int, n: int) -> Callable:
    def step(x: cuctx.DeviceArray) -> cuctx.DeviceArray:
        t = cuctx.empty(n, np.float32)
        axpb[grid, 256](t, x, 0.5, 1.0, n)
        for _ in range(48):
            axpb[grid, 256](t, t, 0.5, 1.0, n)
        o = cuctx.empty(n, np.float32)
        axpb[grid, 256](o, t, 0.5, 1.0, n)
        return o

    return step


def _launch_step(axpb: cuctx.Kernel, grid: int, n: int) -> Callable:
    def step(x: cuctx.DeviceArray) -> cuctx.DeviceArray:
        t = cuctx.empty(n, np.float32)
        cuctx.launch(axpb, grid, 256, t, x, 0.5, 1.0, n)
        for _ in range(48):
            cuctx.launch(axpb, grid, 256, t, t, 0.5, 1.0, n)
        o = cuctx.empty(n, np.float32)
        cuctx.launch(axpb, grid, 256, o, t, 0.5, 1.0, n)
        return o

    return step


def end_to_end(
    run: Callable[[], object], sync: Callable[[], object], count: int, calls: int = 1
) -> float:
    """us per item of ``calls`` calls of ``run`` in a row (``count`` items each), up to the
    end of their work."""
    sync()
    begin = time.perf_counter()
    for _ in range(calls):
        run()
    sync()
    return (time.perf_counter() - begin) / (count * calls) * 1e6


def small_token(kernel: cuctx.Kernel, stream: cuctx.Stream) -> Callable[..., None]:
    """The issue's decoding-like step with ``kernel`` (`axpb`: o = x*a + b): 5-8 small
    kernels, a temporary inside (``scratch`` in its place where given), the scalar ``k`` and
    the output new every call, one more kernel every 16 calls up to 8 (then 5 again)."""
    fma = kernel[-(-SMALL // 256), 256, 0, stream]

    def token(
        out: cuctx.DeviceArray,
        x: cuctx.DeviceArray,
        k: int,
        scratch: cuctx.DeviceArray | None = None,
    ) -> None:
        t = cuctx.empty(SMALL, np.float32, stream=stream) if scratch is None else scratch
        fma(t, x, 0.5, float(k), SMALL)
        for _ in range(3 + (k // 16) % 4):
            fma(t, t, 0.5, 1.0, SMALL)
        fma(out, t, 0.5, float(k), SMALL)

    token.size = SMALL
    return token


LENGTH_CALLS = 64  # calls of the loop whose lengths change
LENGTH_CHANGE = 17  # the call from which it runs one kernel more


def length_token(kernel: cuctx.Kernel, stream: cuctx.Stream) -> Callable[..., None]:
    """The issue's loop of 64 calls whose lengths change each call and whose structure
    changes at call 17: call n (1, 2, ...) writes a new output through a temporary with 4
    small kernels, 5 from call 17 on (one more chunk once the length passes 16); the
    length goes to the first kernel (where the new row is made) and the last (where it is
    written), so those two and the output are new every call."""
    fma = kernel[-(-SMALL // 256), 256, 0, stream]

    def token(out: cuctx.DeviceArray, x: cuctx.DeviceArray, n: int) -> None:
        t = cuctx.empty(SMALL, np.float32, stream=stream)
        fma(t, x, 0.5, float(n), SMALL)
        for _ in range(2 if n < LENGTH_CHANGE else 3):
            fma(t, t, 0.5, 1.0, SMALL)
        fma(out, t, 0.5, float(n), SMALL)

    token.size = SMALL
    return token


def capture_and_update(stream: cuctx.Stream, enqueue: Callable[..., None]):
    """llama.cpp's way: a maker of a fresh run's step, which captures ``enqueue(*args)`` on
    ``stream``, updates the executable with the new graph (or instantiates one when the
    structure changed) and launches it."""

    def make() -> Callable[..., None]:
        state: dict[str, cuctx.GraphExec] = {}

        def step(*args: Any) -> None:
            with stream.capture() as graph:
                enqueue(*args)
            exe = state.get("exe")
            if exe is not None:
                try:
                    exe.update(graph)
                except cuctx.GraphUpdateError:  # a new structure: a new executable
                    exe.destroy()
                    exe = None
            if exe is None:
                exe = state["exe"] = graph.instantiate()
            exe.launch(stream)

        return step

    return make


def torch_step(torch, n: int, steps: int) -> dict[str, Callable[[], float]]:
    """The step in PyTorch, one operation per kernel: eager, and torch.compile's CUDA graphs
    when it compiles here."""
    a, b = torch.tensor(0.5, device="cuda"), torch.tensor(1.0, device="cuda")

    def step(x):
        t = torch.addcmul(b, x, a)
        for _ in range(48):
            t = torch.addcmul(b, t, a)
        return torch.addcmul(b, t, a)

    inputs = [torch.ones(n, device="cuda") for _ in range(steps)]
    sync = torch.cuda.synchronize

    def loop(fn):
        def run():
            for x in inputs:
                fn(x)

        return run

    candidates = {"torch eager": lambda: end_to_end(loop(step), sync, steps)}
    try:
        compiled = torch.compile(step, backend="cudagraphs")
        for x in inputs[:5]:  # traced, recorded, then replayed
            compiled(x).clone()
        sync()
        candidates["torch.compile cudagraphs"] = lambda: end_to_end(
            loop(lambda x: compiled(x).clone()), sync, steps
        )
    except Exception as exc:  # noqa: BLE001 - whatever keeps torch.compile from running here
        print(f"  (no torch.compile baseline: {type(exc).__name__}: {exc})")
    return candidates


def torch_chain(torch, n: int):
    """The chain in a torch.cuda.CUDAGraph, captured once: its replay and a synchronize."""
    from graphs import STEP_SOURCE  # (benchmarks/graphs.py)

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


def torch_small(torch, size: int, calls: int) -> Callable[[], float]:
    """The small loop in PyTorch, one operation per kernel, re-captured into a new CUDAGraph
    every call (its scalar changes): a measurement, us per call."""
    x = torch.ones(size, device="cuda")
    a, b = torch.tensor(0.5, device="cuda"), torch.tensor(1.0, device="cuda")
    stream = torch.cuda.Stream()

    def run() -> None:
        previous = None
        with torch.cuda.stream(stream):
            for k in range(calls):
                out = torch.empty(size, device="cuda")
                graph = torch.cuda.CUDAGraph()
                graph.capture_begin()
                t = torch.add(x, float(k))
                for _ in range(3 + (k // 16) % 4):
                    t = torch.addcmul(b, t, a)
                torch.add(t, float(k), out=out)
                graph.capture_end()
                graph.replay()
                previous = graph  # noqa: F841 - kept until the next call's replay is queued
        stream.synchronize()

    def measure() -> float:
        begin = time.perf_counter()
        run()
        return (time.perf_counter() - begin) / calls * 1e6

    return measure


def torch_decoder(torch, tokens: int):
    """The same model in PyTorch tensors and kernels, re-captured into a new CUDAGraph every
    token (the sequence length changes, and a torch graph cannot be updated): a run of
    ``tokens`` tokens and its output rows."""
    kernels = {name: torch.cuda._compile_kernel(dl.SOURCE, name) for name in dl.TWINS}
    rng = np.random.default_rng(0)  # the weights of Model.create(seed=0), in its order
    weights = [
        tuple(
            torch.from_numpy(
                rng.standard_normal((dl.DIM, dl.DIM)).astype(np.float32)
                / np.float32(np.sqrt(dl.DIM))
            ).cuda()
            for _ in range(2)
        )
        for _ in range(dl.LAYERS)
    ]
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


# -- decisions: each loop once from a cold start ------------------------------------------------

COUNTS = ("calls", "replays", "updates", "builds", "eager")
WHY_KEPT = 8  # reasons kept per loop: printed where the sim and a GPU differ


def counts_of(fn: cuctx.AutoGraph) -> dict:
    """The counts, and ``why``: the reasons of the first eager calls, builds and switches."""
    s = fn.stats()
    why = [f"call {r['call']} {r['action']}: {r['reason']}" for r in s["reasons"][:WHY_KEPT]]
    return {**{k: s[k] for k in COUNTS}, "why": why}


def graphed(fn: cuctx.AutoGraph) -> float:
    """The share of calls graphs served (replays, updates and builds)."""
    s = fn.stats()
    return (s["replays"] + s["updates"] + s["builds"]) / max(s["calls"], 1)


def decisions(steps: int, small_calls: int, tokens: int, chain: int) -> dict[str, dict]:
    """AutoGraph's counts for each loop of the benchmark, run once from a cold start with
    these call counts (a GPU's and the sim's runs make the same calls; array sizes do not
    change the decisions, so the sim's arrays are small)."""
    n = 65536 if cuctx.backend().sim is None else 1024
    library = cuctx.Library.from_source(FMA_SOURCE, sim_kernels={"axpb": axpb_twin})
    kernel, stream = library["axpb"], cuctx.Stream()
    found: dict[str, dict] = {}
    with stream:
        for form in FORMS:
            step = cuctx.autograph(step50(kernel, stream, n, form))
            for _ in range(steps):
                step(cuctx.full(n, 1.0, np.float32, stream=stream))
            found[f"50-kernel step ({form})"] = counts_of(step)
    for name, make, first, calls in (
        ("small decoding loop", small_token, 0, small_calls),
        ("64-call loop", length_token, 1, LENGTH_CALLS),
    ):
        auto = cuctx.autograph(make(kernel, stream))
        x = cuctx.full(SMALL, 1.0, np.float32, stream=stream)
        for k in range(first, first + calls):
            auto(cuctx.empty(SMALL, np.float32, stream=stream), x, k)
        found[name] = counts_of(auto)
    model = dl.Model.create(cuctx.Library.from_source(dl.SOURCE, sim_kernels=dl.TWINS), tokens)
    decode = cuctx.autograph(dl.decode_token)
    dl.run(model, decode, tokens)
    found["decoding example"] = counts_of(decode)
    found[f"{chain}-kernel chain"] = _chain_decisions(chain)
    stream.synchronize()
    return found


def tiny_chain(n: int) -> tuple[cuctx.Kernel, cuctx.Stream, cuctx.DeviceArray, Callable]:
    """A chain of ``n`` tiny kernels (benchmarks/graphs.py's `step`, each waiting for the one
    before on one stream): the kernel, the stream, the array and the function enqueuing it."""
    from graphs import STEP_SOURCE, step_twin

    kernel = cuctx.Library.from_source(STEP_SOURCE, sim_kernels={"step": step_twin})["step"]
    stream = cuctx.Stream()
    x = cuctx.zeros(1024, np.float32, stream=stream)
    launcher = kernel[1, 32, 0, stream]

    def chain() -> None:
        for i in range(n):
            launcher(x, 1, i)

    return kernel, stream, x, chain


def _chain_decisions(n: int) -> dict[str, int]:
    _, stream, _, chain = tiny_chain(n)
    auto = cuctx.autograph(chain)
    for _ in range(20):
        auto()
    stream.synchronize()
    return counts_of(auto)
