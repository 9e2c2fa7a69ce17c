"""Dev tool: which explicit-pool tests crash a GPU process when they run together (the pool
crash that keeps them behind CUCTX_GPU_POOL_TESTS=1; see tests/memory/test_pool.py's
pools_on_gpu_opt_in). Each selection runs in its own pytest process, several times, on the
cuda backend (compiled paths, and pure-Python ones with --python); how each run ended is
printed, and for a crash the test it was in (faulthandler's stack).

Known so far (two H200s, driver 580): the read-only refusal of cuMemPoolSetAccess was one
trigger (cuctx no longer asks); test_pool_access, test_pool_locations and test_pool in one
process still crashed, ran past the limit or saw a kernel with no parameters.

    usage: python scripts/probe_pool_crash.py [--runs N] [--python]   (on a machine with a GPU)
"""

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MEMORY = "tests/memory/"
# From the whole to its parts: the modules alone, then the tests that make pools whose
# max_size is below the driver's reservation granularity (a division by a count of 0 inside
# the driver would raise the floating point exception seen) left out.
SELECTIONS = {
    "all three": (["test_pool_access.py", "test_pool_locations.py", "test_pool.py"], "cuda"),
    "test_pool": (["test_pool.py"], "cuda"),
    "test_pool_access": (["test_pool_access.py"], "cuda"),
    "test_pool_locations": (["test_pool_locations.py"], "cuda"),
    "all three, no small max_size": (
        ["test_pool_access.py", "test_pool_locations.py", "test_pool.py"],
        "cuda and not max_size and not repr"),
}
LIMIT_S = 90


def run(files: list[str], select: str, python_paths: bool) -> str:
    env = dict(os.environ, CUCTX_GPU_POOL_TESTS="1", PYTHONFAULTHANDLER="1",
               PYTHONPATH=str(ROOT / "src"))
    if python_paths:
        env["CUCTX_NATIVE"] = "0"
    try:
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                               "-k", select, *(MEMORY + f for f in files)], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=LIMIT_S)
    except subprocess.TimeoutExpired:
        return f"past {LIMIT_S} s"
    out = proc.stdout + proc.stderr
    if proc.returncode < 0 or "Fatal Python error" in out:
        fatal = re.search(r"Fatal Python error: ([^\n]+)", out)
        where = re.findall(r'File "[^"]*tests/memory/(\S+)", line \d+ in (test_\w+)', out)
        return (f"crashed ({fatal[1] if fatal else f'signal {-proc.returncode}'})"
                + (f" in {where[-1][0]}::{where[-1][1]}" if where else ""))
    summary = [line for line in out.splitlines()
               if re.search(r"\d+ (passed|failed|skipped|deselected).* in [\d.]+s", line)]
    failed = re.findall(r"^FAILED (\S+)", out, re.M)
    return (summary[-1] if summary else f"exit status {proc.returncode}") + (
        f"; failed: {', '.join(failed)}" if failed else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="runs of each selection")
    parser.add_argument("--python", action="store_true", help="the pure-Python paths")
    args = parser.parse_args()
    for name, (files, select) in SELECTIONS.items():
        for k in range(args.runs):
            print(f"{name:<30} run {k + 1}: {run(files, select, args.python)}", flush=True)


if __name__ == "__main__":
    main()
