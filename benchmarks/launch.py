"""Host cost of one kernel launch: cuctx against C and the Python peers, all in one run.

The kernel is empty and takes two arguments (a device pointer and an int). Each candidate
submits batches of 128 launches on its own non-blocking stream (128 fit the launch queue,
so no submission waits for the GPU), synchronizes between batches, and times only the
submissions; the best batch counts. Results are printed in ns per launch and as ratios to
the C program launching the same kind of handle (lower is better): a context-independent
CUkernel (cuLibraryGetKernel: cuctx.Library, cuda.bindings, cuda.core) or a module's
CUfunction (cuModuleGetFunction: cuctx.Module, CuPy, PyTorch). cuctx runs on both of its
paths: "native" (the compiled fast path, `cuctx.backend().native`) and "Python" (the checked
paths with their generated fast paths, as with CUCTX_NATIVE=0). The C baseline
(benchmarks/launch_c.c) is built at run time with gcc into /tmp. Also timed:
`Library.from_source` on a cold cache against a cache hit.

Run on a GPU machine: ``python benchmarks/launch.py``. Peers that are not installed are
skipped with a note. The process and its C program stay on one CPU (`_bench.one_cpu`).
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import cuctx  # noqa: E402
from _bench import one_cpu  # noqa: E402
from cuctx.kernels._compiler import compile_source  # noqa: E402

SOURCE = 'extern "C" __global__ void empty(float* p, int n) {}'
BATCH, BATCHES = 128, 200


def timed(submit_batch, synchronize) -> float:
    """ns per launch of the best batch."""
    best = float("inf")
    for _ in range(BATCHES):
        start = time.perf_counter_ns()
        submit_batch()
        best = min(best, time.perf_counter_ns() - start)
        synchronize()
    return best / BATCH


def succeeded(result: tuple) -> None:
    """A raw driver call's result: a benchmark must never time calls that fail (a refused
    launch returns in a fraction of a real one's time)."""
    if result[0]:
        raise RuntimeError(f"the timed launch failed: {result[0]!r}")


# -- candidates: each returns a measure() -> ns per launch --------------------------------


def c_program(cubin: Path):
    """The C program's two numbers, measured in one run of it: {"CUkernel": ns, ...}."""
    cuda = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    exe = Path(tempfile.gettempdir()) / "cuctx_launch_c"
    subprocess.run(
        [
            "gcc",
            "-O2",
            "-o",
            str(exe),
            str(Path(__file__).with_name("launch_c.c")),
            f"-I{cuda}/include",
            "-lcuda",
        ],
        check=True,
    )

    def measure() -> dict[str, float]:
        out = subprocess.run(
            [str(exe), str(cubin), "empty", str(BATCHES)],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        return {kind: float(ns) for kind, ns in (line.split() for line in out.splitlines())}

    return measure


class python_path:
    """``with python_path():`` the active backend's hot paths are the Python ones, as with
    CUCTX_NATIVE=0 (the compiled methods hand every call to them)."""

    def __enter__(self):
        self.backend = cuctx.backend()
        self.native, self.backend.native = self.backend.native, None

    def __exit__(self, *exc_info):
        self.backend.native = self.native


def on_python_path(measure):
    def measured():
        with python_path():
            return measure()

    return measured


def cuctx_candidates(image: bytes):
    """cuctx's launches on each of its paths: the launcher, kernel[...](...), cuctx.launch
    (a Library's CUkernel) and a Module's launcher (a CUfunction)."""
    library = cuctx.Library.from_bytes(image)
    kernel = library["empty"]
    with cuctx.Device(0):
        module = cuctx.Module.from_bytes(image)
        data = cuctx.zeros(256, np.float32)
    candidates = {}
    paths = [("native", cuctx.backend().native is not None), ("Python", True)]
    for path, available in paths:
        if not available:
            print(f"(no native path: {cuctx.backend().native_reason})")
            continue
        wrap = on_python_path if path == "Python" else (lambda measure: measure)
        with cuctx.Device(0):
            stream = cuctx.Stream()  # one per path: each path's launchers are its own
        if path == "Python":
            with python_path():
                launcher, function = kernel[1, 32, 0, stream], module["empty"][1, 32, 0, stream]
                launcher(data, 3), function(data, 3)  # the first call makes the fast path
        else:
            launcher, function = kernel[1, 32, 0, stream], module["empty"][1, 32, 0, stream]
            launcher(data, 3), function(data, 3)

        def held(launcher=launcher):
            for _ in range(BATCH):
                launcher(data, 3)

        def subscript(stream=stream):
            for _ in range(BATCH):
                kernel[1, 32, 0, stream](data, 3)

        def as_function(stream=stream):
            for _ in range(BATCH):
                cuctx.launch(kernel, 1, 32, data, 3, stream=stream)

        def module_held(function=function):
            for _ in range(BATCH):
                function(data, 3)

        sync = stream.synchronize
        candidates.update(
            {
                (f"cuctx launcher ({path})", "CUkernel"): wrap(lambda f=held, s=sync: timed(f, s)),
                (f"cuctx kernel[...](...) ({path})", "CUkernel"): wrap(
                    lambda f=subscript, s=sync: timed(f, s)
                ),
                (f"cuctx.launch ({path})", "CUkernel"): wrap(
                    lambda f=as_function, s=sync: timed(f, s)
                ),
                (f"cuctx Module launcher ({path})", "CUfunction"): wrap(
                    lambda f=module_held, s=sync: timed(f, s)
                ),
            }
        )
    # The driver floor for these very objects: cuctx's kernel, stream and array, launched
    # through cuda.bindings with a void** packed once. cuctx launcher / this = cuctx's own cost.
    from cuda.bindings import driver as drv

    p, n = ctypes.c_void_p(data.ptr), ctypes.c_int(3)
    packed = (ctypes.c_void_p * 2)(ctypes.addressof(p), ctypes.addressof(n))
    address, cu_function, handle = ctypes.addressof(packed), kernel._function, stream._handle

    def floor(keep=(p, n, packed)):  # the void** and what it points to stay alive
        for _ in range(BATCH):
            result = drv.cuLaunchKernel(cu_function, 1, 1, 1, 32, 1, 1, 0, handle, address, 0)
        succeeded(result)

    candidates[("same objects, raw void**", "CUkernel")] = lambda: timed(floor, stream.synchronize)
    return candidates


def bindings_candidates(image: bytes):
    from cuda.bindings import driver as drv

    err, lib = drv.cuLibraryLoadData(image, None, None, 0, None, None, 0)
    assert not err, err
    err, kernel = drv.cuLibraryGetKernel(lib, b"empty")
    assert not err, err
    function = drv.CUfunction(int(kernel))
    with cuctx.Device(0):
        err, stream = drv.cuStreamCreate(1)
        assert not err, err
        err, ptr = drv.cuMemAlloc(1024)
        assert not err, err
    params = ((int(ptr), 3), (ctypes.c_void_p, ctypes.c_int))  # the documented tuple form
    p, n = ctypes.c_void_p(int(ptr)), ctypes.c_int(3)
    packed = (ctypes.c_void_p * 2)(ctypes.addressof(p), ctypes.addressof(n))
    address = ctypes.addressof(packed)  # the void** form, packed by hand once

    def tuples():
        for _ in range(BATCH):
            result = drv.cuLaunchKernel(function, 1, 1, 1, 32, 1, 1, 0, stream, params, 0)
        succeeded(result)

    def prepacked(keep=(p, n, packed)):  # the void** and what it points to stay alive
        for _ in range(BATCH):
            result = drv.cuLaunchKernel(function, 1, 1, 1, 32, 1, 1, 0, stream, address, 0)
        succeeded(result)

    def sync():
        drv.cuStreamSynchronize(stream)

    return {
        ("cuda.bindings (tuples)", "CUkernel"): lambda: timed(tuples, sync),
        ("cuda.bindings (void**)", "CUkernel"): lambda: timed(prepacked, sync),
    }


def cuda_core_candidates(image: bytes):
    try:
        from cuda.core import Device, LaunchConfig, ObjectCode, launch
    except ImportError:
        from cuda.core.experimental import Device, LaunchConfig, ObjectCode, launch
    device = Device(0)
    device.set_current()
    kernel = ObjectCode.from_cubin(image).get_kernel("empty")
    stream = device.create_stream()
    buffer = device.memory_resource.allocate(1024, stream=stream)
    config = LaunchConfig(grid=1, block=32)
    n = np.int32(3)

    def batch():
        for _ in range(BATCH):
            launch(stream, config, kernel, buffer, n)

    return {("cuda.core", "CUkernel"): lambda: timed(batch, stream.sync)}


def cupy_candidates():
    import cupy

    kernel = cupy.RawKernel(SOURCE, "empty")
    stream = cupy.cuda.Stream(non_blocking=True)
    data = cupy.zeros(256, cupy.float32)
    n = np.int32(3)

    def batch():
        with stream:
            for _ in range(BATCH):
                kernel((1,), (32,), (data, n))

    return {("CuPy RawKernel", "CUfunction"): lambda: timed(batch, stream.synchronize)}


def torch_candidates():
    import torch

    data = torch.zeros(256, device="cuda")
    stream = torch.cuda.Stream()
    compile_kernel = getattr(torch.cuda, "_compile_kernel", None)
    if compile_kernel is not None:
        kernel = compile_kernel(SOURCE, "empty")

        def batch():
            with torch.cuda.stream(stream):
                for _ in range(BATCH):
                    kernel(grid=(1, 1, 1), block=(32, 1, 1), args=[data, 3])

        name = "PyTorch _compile_kernel"
    else:  # no raw-kernel launch in this torch: its cheapest kernel-launching op instead
        small = torch.zeros(1, device="cuda")

        def batch():
            with torch.cuda.stream(stream):
                for _ in range(BATCH):
                    small.zero_()

        name = "PyTorch tensor.zero_()"
    return {(name, "CUfunction"): lambda: timed(batch, stream.synchronize)}


# -- the run ------------------------------------------------------------------------------


def compile_times() -> None:
    with tempfile.TemporaryDirectory() as cache:
        start = time.perf_counter()
        cuctx.Library.from_source(SOURCE, cache_dir=cache)
        cold = time.perf_counter() - start
        best = float("inf")
        for _ in range(5):
            start = time.perf_counter()
            cuctx.Library.from_source(SOURCE, cache_dir=cache)
            best = min(best, time.perf_counter() - start)
    print(
        f"\n== Library.from_source: cold compile {cold * 1e3:.1f} ms, cache hit "
        f"{best * 1e3:.2f} ms ({cold / best:.0f}x faster)"
    )


def main() -> None:
    if cuctx.backend().name != "cuda":
        sys.exit(f"benchmarks/launch.py needs a GPU ({cuctx.backend()})")
    one_cpu()
    device = cuctx.Device(0)
    cc = device.compute_capability
    image = compile_source(SOURCE, arch=f"sm_{cc.major}{cc.minor}", cache_dir=False).image
    cubin = Path(tempfile.gettempdir()) / "cuctx_launch_empty.cubin"
    cubin.write_bytes(image)

    c_measure = c_program(cubin)
    candidates = cuctx_candidates(image)
    for name, make in (
        ("cuda.bindings", lambda: bindings_candidates(image)),
        ("cuda.core", lambda: cuda_core_candidates(image)),
        ("CuPy", cupy_candidates),
        ("PyTorch", torch_candidates),
    ):
        try:
            candidates.update(make())
        except Exception as exc:  # noqa: BLE001 - a peer's missing package or changed API
            print(f"(no {name} baseline: {type(exc).__name__}: {exc})")

    best: dict[tuple[str, str], float] = {}
    for _ in range(5):  # rounds interleaved, so drift hits every candidate alike
        for kind, ns in c_measure().items():
            best[("C cuLaunchKernel", kind)] = min(best.get(("C cuLaunchKernel", kind), ns), ns)
        for key, measure in candidates.items():
            best[key] = min(best.get(key, float("inf")), measure())
    print(
        f"\n== host cost per launch, empty kernel, 2 arguments, batches of {BATCH} "
        f"({device.name}; lower is better; each against C launching the same kind)"
    )
    for (name, kind), ns in sorted(best.items(), key=lambda item: item[1]):
        c = best[("C cuLaunchKernel", kind)]
        print(f"  {name:<34} {kind:<10} {ns:8.0f} ns   {ns / c:5.2f}x C")
    print("\n== ratios (issue 11's targets in brackets)")
    floor = best[("same objects, raw void**", "CUkernel")]
    for path in ("native", "Python"):
        launcher = best.get((f"cuctx launcher ({path})", "CUkernel"))
        if launcher is None:
            continue
        c = best[("C cuLaunchKernel", "CUkernel")]
        module = best[(f"cuctx Module launcher ({path})", "CUfunction")]
        print(
            f"  {path}: launcher / C {launcher / c:.3f} [<= 1.05]; launcher / raw "
            f"cuda.bindings void** {launcher / floor:.3f} [<= 1.0]; kernel[...] / launcher "
            f"{best[(f'cuctx kernel[...](...) ({path})', 'CUkernel')] / launcher:.3f} "
            f"[<= 1.15]; cuctx.launch / launcher "
            f"{best[(f'cuctx.launch ({path})', 'CUkernel')] / launcher:.3f} [<= 1.15]; "
            f"Module launcher / C CUfunction "
            f"{module / best[('C cuLaunchKernel', 'CUfunction')]:.3f}"
        )
    native = best.get(("cuctx launcher (native)", "CUkernel"))
    for (name, _), ns in best.items():
        if native is not None and name in ("cuda.core", "CuPy RawKernel"):
            print(f"  cuctx launcher (native) / {name} {native / ns:.3f} [< 1]")
    compile_times()


if __name__ == "__main__":
    main()
