"""The loops benchmarks/autograph.py times, and the baselines written as their authors write
them: capture + update every call (llama.cpp's way, through cuctx's stream.capture and
exe.update) and PyTorch re-capturing a CUDAGraph every call (its graphs cannot be updated)."""

from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np

import cuctx
from cuctx.examples import decoding_loop as dl

SMALL = 1024  # floats per array of the small decoding-like loop


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


def small_token(kernel: cuctx.Kernel, stream: cuctx.Stream) -> Callable[..., None]:
    """The issue's decoding-like step with ``kernel`` (`axpb`: o = x*a + b): 5-8 small
    kernels, a temporary inside (``scratch`` in its place where given), the scalar ``k`` and
    the output new every call, one more kernel every 16 calls up to 8 (then 5 again)."""
    fma = kernel[-(-SMALL // 256), 256, 0, stream]

    def token(out: cuctx.DeviceArray, x: cuctx.DeviceArray, k: int,
              scratch: cuctx.DeviceArray | None = None) -> None:
        t = cuctx.empty(SMALL, np.float32, stream=stream) if scratch is None else scratch
        fma(t, x, 0.5, float(k), SMALL)
        for _ in range(3 + (k // 16) % 4):
            fma(t, t, 0.5, 1.0, SMALL)
        fma(out, t, 0.5, float(k), SMALL)
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

