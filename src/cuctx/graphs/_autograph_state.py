"""What an `@autograph` function keeps between calls: one `Entry` per structure, the `Tally`
of its calls, and the words its explanations use. The compiled per-call path
(cuctx/csrc/autograph_call.c) reads and writes these slots too."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cuda.bindings.driver import CUmemorytype

from .. import _trace
from ..kernels._launcher import Launcher
from ._autograph_build import unbuildable
from ._autograph_record import COPY, WAIT, Recording

if TYPE_CHECKING:
    from ._autograph_policy import Why

GRAPH, EAGER = "graph", "eager"


class Entry:
    """One structure: its executable (once built), the values it holds (or, before it is
    built, those of its latest call), its measured costs (None until measured; see
    `_autograph_policy.Policy`)."""

    __slots__ = (
        "key",
        "keys",
        "size",
        "count",
        "seen",
        "changes",
        "exe",
        "nodes",
        "simple",
        "patcher",
        "compiled",
        "values",
        "bytes",
        "mode",
        "strikes",
        "eager_s",
        "replay_s",
        "construct_s",
        "blocked",
        "outside",
        "__weakref__",
    )

    def __init__(self, key: tuple, recording: Recording) -> None:
        self.key = key
        self.keys = recording.keys  # the same as a list: compared without making a tuple
        self.size = len(key)
        # Operations that become nodes (all but waits; a record of an event is a node).
        self.count = sum(1 for k in key if not (k.__class__ is tuple and k[0] is WAIT))
        self.seen = 0
        self.changes: float | None = None  # values changed from call to call (a running mean)
        self.exe: Any = None
        self.nodes: list = []
        self.simple = False  # every node can be patched by itself (kernels, copies, fills)
        self.patcher: Any = None  # the compiled patches and launch, where the backend has them
        # Its graph calls can run on the compiled path: kernels only, on one stream, with no
        # wait for outside work, and a patcher.
        self.compiled = False
        self.values: list = recording.values
        self.bytes = 0
        self.mode = GRAPH
        self.strikes = 0
        self.eager_s: float | None = None  # running means, seconds per call
        self.replay_s: float | None = None
        self.construct_s: float | None = None
        self.blocked = unbuildable(recording)
        # Waits for outside work, by index: made before each launch of the executable.
        self.outside = [
            i for i, k in enumerate(key) if k.__class__ is tuple and k[0] is WAIT and len(k) == 2
        ]


class Tally:
    """Counts of the calls (``calls`` = ``replays`` + ``updates`` + ``builds`` + ``eager``),
    seconds spent in each kind, the estimated time saved and the nodes patched."""

    __slots__ = (
        "calls",
        "replays",
        "updates",
        "builds",
        "eager",
        "recording_s",
        "replay_s",
        "update_s",
        "build_s",
        "eager_s",
        "saved_s",
        "patched_nodes",
    )

    COUNTS = ("calls", "replays", "updates", "builds", "eager")
    TIMES = ("recording_s", "replay_s", "update_s", "build_s", "eager_s")

    def __init__(self) -> None:
        for name in self.COUNTS:
            setattr(self, name, 0)
        for name in self.TIMES:
            setattr(self, name, 0.0)
        self.saved_s = 0.0
        self.patched_nodes = 0  # a whole update counts every node

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}


UNIFIED = CUmemorytype.CU_MEMORYTYPE_UNIFIED


def difference(last: Entry | None, keys: list) -> str:
    """Where a new structure departs from the latest one, in words."""
    if last is None:
        return f"{len(keys)} operations"
    for i, (a, b) in enumerate(zip(last.key, keys)):
        if a != b:
            return f"operation {i + 1} is {describe(b)}, was {describe(a)}"
    return f"{len(keys)} operations, was {last.size}"


def describe(key: Any) -> str:
    if key.__class__ is Launcher:
        c = key.config
        return f"a launch of {key.kernel.name!r} grid {c.grid} block {c.block}"
    if key[0] is COPY and UNIFIED in key[5:]:  # (`Recording.enqueue`: its memory types)
        return f"a copy of a host pool's array on stream {key[1]}"
    return f"a {key[0]} on stream {key[1]}"


def site_of(exc: BaseException) -> tuple | None:
    """The user's line a traceback went through last (outside cuctx)."""
    site, tb = None, exc.__traceback__
    while tb is not None:
        filename = tb.tb_frame.f_code.co_filename
        if not filename.startswith(_trace._PACKAGE) and not filename.startswith(_trace.GENERATED):
            site = (filename, tb.tb_lineno, tb.tb_frame.f_code.co_name)
        tb = tb.tb_next
    return site


def said(call: int, action: str, reason: str | Why, where: tuple | None) -> dict:
    """A reason `AutoGraph._note` kept, as stats() lists it (``where``: a site, or a
    `_trace.user_where`)."""
    site = where if where is None or where[0].__class__ is str else _trace.site_of(where)
    return {
        "call": call,
        "action": action,
        "reason": str(reason),
        "site": f"{site[0]}:{site[1]}" if site else None,
    }
