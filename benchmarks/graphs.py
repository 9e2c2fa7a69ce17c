"""Explicit CUDA graphs: what updating an executable costs, cuctx against C, and what
benchmarks/autograph.py takes from here (the tiny `step` kernel, the C program's numbers).

Updating an executable of N nodes of which k changed: per-node patches (exe.update_node) vs a
whole update (exe.update) vs re-instantiating, cuctx and C (benchmarks/graphs_c.c); the
crossover measured next to what AutoGraph's policy picked. (AutoGraph's own goals, with
the chain of tiny kernels and the decoding loops, are benchmarks/autograph.py's.)

Run on a GPU machine: ``python benchmarks/graphs.py`` (the C program is built with gcc
against libcuda into /tmp). ``CUCTX_BACKEND=sim`` runs small sizes as a smoke test: the C
baseline is skipped with the reason, and times are the sim's host times.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

import cuctx
from _bench import one_cpu, run, start
from cuctx.kernels._compiler import compile_source

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
    nodes: int  # nodes in the updated graph
    ks: tuple[int, ...]  # changed nodes in the update benchmark
    rounds: int  # measurements per candidate; the best counts


GPU_SIZES = Sizes(nodes=1000, ks=(1, 10, 100, 1000), rounds=5)
SIM_SIZES = Sizes(nodes=40, ks=(1, 4, 40), rounds=2)


def best_us(fn: Callable[[], object], rounds: int) -> float:
    """us of the fastest of ``rounds`` calls of ``fn``."""
    best = float("inf")
    for _ in range(rounds):
        begin = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - begin)
    return best * 1e6


# -- baselines outside cuctx ---------------------------------------------------------------


def c_program(sizes: Sizes, image: bytes) -> dict[str, float]:
    """Build and run benchmarks/graphs_c.c once; its "NAME VALUE" lines as a dict."""
    tmp = Path(tempfile.gettempdir())
    cubin, exe = tmp / "cuctx_graphs_step.cubin", tmp / "cuctx_graphs_c"
    cubin.write_bytes(image)
    cuda = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    subprocess.run(
        [
            "gcc",
            "-O2",
            "-o",
            str(exe),
            str(Path(__file__).with_name("graphs_c.c")),
            f"-I{cuda}/include",
            "-lcuda",
        ],
        check=True,
    )
    out = subprocess.run(
        [str(exe), str(cubin), "step", str(sizes.nodes), "10", *map(str, sizes.ks)],
        check=True,
        capture_output=True,
        text=True,
    )
    lines = (line.split() for line in out.stdout.splitlines())
    return {name: float(value) for name, value in lines}


# -- updates ------------------------------------------------------------------------------


def scalars(n: int, changed: int, value: int) -> list[int]:
    """Each node's scalar: 1, except ``value`` for the first ``changed`` nodes spread evenly
    over the chain (as in graphs_c.c)."""
    stride = n // changed if changed else 0
    return [value if changed and i % stride == 0 and i // stride < changed else 1 for i in range(n)]


def build_chain(
    kernel: cuctx.Kernel, x: cuctx.DeviceArray, n: int, changed: int, value: int
) -> tuple[cuctx.Graph, list[cuctx.GraphNode]]:
    """The chain as an explicit graph, with `scalars`."""
    graph, nodes, after = cuctx.Graph(), [], ()
    for i, a in enumerate(scalars(n, changed, value)):
        after = graph.launch(kernel, 1, 32, x, a, i, after=after)
        nodes.append(after)
    return graph, nodes


def autograph_updates(
    kernel: cuctx.Kernel, x: cuctx.DeviceArray, n: int, ks: tuple[int, ...], rounds: int
) -> dict[int, float | None]:
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
    while not graphed.stats()["builds"]:  # eager until a graph pays for the structure
        graphed(base)
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


def update_costs(
    kernel: cuctx.Kernel, x: cuctx.DeviceArray, n: int, k: int, rounds: int
) -> dict[str, float]:
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

    costs = {
        "patches": best_us(patches, rounds),
        "update": best_us(whole, rounds),
        "build + update": best_us(rebuild_and_update, rounds),
        "re-instantiate": best_us(reinstantiate, rounds),
    }
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
        line = (
            f"  {k:>5} {row['patches']:9.1f} {row['update']:9.1f} "
            f"{row['build + update']:10.1f} {row['re-instantiate']:9.1f}"
        )
        if c is not None:
            line += (
                f" | {c[f'patch_us_k{k}']:9.1f} {c[f'update_us_k{k}']:9.1f} "
                f"{c[f'capture_update_us_k{k}']:10.1f} {c[f'reinstantiate_us_k{k}']:9.1f}"
            )
        print(line)
    auto = autograph_updates(kernel, x, n, ks, sizes.rounds * 2)
    column = lambda name: {k: costs[k][name] for k in ks}  # noqa: E731
    print(
        f"  measured crossover, patches vs update: "
        f"{crossover(ks, column('patches'), column('update'))}; patches vs build + update: "
        f"{crossover(ks, column('patches'), column('build + update'))}"
    )
    if c is not None:
        c_column = lambda name: {k: c[f"{name}_us_k{k}"] for k in ks}  # noqa: E731
        print(
            f"  C crossover, patches vs update: "
            f"{crossover(ks, c_column('patch'), c_column('update'))}"
        )
    print(
        "  AutoGraph patches changed nodes or rebuilds the graph and updates it as a whole "
        "(build + update); what its policy did, us per update:"
    )
    for k in ks:
        cheaper = min(("patches", "build + update"), key=lambda way: costs[k][way])
        if auto[k] is None:
            print(f"    k = {k:>5}: ran the calls eagerly (graph calls did not pay)")
            continue
        chose = min(("patches", "build + update"), key=lambda way: abs(costs[k][way] - auto[k]))
        print(
            f"    k = {k:>5}: {auto[k]:9.1f} us, like {chose}; the cheaper measured: {cheaper} "
            f"({'matches' if chose == cheaper else 'DOES NOT match'})"
        )


# -- the run ----------------------------------------------------------------------------------


def c_for(sizes: Sizes) -> tuple[dict[str, float] | None, str | None]:
    """The C program's measurements for ``sizes`` (None and why where there are none)."""
    if cuctx.backend().name != "cuda":
        return None, "the C program needs a GPU; this run is on the sim"
    cc = cuctx.Device(0).compute_capability
    image = compile_source(STEP_SOURCE, arch=f"sm_{cc.major}{cc.minor}", cache_dir=False).image
    try:
        return c_program(sizes, image), None
    except (OSError, subprocess.CalledProcessError) as exc:
        return None, f"the C program did not build or run: {exc}"


def main() -> None:
    backend, _ = start("the sim runs small sizes as a smoke test; its times are its host times")
    one_cpu()
    sizes = GPU_SIZES if backend.name == "cuda" else SIM_SIZES
    c, why_no_c = c_for(sizes)
    if why_no_c:
        print(f"(no C baseline: {why_no_c})")
    with cuctx.Device(0):
        updates(sizes, c)


if __name__ == "__main__":
    run(main)
