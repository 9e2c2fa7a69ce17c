"""What benchmarks/autograph.py prints at the end: the goal lines (measured, goal, met), the
decisions of each loop on this backend beside the sim's (on a GPU the sim's come from a
child process making the same calls), and the sim's host-cost model beside what was
measured here."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import cuctx
from _autograph_loops import COUNTS
from cuctx._driver.sim import _timing
from cuctx.graphs import _autograph_policy

GOALS: list[tuple[str, float | None, str, float, str]] = []  # what, value, sense, target, note
WITHIN = 0.1  # the sim's counts agree with a GPU's within this share of the calls
SMALL_STRUCTURE = 16  # operations: the structures whose eager calls give the fixed part


def goal(what: str, value: float | None, sense: str, target: float, note: str = "") -> None:
    """A goal to print at the end (``value`` None: not measured, ``note`` says why)."""
    GOALS.append((what, value, sense, target, note))


def print_goals() -> None:
    """The goal lines; with GOALS_TO set (a child of `over_processes`), also written there as
    JSON."""
    print("\n== goals (issues 16 and 22)")
    for what, value, sense, target, note in GOALS:
        _print_goal(what, value, sense, target, note)
    if cuctx.backend().sim is not None:
        print("  (on the sim: its host times, not a GPU's; the goals are for a GPU)")
    if os.environ.get(GOALS_TO):
        Path(os.environ[GOALS_TO]).write_text(json.dumps(GOALS))


def _print_goal(
    what: str, value: float | None, sense: str, target: float, note: str, each: str = ""
) -> None:
    if value is None:
        print(f"  {what:<66} not measured ({note})")
        return
    met = value >= target if sense == ">=" else value <= target
    print(
        f"  {what:<66} {value:7.2f}  goal {sense} {target:<4}  {'met' if met else 'NOT met'}{each}"
    )


# -- several processes --------------------------------------------------------------------------

GOALS_TO = "CUCTX_BENCH_GOALS_TO"  # where a child of over_processes writes its goal lines


def over_processes(processes: int, args: list[str]) -> None:
    """``--processes N``: the whole benchmark in N processes one after another (each printed
    whole), then each goal line's median over them beside every process's value. A process
    lands fast or slow as a whole (its allocations, its code's place in the caches): one
    run's line near its goal flips from process to process, the median much less."""
    script = Path(__file__).with_name("autograph.py")
    runs: list[list] = []
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(processes):
            print(f"\n######## process {k + 1} of {processes}", flush=True)
            out = Path(tmp) / f"goals{k}.json"
            subprocess.run(
                [sys.executable, str(script), *args],
                check=True,
                env=dict(os.environ, **{GOALS_TO: str(out)}),
            )
            runs.append(json.loads(out.read_text()))
    print(
        f"\n== goals (issues 16 and 22): the median of {processes} processes (each in "
        "brackets, in order)"
    )
    for lines in zip(*runs):
        what, _, sense, target, note = lines[0]
        values = [v for _, v, *_ in lines if v is not None]
        each = "  (" + ", ".join("-" if v is None else f"{v:.2f}" for _, v, *_ in lines) + ")"
        _print_goal(what, statistics.median(values) if values else None, sense, target, note, each)
    if len({len(r) for r in runs}) > 1:
        print(
            "  (the processes printed different numbers of goal lines: paired in order, "
            "the shortest run's count)"
        )


# -- decisions ----------------------------------------------------------------------------------


def line(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} {counts[k]}" for k in COUNTS)


def agree(mine: dict[str, int], sims: dict[str, int]) -> bool:
    """Every count within WITHIN of the calls of the other's."""
    calls = max(mine["calls"], 1)
    return all(abs(mine[k] - sims[k]) <= WITHIN * calls for k in COUNTS[1:])


def sim_decisions(args: list[str]) -> tuple[dict | None, str]:
    """The sim's decisions for the same loops (a child process on the sim backend), or None
    and why not."""
    script = Path(__file__).with_name("autograph.py")
    env = dict(os.environ, CUCTX_BACKEND="sim", CUCTX_RACECHECK="off")
    try:
        out = subprocess.run(
            [sys.executable, str(script), "--decisions", *args],
            env=env,
            check=True,
            capture_output=True,
            text=True,
            timeout=600,
        ).stdout
        return json.loads(out.splitlines()[-1]), ""
    except (OSError, subprocess.SubprocessError, ValueError, IndexError) as exc:
        return None, f"the sim's run failed: {type(exc).__name__}: {exc}"


def print_decisions(mine: dict[str, dict], args: list[str]) -> None:
    """Each loop's counts here (a cold run), and on a GPU the sim's beside them."""
    here = cuctx.backend().name
    print(f"\n== decisions: each loop once from a cold start ({', '.join(COUNTS)})")
    sims, why = (mine, "") if cuctx.backend().sim is not None else sim_decisions(args)
    for name, counts in mine.items():
        print(f"  {name:<28} {here:<4} {line(counts)}")
        if here != "sim" and sims is not None:
            other = sims[name]
            same = agree(counts, other)
            print(
                f"  {'':<28} sim  {line(other)}   "
                f"{'agree' if same else 'DIFFER'} (within {WITHIN:.0%} of the calls)"
            )
            if not same:  # what each side decided from
                for side, found in ((here, counts), ("sim", other)):
                    for reason in found.get("why", []):
                        print(f"    {side:<4} {reason}")
    if sims is None:
        print(f"  (no sim decisions beside them: {why})")
    if here != "sim" and sims is not None:
        goal(
            "decisions: loops where the sim agrees with the GPU",
            sum(agree(c, sims[n]) for n, c in mine.items()) / len(mine),
            ">=",
            1.0,
        )


# -- the model ----------------------------------------------------------------------------------


def model_beside_measured(graphs: list[cuctx.AutoGraph]) -> None:
    """The sim's host costs (HOST_* in cuctx/_driver/sim/_timing.py, the one place they are
    calibrated) beside what AutoGraph measured here, us."""
    print("\n== the sim's host-cost model (HOST_* in cuctx/_driver/sim/_timing.py), us")
    if cuctx.backend().sim is not None:
        print("  (on the sim the model is what decides: nothing measured to compare)")
        return
    entries = [e for g in graphs for e in g._cache.values()]
    eager = [e.eager_s / e.size for e in entries if e.eager_s is not None and e.size]
    launches = [e.replay_s for e in entries if e.replay_s is not None]
    fit = _autograph_policy.BUILDS.fit()
    measured = {
        f"an eager call, fixed (HOST_EAGER_CALL_NS; <= {SMALL_STRUCTURE} operations)": (
            _timing.HOST_EAGER_CALL_NS,
            _eager_call_fixed(entries),
        ),
        "an operation enqueued eagerly (HOST_EAGER_OP_NS)": (
            _timing.HOST_EAGER_OP_NS,
            min(eager, default=None),
        ),
        "a graph launch, its nodes' share included": (
            _timing.HOST_GRAPH_LAUNCH_NS,
            min(launches, default=None),
        ),
        "a patched kernel node (HOST_PATCH_NODE_NS)": (
            _timing.HOST_PATCH_NODE_NS,
            _least(graphs, "patch_s"),
        ),
        "a node of a whole update (HOST_WHOLE_NODE_NS)": (
            _timing.HOST_WHOLE_NODE_NS,
            _least(graphs, "whole_node_s"),
        ),
        "a build, fixed (HOST_BUILD_FIXED_NS)": (
            _timing.HOST_BUILD_FIXED_NS,
            None if fit is None else fit[0],
        ),
        "a build, per node (HOST_BUILD_NODE_NS)": (
            _timing.HOST_BUILD_NODE_NS,
            None if fit is None else fit[1],
        ),
    }
    typical = {
        "an operation enqueued eagerly (HOST_EAGER_OP_NS)": eager,
        "a graph launch, its nodes' share included": launches,
    }
    for what, (model_ns, seconds) in measured.items():
        seen = "not measured in this run" if seconds is None else f"{seconds * 1e6:.2f} measured"
        if typical.get(what):  # the least is the warm loops'; the decisions see the median
            seen += f" (least; median {statistics.median(typical[what]) * 1e6:.2f})"
        print(f"  {what:<52} {model_ns / 1e3:7.2f} modelled, {seen}")


def _eager_call_fixed(entries: list) -> float | None:
    """The fixed part of an eager call as the sim needs it: over the structures of at most
    SMALL_STRUCTURE operations (whose decisions it sways), the median of their measured eager
    call less their operations at the modelled cost each (HOST_EAGER_OP_NS)."""
    op = _timing.HOST_EAGER_OP_NS * 1e-9
    rest = [
        e.eager_s - op * e.size
        for e in entries
        if e.eager_s is not None and 0 < e.size <= SMALL_STRUCTURE
    ]
    return statistics.median(rest) if rest else None


def _least(graphs: list[cuctx.AutoGraph], name: str) -> float | None:
    values = [getattr(g._policy, name) for g in graphs if getattr(g._policy, name) is not None]
    return min(values, default=None)
