"""When graphs pay: the host costs `@autograph` decides from, and its decisions.

The costs, in seconds: an operation enqueued eagerly, a graph launch and each node of it, a
patched node, each node of a whole update and of a build. Where they come from:

- on the sim, the model: an H100's host costs (`cuctx._driver.sim._timing`, HOST_*), applied
  to the counts of a structure. The sim's own Python time never decides, so a program's
  calls are graphed as on that GPU, the same from run to run;
- on a GPU, measurements (running means), the model standing in for each until it is
  measured.

The decisions (docs/graphs.md, "When graphs pay"): build once a structure repeats and the
eager time a graph would save, over as many calls again as it was seen, exceeds the build;
patch k changed nodes while k patches cost less than a whole update; after `SWITCH_AFTER`
graph calls in a row costing more than eager ones run the structure eagerly, and go back to
its graph after as many eager calls for which a graph call is predicted `MARGIN` cheaper.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from ._autograph_build import patchable

BUILD_AFTER = 2  # calls with one structure before a graph may be built for it
SWITCH_AFTER = 3  # calls in a row beyond the margin before graph <-> eager switches
MARGIN = 0.25  # back to graphs only when predicted at least this much cheaper than eager
SMOOTH = 0.25  # weight of the newest measurement in the running means


def mean(old: float | None, new: float) -> float:
    return new if old is None else old + SMOOTH * (new - old)


class Model(NamedTuple):
    """An H100's host costs, in seconds (see `cuctx._driver.sim._timing`)."""

    eager_op: float
    launch: float
    replay_node: float
    patch_node: float
    whole_node: float
    build_node: float


def model() -> Model:
    from .._driver.sim import _timing as t  # (the constants live beside the sim's timing)
    return Model(t.HOST_EAGER_OP_NS * 1e-9, t.HOST_GRAPH_LAUNCH_NS * 1e-9,
                 t.HOST_REPLAY_NODE_NS * 1e-9, t.HOST_PATCH_NODE_NS * 1e-9,
                 t.HOST_WHOLE_NODE_NS * 1e-9, t.HOST_BUILD_NODE_NS * 1e-9)


class Policy:
    """The costs of one `AutoGraph` (``measured``: on a GPU) and the decisions from them.
    A structure's own (`_Entry`): ``eager_s``, ``replay_s``, ``construct_s``, measured or
    None; ``size`` operations, ``count`` of them nodes."""

    __slots__ = ("measured", "model", "patch_s", "whole_node_s", "build_node_s",
                 "replay_node_s")

    def __init__(self) -> None:
        self.measured: bool | None = None  # (known at the first call that records work)
        self.model = model()
        # Measured across structures: seconds per patched node, per node of a whole update,
        # of a build, of a replay (None until measured: the model's then).
        self.patch_s: float | None = None
        self.whole_node_s: float | None = None
        self.build_node_s: float | None = None
        self.replay_node_s: float | None = None

    # -- estimates ------------------------------------------------------------------------

    def eager(self, entry: Any) -> float:
        """Seconds an eager call of the structure costs."""
        if entry.eager_s is not None:
            return entry.eager_s
        return self.model.eager_op * entry.size

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
        node = self.model.build_node if self.build_node_s is None else self.build_node_s
        return node * entry.count

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

    def why_not_build(self, entry: Any) -> str | None:
        """Why this call of a structure builds no graph (None: build one now)."""
        if entry.blocked:
            return f"no graph for this structure: {entry.blocked}"
        if entry.seen < BUILD_AFTER:
            return f"structure seen {entry.seen} time(s); a graph is built once it repeats"
        return self.too_costly(entry)

    def too_costly(self, entry: Any) -> str | None:
        """Why building a graph for the structure would not pay yet (None: it would)."""
        build = self.build(entry)
        saving = self.eager(entry) - self.replay(entry)
        if saving * entry.seen < build:  # seen as often again: expected graph calls
            return (f"a graph would not pay yet: building costs about {us(build)} and saves "
                    f"{us(saving)} per call, over ~{entry.seen} expected calls")
        return None

    # -- what was measured (a GPU only: the model is the sim's truth) -----------------------

    def eager_took(self, entry: Any, seconds: float) -> None:
        if self.measured:
            entry.eager_s = mean(entry.eager_s, seconds)

    def built(self, entry: Any, construct: float, total: float) -> None:
        if self.measured:
            entry.construct_s = construct
            self.build_node_s = mean(self.build_node_s, total / max(entry.count, 1))

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
