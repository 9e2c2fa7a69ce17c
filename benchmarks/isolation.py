"""IsolatedExecutor: what a fault, a hang-free call and a shared array cost, against the
goals of issues 17 and 23 (GPU, one run).

- fault -> exception: a kernel's illegal address in a worker until the caller's
  WorkerFaultError (submit to exception; the driver's own report takes most of it);
- fault -> next call served: from that exception until a no-op call returns, with a cold
  replacement and with a warm standby;
- a no-op ``submit(...).result()`` round trip, on worker processes and on Ray (when
  installed; a local cluster);
- the first use of a 64 MiB array of an ipc pool in a fresh worker (its extra time over a
  no-op call): of a pool made before the worker started (the worker imported it then, so
  this is the array's import), and of a pool made after (the pool's import too);
- fault cycles: open file descriptors, zombie processes and the device's free memory before
  and after (with one live worker both times).

On the sim the workers run the sim: the numbers show cuctx's own costs (processes, pipes,
pickles), not a GPU's; CI runs it with --quick as a smoke test.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

import cuctx
from _bench import best_time, run, start

# A kernel that stores one int at the address it is given (0: an illegal address). PTX, so
# the driver needs no compiler; the sim runs the twin, which faults the same way.
STORE_PTX = b"""
.version 8.0
.target sm_70
.address_size 64
.visible .entry store(.param .u64 p)
{
    .reg .b64 %rd<2>;
    .reg .b32 %r<2>;
    ld.param.u64 %rd1, [p];
    mov.u32 %r1, 1;
    st.global.u32 [%rd1], %r1;
    ret;
}
"""


def store(grid, block, p):
    p.view(np.int32, 1)[0] = 1


def fault() -> None:
    """In a worker: launch `store` at address 0; the fault surfaces at the synchronize."""
    library = cuctx.Library.from_bytes(STORE_PTX, sim_kernels={"store": store})
    library["store"][1, 1](0)


def noop() -> None:
    pass


def touch(array: cuctx.DeviceArray) -> int:
    return array.size


def line(what: str, value: float, unit: str, goal: float, note: str = "") -> None:
    verdict = "met" if value <= goal else "MISSED"
    shown = f"{value:10d}" if isinstance(value, int) else f"{value:10.3f}"
    print(
        f"  {what:<46} {shown} {unit:<3} [goal <= {goal:g}{' ' + unit if unit else ''}] "
        f"{verdict}" + (f"  ({note})" if note else "")
    )


def open_fds() -> dict[int, str]:
    """This process's open file descriptors and what each one is."""
    fds = {}
    for entry in os.listdir("/proc/self/fd"):
        try:
            fds[int(entry)] = os.readlink(f"/proc/self/fd/{entry}")
        except OSError:  # the listing's own descriptor, closed by now
            pass
    return fds


def zombies() -> int:
    count = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            count += int(fields[1]) == os.getpid() and fields[0] == "Z"
    return count


def fault_then_serve(ex: cuctx.IsolatedExecutor) -> tuple[float, float]:
    """(submit -> WorkerFaultError, WorkerFaultError -> a no-op call's result), seconds."""
    begin = time.perf_counter()
    try:
        ex.submit(fault).result()
    except cuctx.WorkerFaultError:
        raised = time.perf_counter()
    else:
        raise RuntimeError("the faulting kernel did not fault")
    ex.submit(noop).result()
    return raised - begin, time.perf_counter() - raised


def faults(samples: int, standby_wait: float) -> None:
    print("\n== faults (median of {} each)".format(samples))
    with cuctx.IsolatedExecutor(devices=[0]) as ex:
        ex.submit(noop).result()
        cold = [fault_then_serve(ex) for _ in range(samples)]
    with cuctx.IsolatedExecutor(devices=[0], standby=True) as ex:
        ex.submit(noop).result()
        warm = []
        for _ in range(samples):
            time.sleep(standby_wait)  # the standby spent by the last fault is warm again
            warm.append(fault_then_serve(ex))
    raised = [r for r, _ in cold + warm]
    line(
        "fault -> exception",
        statistics.median(raised) * 1e3,
        "ms",
        250,
        f"worst {max(raised) * 1e3:.1f} ms",
    )
    line(
        "fault -> next call served, cold",
        statistics.median(s for _, s in cold),
        "s",
        0.5,
        f"worst {max(s for _, s in cold):.3f} s",
    )
    line(
        "fault -> next call served, warm standby",
        statistics.median(s for _, s in warm),
        "s",
        0.05,
        f"worst {max(s for _, s in warm):.3f} s",
    )


def round_trips(inner: int, with_ray: bool) -> None:
    print("\n== a no-op submit(...).result() round trip (best round)")
    with cuctx.IsolatedExecutor(devices=[0]) as ex:
        ex.submit(noop).result()
        us = best_time(lambda: ex.submit(noop).result(), inner=inner) * 1e6
        line("worker processes", us, "us", 50)
    if not with_ray:
        return
    try:
        import ray
    except ImportError:
        print("  Ray: not installed (pip install 'cuctx[ray]'), not measured")
        return
    started = time.perf_counter()
    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    with cuctx.IsolatedExecutor(devices=[0], engine="ray") as ex:
        ex.submit(noop).result()
        print(f"  (a local Ray cluster and its first actor: {time.perf_counter() - started:.1f} s)")
        us = best_time(lambda: ex.submit(noop).result(), inner=max(inner // 10, 10)) * 1e6
        line("Ray actors", us, "us", 600)
    bare = ray.remote(Echo).remote()  # Ray's own floor: an actor method call, no cuctx
    ray.get(bare.echo.remote(b""))
    floor = best_time(lambda: ray.get(bare.echo.remote(b"")), inner=max(inner // 10, 10)) * 1e6
    print(
        f"  {'a bare Ray actor call (Ray alone)':<46} {floor:10.3f} us   "
        f"Ray actors / bare = {us / floor:.2f}"
    )
    ray.shutdown()


class Echo:
    """A Ray actor that returns what it is given: the round trip Ray itself costs."""

    def echo(self, data: bytes) -> bytes:
        return data


def shared_arrays(samples: int) -> None:
    print("\n== a 64 MiB array of an ipc pool, in a fresh worker (extra time over a no-op)")
    before = cuctx.MemoryPool(0, ipc=True)  # made before the workers start
    arrays = [cuctx.empty(64 << 20, np.uint8, pool=before) for _ in range(samples + 1)]
    small = np.zeros(1, np.uint8)  # the same call without a shared array

    def call(ex, *args) -> float:
        begin = time.perf_counter()
        ex.submit(touch, *args).result()
        return time.perf_counter() - begin

    firsts, others, lates = [], [], []
    for _ in range(samples):  # a fresh executor each: a worker that never saw the arrays
        with cuctx.IsolatedExecutor(devices=[0]) as ex:
            baseline = min(call(ex, small) for _ in range(20))
            firsts.append(call(ex, arrays[0]) - baseline)
            others += [call(ex, a) - baseline for a in arrays[1:]]
            after = cuctx.MemoryPool(0, ipc=True)  # made once the worker runs
            late = cuctx.empty(64 << 20, np.uint8, pool=after)
            lates.append(call(ex, late) - baseline)
            del late, after
    line(
        "first use (a pool made before the worker)",
        statistics.median(firsts) * 1e3,
        "ms",
        1,
        f"worst {max(firsts) * 1e3:.3f} ms",
    )
    line("first use of another array of that pool", statistics.median(others) * 1e3, "ms", 1)
    print(
        f"  {'first use (a pool made after the worker)':<46} "
        f"{statistics.median(lates) * 1e3:10.3f} ms  (no goal: the pool's import too)"
    )


def cycles(count: int) -> None:
    print(f"\n== {count} fault cycles")
    device = cuctx.Device(0)
    with cuctx.IsolatedExecutor(devices=[0]) as ex:
        for _ in range(3):  # what the first faults open once (and Ray, stopped before, closes)
            try:
                ex.submit(fault).result()
            except cuctx.WorkerFaultError:
                pass
        ex.submit(noop).result()
        time.sleep(0.5)
        fds, free = open_fds(), device.mem_info().free
        replaced = ex.workers[0].replaced
        begin = time.perf_counter()
        for _ in range(count):
            try:
                ex.submit(fault).result()
            except cuctx.WorkerFaultError:
                pass
        ex.submit(noop).result()  # a live worker again, as at the start
        spent = time.perf_counter() - begin
        now, settle = open_fds(), time.monotonic() + 2
        while len(now) > len(fds) and time.monotonic() < settle:  # the last worker's reaping
            time.sleep(0.05)
            now = open_fds()
        leaked_fds, left_zombies = len(now) - len(fds), zombies()
        opened = sorted(set(now.values()) - set(fds.values()))
        lost_memory = free - device.mem_info().free
        replaced = ex.workers[0].replaced - replaced
    print(f"  {count} faults, {replaced} workers replaced, {spent / count:.3f} s per cycle")
    line(
        "file descriptors leaked",
        leaked_fds,
        "",
        0,
        f"opened since: {', '.join(opened)}" if leaked_fds > 0 else "",
    )
    line("zombie processes", left_zombies, "", 0)
    line(
        "device memory not given back",
        lost_memory // 2**20,
        "MiB",
        0,
        "cuMemGetInfo: every process's memory"
        if cuctx.backend().sim is None
        else "the sim's memory is per process: always 0 here",
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="a smoke run: few samples and cycles (CI, on the sim)"
    )
    parser.add_argument("--no-ray", action="store_true", help="leave Ray out")
    parser.add_argument(
        "--cycles",
        type=int,
        default=None,
        help="how many fault cycles (default: 100, 3 with --quick)",
    )
    options = parser.parse_args()
    quick = options.quick
    start("workers run the sim: the numbers are cuctx's own costs, not a GPU's")
    round_trips(inner=200 if quick else 2000, with_ray=not options.no_ray)
    shared_arrays(samples=2 if quick else 5)
    faults(samples=1 if quick else 5, standby_wait=0.0 if quick else 3.0)
    cycles(options.cycles if options.cycles is not None else 3 if quick else 100)


if __name__ == "__main__":
    run(main)
