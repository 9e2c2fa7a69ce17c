"""When graphs pay: the host costs `@autograph` decides from, and its decisions.

The costs, in seconds: an operation enqueued eagerly, a graph launch and each node of it, a
patched node, each node of a whole update, a build (a fixed part and each node). Where they
come from:

- on the sim, the model: an H100's host costs (`cuctx._driver.sim._timing`, HOST_*), applied
  to the counts of a structure. The sim's own Python time never decides, so a program's
  calls are graphed as on that GPU, the same from run to run;
- on a GPU, measurements: a structure's own (running means of its eager calls and launches),
  the function's (patches, whole updates), the process's (builds: what building cost so
  far, any function, fitted as a fixed part plus a part per node, `BUILDS`), the model
  standing in for each until it is measured.

How long a structure lasts is learnt from the function's own history: the lengths of its
latest *runs* (calls in a row with one structure, `RUNS_KEPT` of them). A structure is
expected to serve as many more calls as the typical run of this function still has to go
(the median run less the calls this run has had), and at least as many as it has served so
far (what is all there is to go on without history, and what a structure that keeps coming
back has shown).

The decisions (docs/graphs.md, "When graphs pay"): build once a structure repeats
(`BUILD_AFTER` calls) and the eager time a graph would save over the calls it is expected
to serve exceeds the build; patch k changed nodes while k patches cost less than a whole
update; after `SWITCH_AFTER` graph calls in a row costing more than eager ones run the
structure eagerly, and go back to its graph after as many eager calls for which a graph
call is predicted `MARGIN` cheaper. The compiled per-call path (cuctx/csrc/autograph_call.c)
makes the decisions of a graph call by these rules too.
"""

from __future__ import annotations

import threading
from collections import deque
from statistics import median
from typing import Any, NamedTuple

from ._autograph_build import patchable

BUILD_AFTER = 2  # calls with one structure before a graph may be built for it
SWITCH_AFTER = 3  # calls in a row beyond the margin before graph <-> eager switches
MARGIN = 0.25  # back to graphs only when predicted at least this much cheaper than eager
SMOOTH = 0.25  # weight of the newest measurement in the running means
RUNS_KEPT = 8  # the latest runs of structures a function's policy learns from
OUTLIER = 2.0  # a build counts as at most this many times what builds of its size cost so far


def mean(old: float | None, new: float) -> float:
    return new if old is None else old + SMOOTH * (new - old)


class Why:
    """The words of a decision, formatted when read: ``template.format(*args)``, each float
    of ``args`` a number of seconds shown in microseconds. Every eager call of an autograph
    function keeps its reason, which only `AutoGraph.stats` reads: formatting it at once cost
    an eager call microseconds."""

    __slots__ = ("template", "args")

    def __init__(self, template: str, *args: Any) -> None:
        self.template, self.args = template, args

    def __str__(self) -> str:
        return self.template.format(*(us(a) if a.__class__ is float else a for a in self.args))

    def __repr__(self) -> str:
        return f"Why({str(self)!r})"


class Model(NamedTuple):
    """An H100's host costs, in seconds (see `cuctx._driver.sim._timing`). The compiled
    path reads its fields by position (M_* in cuctx/csrc/autograph_serve.c)."""

    eager_call: float
    eager_op: float
    launch: float
    replay_node: float
    patch_node: float
    whole_node: float
    build_fixed: float
    build_node: float


def model() -> Model:
    from .._driver.sim import _timing as t  # (the constants live beside the sim's timing)

    return Model(
        t.HOST_EAGER_CALL_NS * 1e-9,
        t.HOST_EAGER_OP_NS * 1e-9,
        t.HOST_GRAPH_LAUNCH_NS * 1e-9,
        t.HOST_REPLAY_NODE_NS * 1e-9,
        t.HOST_PATCH_NODE_NS * 1e-9,
        t.HOST_WHOLE_NODE_NS * 1e-9,
        t.HOST_BUILD_FIXED_NS * 1e-9,
        t.HOST_BUILD_NODE_NS * 1e-9,
    )


class BuildCosts:
    """What builds cost in this process (every function's, on a GPU): seconds against nodes,
    fitted as a fixed part plus a part per node by least squares of the relative error over
    the builds, the older ones weighing less (each new build scales the earlier ones' weight
    by 1 - SMOOTH). Relative, because the decisions that matter are about small graphs:
    fitted by their absolute error, a process's large builds (a 1000-node graph takes
    milliseconds, and varies by more than a small build costs) set the fixed part, and a
    structure of five kernels could look as costly as one of fifty.

    The first build in each context is not counted: it pays what comes once there (the
    driver's graph machinery set up, the kernels' code loaded), several milliseconds on an
    H200 where a build costs tens of microseconds. Counted, it made every later structure of
    the process look too costly to build, and no build came to correct it.

    A build that took more than `OUTLIER` times what the builds so far make of its size
    counts as that much: a one-off stall (measured on an H100: a process's first build of
    five kernels took 604 us among builds of 130) moved the fixed part from 40 to 436 us,
    and each small structure of the process then ran eagerly for 16 calls before its build
    paid. A lasting rise is learnt all the same, the estimate doubling at each build."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sums = [0.0] * 5  # weights, and the weighted n, t, n*n, n*t
        self._contexts: set[int] = set()  # those that have had their first build

    def add(self, nodes: int, seconds: float, context: int = 0) -> None:
        with self._lock:
            if context not in self._contexts:
                self._contexts.add(context)
                return
            known = self.estimate(nodes)
            if known and seconds > OUTLIER * known:
                seconds = OUTLIER * known
            keep = 1 - SMOOTH
            w = 1.0 / max(seconds, 1e-9) ** 2  # (least squares of the relative error)
            self._sums = [
                s * keep + w * x
                for s, x in zip(self._sums, (1.0, nodes, seconds, nodes * nodes, nodes * seconds))
            ]

    def fit(self) -> tuple[float, float] | None:
        """(fixed seconds, seconds per node), or None before the first build."""
        w, n, t, nn, nt = self._sums
        if not w:
            return None
        spread = w * nn - n * n
        if spread <= 1e-9 * w * nn:  # builds of one size: all of it per node
            return 0.0, t / max(n, 1e-12)
        per_node = max((w * nt - n * t) / spread, 0.0)
        fixed = (t - per_node * n) / w
        if fixed < 0:  # the fit's line through the origin instead
            return 0.0, nt / nn
        return fixed, per_node

    def estimate(self, nodes: int) -> float | None:
        fitted = self.fit()
        return None if fitted is None else fitted[0] + fitted[1] * nodes

    def clear(self) -> None:
        with self._lock:
            self._sums = [0.0] * 5
            self._contexts.clear()


BUILDS = BuildCosts()


class Policy:
    """The costs of one `AutoGraph` (``measured``: on a GPU), its runs of structures, and the
    decisions from them. A structure's own (`Entry`): ``eager_s``, ``replay_s``,
    ``construct_s``, measured or None; ``changes``, how many of its values changed from call
    to call (a running mean, None before its second call); ``seen`` calls; ``size``
    operations, ``count`` of them nodes."""

    __slots__ = (
        "measured",
        "model",
        "patch_s",
        "whole_node_s",
        "replay_node_s",
        "runs",
        "run",
        "run_entry",
    )

    def __init__(self) -> None:
        self.measured: bool | None = None  # (known at the first call that records work)
        self.model = model()
        # Measured across structures: seconds per patched node, per node of a whole update,
        # of a replay (None until measured: the model's then).
        self.patch_s: float | None = None
        self.whole_node_s: float | None = None
        self.replay_node_s: float | None = None
        self.runs: deque[int] = deque(maxlen=RUNS_KEPT)  # lengths of the latest runs, ended
        self.run = 0  # calls in the current run
        self.run_entry: Any = None  # its structure

    # -- runs ------------------------------------------------------------------------------

    def called(self, entry: Any) -> None:
        """A call with ``entry``'s structure (counted in the runs)."""
        if entry is not self.run_entry:
            if self.run_entry is not None:
                self.runs.append(self.run)
            self.run_entry, self.run = entry, 0
        self.run += 1

    def expected_calls(self, entry: Any) -> tuple[int, Why]:
        """How many calls, this one included, a graph built now is expected to serve, and
        why (see the module's docstring)."""
        seen = entry.seen
        if not self.runs:
            return seen, Why("~{} expected calls (as many as so far)", seen)
        typical = int(median(self.runs))
        rest = typical - self.run + 1
        if rest <= seen:
            return seen, Why(
                "~{} expected calls (as many as so far; this function's "
                "structures lasted ~{} calls)",
                seen,
                typical,
            )
        return rest, Why(
            "~{} expected calls (this function's structures lasted ~{} calls)", rest, typical
        )

    # -- estimates ------------------------------------------------------------------------

    def eager(self, entry: Any) -> float:
        """Seconds an eager call of the structure costs."""
        if entry.eager_s is not None:
            return entry.eager_s
        return self.model.eager_call + self.model.eager_op * entry.size

    def replay(self, entry: Any) -> float:
        """Seconds a launch of the structure's executable costs (its patches aside)."""
        if entry.replay_s is not None:
            return entry.replay_s
        if self.replay_node_s is not None:
            return self.replay_node_s * entry.count
        return self.model.launch + self.model.replay_node * entry.count

    def patch(self) -> float:
        return self.model.patch_node if self.patch_s is None else self.patch_s

    def whole(self, entry: Any) -> float:
        """Seconds a whole update of the structure's executable costs."""
        if self.whole_node_s is not None:
            return self.whole_node_s * entry.count
        if entry.construct_s is not None:  # before any was measured: building the graph again
            return entry.construct_s
        return self.model.whole_node * entry.count

    def build(self, entry: Any) -> float:
        """Seconds building the structure's graph is expected to cost."""
        measured = BUILDS.estimate(entry.count) if self.measured else None
        if measured is not None:
            return measured
        return self.model.build_fixed + self.model.build_node * entry.count

    def update(self, entry: Any, changed: list[int]) -> tuple[bool, float]:
        """(patch node by node?, the seconds it costs) for these changed operations."""
        whole = self.whole(entry)
        if not (entry.simple or patchable(entry.nodes, changed)):
            return False, whole
        patches = len(changed) * self.patch()
        return patches <= whole, min(patches, whole)

    def predict(self, entry: Any, changed: list[int]) -> float:
        """The seconds a graph call would take for these changes."""
        return self.replay(entry) + (self.update(entry, changed)[1] if changed else 0.0)

    # -- decisions ------------------------------------------------------------------------

    def why_not_build(self, entry: Any) -> Why | None:
        """Why this call of a structure builds no graph (None: build one now)."""
        if entry.blocked:
            return Why("no graph for this structure: {}", entry.blocked)
        if entry.seen < BUILD_AFTER:
            return Why("structure seen {} time(s); a graph is built once it repeats", entry.seen)
        return self.too_costly(entry)

    def too_costly(self, entry: Any) -> Why | None:
        """Why building a graph for the structure would not pay yet (None: it would)."""
        build = self.build(entry)
        # A graph call of it: the launch, and the patches of the values that change.
        call = self.replay(entry) + min((entry.changes or 0.0) * self.patch(), self.whole(entry))
        saving = self.eager(entry) - call
        calls, why = self.expected_calls(entry)
        if saving * calls < build:
            return Why(
                "a graph would not pay yet: building costs about {} and saves {} per call, over {}",
                build,
                saving,
                why,
            )
        return None

    # -- what was measured (a GPU only: the model is the sim's truth) -----------------------

    def eager_took(self, entry: Any, seconds: float) -> None:
        # A structure's first call is not counted: it pays what comes once (a kernel's code
        # loaded at its first launch, cold caches), and the decision to build at its second
        # call then rests on the model on a GPU as on the sim.
        if self.measured and entry.seen > 1:
            entry.eager_s = mean(entry.eager_s, seconds)

    def built(self, entry: Any, construct: float, total: float, context: int) -> None:
        if self.measured:
            entry.construct_s = construct
            BUILDS.add(entry.count, total, context)

    def launched(self, entry: Any, seconds: float) -> None:
        if self.measured:
            entry.replay_s = mean(entry.replay_s, seconds)
            self.replay_node_s = mean(self.replay_node_s, seconds / max(entry.count, 1))

    def patched(self, seconds: float, nodes: int) -> None:
        if self.measured and nodes:
            self.patch_s = mean(self.patch_s, seconds / nodes)

    def updated_whole(self, entry: Any, seconds: float) -> None:
        if self.measured:
            self.whole_node_s = mean(self.whole_node_s, seconds / max(entry.count, 1))


def us(seconds: float | None) -> str:
    return "?" if seconds is None else f"{seconds * 1e6:.1f} us"
