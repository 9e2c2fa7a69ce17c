"""A token-by-token decoding loop, run eagerly and with `@cuctx.autograph`.

Each token is a few dozen small kernels: an embedding, then per layer a norm, a projection,
a store into the KV cache, attention over the cache in chunks of 64 positions, a combine, a
residual add and a small MLP, and at the end a row of the output. One argument, the sequence
length, changes every token (where the cache row goes, where the last chunk ends); every 64
tokens a chunk kernel is added to each layer, so the work changes its structure.

`@cuctx.autograph` on the per-token function records what a call enqueues and compares it
with what it saw before: same structure with a new sequence length -> the graph's changed
nodes are patched and the graph is replayed; a new structure -> it runs eagerly until a
graph pays for it (the host costs of an H100 decide, modelled on the sim, so the sim prints
the same decisions on every run), then a graph is built. Both runs compute the same
outputs.
On the sim each kernel has a NumPy twin (the ``*_twin`` functions) doing what its CUDA code does.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import numpy as np

import cuctx

DIM, CHUNK, LAYERS = 64, 64, 3  # hidden size (one block of DIM threads), positions per chunk

SOURCE = r"""
#define D 64
#define SCALE 0.125f  /* 1 / sqrt(D) */

extern "C" __global__ void embed(float* h, int n) {
    int i = threadIdx.x;
    h[i] = sinf(0.01f * (float)(n * D + i));
}
extern "C" __global__ void rmsnorm(float* out, const float* x) {
    float ss = 0.0f;
    for (int j = 0; j < D; ++j) ss += x[j] * x[j];
    out[threadIdx.x] = x[threadIdx.x] * rsqrtf(ss / D + 1e-5f);
}
extern "C" __global__ void matvec(float* y, const float* w, const float* x) {
    float s = 0.0f;
    for (int j = 0; j < D; ++j) s += w[threadIdx.x * D + j] * x[j];
    y[threadIdx.x] = s;
}
extern "C" __global__ void store(float* cache, const float* x, int n) {
    cache[(n - 1) * D + threadIdx.x] = x[threadIdx.x];
}
/* One chunk of attention over cache rows [start, end): the chunk's max score, its sum of
   exponentials and its weighted sum of rows, for `combine` to merge (flash-decoding style). */
extern "C" __global__ void attend(float* part, const float* cache, const float* q,
                                  int start, int end) {
    int i = threadIdx.x;
    float m = -1e30f;
    for (int r = start; r < end; ++r) {
        float s = 0.0f;
        for (int j = 0; j < D; ++j) s += q[j] * cache[r * D + j];
        m = fmaxf(m, s * SCALE);
    }
    float l = 0.0f, acc = 0.0f;
    for (int r = start; r < end; ++r) {
        float s = 0.0f;
        for (int j = 0; j < D; ++j) s += q[j] * cache[r * D + j];
        float w = expf(s * SCALE - m);
        l += w;
        acc += w * cache[r * D + i];
    }
    part[2 + i] = acc;
    if (i == 0) { part[0] = m; part[1] = l; }
}
extern "C" __global__ void combine(float* out, const float* parts, int chunks) {
    int i = threadIdx.x;
    float m = -1e30f;
    for (int c = 0; c < chunks; ++c) m = fmaxf(m, parts[c * (D + 2)]);
    float l = 0.0f, acc = 0.0f;
    for (int c = 0; c < chunks; ++c) {
        float w = expf(parts[c * (D + 2)] - m);
        l += w * parts[c * (D + 2) + 1];
        acc += w * parts[c * (D + 2) + 2 + i];
    }
    out[i] = acc / l;
}
extern "C" __global__ void add(float* h, const float* x) { h[threadIdx.x] += x[threadIdx.x]; }
extern "C" __global__ void act(float* x) { x[threadIdx.x] = tanhf(x[threadIdx.x]); }
extern "C" __global__ void emit(float* out, const float* h, int n) {
    out[(n - 1) * D + threadIdx.x] = h[threadIdx.x];
}
"""

F32 = np.float32


# The sim's twins: the same effect on the same memory, in NumPy.
def embed_twin(grid, block, h, n):
    h.view(F32, DIM)[:] = np.sin(F32(0.01) * (n * DIM + np.arange(DIM)).astype(F32))


def rmsnorm_twin(grid, block, out, x):
    v = x.view(F32, DIM)
    out.view(F32, DIM)[:] = v / np.sqrt(np.dot(v, v) / F32(DIM) + F32(1e-5))


def matvec_twin(grid, block, y, w, x):
    y.view(F32, DIM)[:] = w.view(F32, DIM * DIM).reshape(DIM, DIM) @ x.view(F32, DIM)


def store_twin(grid, block, cache, x, n):
    cache.view(F32, n * DIM)[(n - 1) * DIM :] = x.view(F32, DIM)


def attend_twin(grid, block, part, cache, q, start, end):
    rows = cache.view(F32, end * DIM).reshape(end, DIM)[start:]
    scores = rows @ q.view(F32, DIM) * F32(0.125)
    m = scores.max()
    w = np.exp(scores - m)
    out = part.view(F32, DIM + 2)
    out[0], out[1], out[2:] = m, w.sum(), w @ rows


def combine_twin(grid, block, out, parts, chunks):
    p = parts.view(F32, chunks * (DIM + 2)).reshape(chunks, DIM + 2)
    w = np.exp(p[:, 0] - p[:, 0].max())
    out.view(F32, DIM)[:] = (w @ p[:, 2:]) / np.dot(w, p[:, 1])


def add_twin(grid, block, h, x):
    h.view(F32, DIM)[:] += x.view(F32, DIM)


def act_twin(grid, block, x):
    v = x.view(F32, DIM)
    v[:] = np.tanh(v)


def emit_twin(grid, block, out, h, n):
    out.view(F32, n * DIM)[(n - 1) * DIM :] = h.view(F32, DIM)


TWINS = {
    "embed": embed_twin,
    "rmsnorm": rmsnorm_twin,
    "matvec": matvec_twin,
    "store": store_twin,
    "attend": attend_twin,
    "combine": combine_twin,
    "add": add_twin,
    "act": act_twin,
    "emit": emit_twin,
}


@dataclass
class Model:
    """The kernels, weights and buffers of one decoding run (each run gets its own, so two
    runs can be compared)."""

    launch: dict[str, cuctx.Launcher]  # each kernel with one block of DIM threads on `stream`
    stream: cuctx.Stream
    weights: list[tuple[cuctx.DeviceArray, cuctx.DeviceArray]]  # per layer: attention, MLP
    caches: list[cuctx.DeviceArray]  # per layer: one row of DIM per position
    h: cuctx.DeviceArray  # the hidden state
    a: cuctx.DeviceArray  # scratch: a normed copy of h, then the MLP's activations
    q: cuctx.DeviceArray  # the projection that is stored and attended to
    o: cuctx.DeviceArray  # the attention's output
    parts: cuctx.DeviceArray  # one (max, sum, weighted rows) record per chunk
    out: cuctx.DeviceArray  # one row of DIM per token

    @classmethod
    def create(cls, library: cuctx.Library, tokens: int, seed: int = 0) -> Model:
        rng = np.random.default_rng(seed)
        stream = cuctx.Stream()

        def weight() -> cuctx.DeviceArray:
            w = rng.standard_normal((DIM, DIM)).astype(F32) / F32(np.sqrt(DIM))
            return cuctx.to_device(w, stream=stream)

        def zeros(*shape: int) -> cuctx.DeviceArray:
            return cuctx.zeros(shape, F32, stream=stream)

        chunks = -(-tokens // CHUNK)
        return cls(
            launch={name: library[name][1, DIM, 0, stream] for name in TWINS},
            stream=stream,
            weights=[(weight(), weight()) for _ in range(LAYERS)],
            caches=[zeros(tokens, DIM) for _ in range(LAYERS)],
            h=zeros(DIM),
            a=zeros(DIM),
            q=zeros(DIM),
            o=zeros(DIM),
            parts=zeros(chunks, DIM + 2),
            out=zeros(tokens, DIM),
        )


def decode_token(m: Model, n: int) -> None:
    """Enqueue the kernels of the token at sequence length ``n`` (1, 2, ...) on m.stream."""
    launch = m.launch
    chunks = -(-n // CHUNK)
    launch["embed"](m.h, n)
    for (w_attention, w_mlp), cache in zip(m.weights, m.caches):
        launch["rmsnorm"](m.a, m.h)
        launch["matvec"](m.q, w_attention, m.a)
        launch["store"](cache, m.q, n)
        for c in range(chunks):  # one more kernel every CHUNK tokens: a new structure
            launch["attend"](m.parts[c], cache, m.q, c * CHUNK, min((c + 1) * CHUNK, n))
        launch["combine"](m.o, m.parts, chunks)
        launch["add"](m.h, m.o)
        launch["rmsnorm"](m.a, m.h)
        launch["matvec"](m.o, w_mlp, m.a)
        launch["act"](m.o)
        launch["add"](m.h, m.o)
    launch["emit"](m.out, m.h, n)


def run(m: Model, step, tokens: int) -> float:
    """Decode ``tokens`` tokens with ``step`` (decode_token, or an AutoGraph of it); seconds
    per token, from the first enqueue to the end of the last token's work."""
    start = time.perf_counter()
    for n in range(1, tokens + 1):
        step(m, n)
    m.stream.synchronize()
    return (time.perf_counter() - start) / tokens


def summary(step: cuctx.AutoGraph) -> list[str]:
    """What AutoGraph did, in a few lines: how its calls were served, then why each call
    that was not served by its graph ran eagerly or built one (from ``step.stats()``)."""
    s = step.stats()
    per_token = s["patched_nodes"] / s["updates"] if s["updates"] else 0.0
    lines = [
        f"AutoGraph: {s['calls']} calls: {s['updates']} patched ({per_token:.0f} nodes "
        f"each), {s['replays']} replayed, {s['builds']} builds, {s['eager']} eager"
    ]
    lines += [f"  call {r['call']:>4}  {r['action']:<5}  {r['reason']}" for r in s["reasons"]]
    return lines


def main(tokens: int = 192) -> None:
    library = cuctx.Library.from_source(SOURCE, sim_kernels=TWINS)
    with cuctx.Device(0):
        eager_model, graph_model = Model.create(library, tokens), Model.create(library, tokens)
        step = cuctx.autograph(decode_token)
        eager = run(eager_model, decode_token, tokens)
        graphed = run(graph_model, step, tokens)
        same = np.array_equal(eager_model.out.to_host(), graph_model.out.to_host())
    kernels = [2 + LAYERS * (9 + c) for c in (1, -(-tokens // CHUNK))]
    print(
        f"{tokens} tokens of {kernels[0]} to {kernels[1]} kernels, the sequence length new "
        f"every token, a new structure every {CHUNK} tokens"
    )
    print(f"outputs of eager and AutoGraph: {'equal' if same else 'DIFFERENT'}")
    print("\n".join(summary(step)))
    if cuctx.backend().sim is None:
        print(
            f"time per token: eager {eager * 1e6:.1f} us, AutoGraph {graphed * 1e6:.1f} us "
            "(measured on the GPU)"
        )
    else:  # AutoGraph saves host time; the sim's clock models the GPU's work only
        print(
            "time per token: measured on a GPU only (the sim models the GPU's work, not the "
            "host's time, which AutoGraph saves)"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=192, help="tokens to decode")
    main(parser.parse_args().tokens)
