"""The race checker's memory: shadow state per allocation by byte range, and findings.

A `Region` is one allocation (from an ``alloc`` operation, or memory first seen in an access:
arrays of other libraries, allocations made before the check began). Its `segments` split
its bytes into ranges with the same history: the last writer and the last reader per actor
(a stream, for FastTrack's reason: an operation ordered after an actor's latest read is
ordered after its earlier ones too). Each record is a stamp, a plain tuple ``(actor, epoch,
info)`` made once per operation and shared by all its accesses, whose ``info`` is ``(what,
stream, site, thread)`` (an `OpInfo` once a finding names it), so checking an access is one
look at each segment it overlaps and allocates nothing unless it splits one.

Stamps the host has passed (it synchronized after them) can race nothing that comes later:
`Region.retire` drops them and merges the segments they kept apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from .._trace import site_of
from ._racecheck_clocks import ordered

RAW, WAR, WAW = "read-after-write", "write-after-read", "write-after-write"
USE_AFTER_FREE, FREE_IN_USE = "use after free", "free while in use"

Stamp = tuple  # (actor, epoch, info); info: (what, stream, site, thread), as OpInfo's fields


class OpInfo(NamedTuple):
    """One operation as a finding names it."""

    what: str  # "fill", "copy", "launch of 'sum'", "graph launch: kernel 'k' (node at ...)"
    stream: Any
    site: tuple[str, int, str] | None
    thread: int


def line(site: tuple[str, int, str] | None) -> str:
    return f"{site[0]}:{site[1]}" if site else "(inside cuctx, no line of yours)"


@dataclass
class Finding:
    """One race: ``kind`` (read-after-write, write-after-read, write-after-write, use after
    free, free while in use), ``array`` (the memory, with the line that allocated it),
    ``first`` and ``second`` (the operations: what, stream, site), ``missing`` (the edge
    that would order them, in words) and ``fix``."""

    kind: str
    array: str
    first: OpInfo
    second: OpInfo
    missing: str
    fix: str

    def __repr__(self) -> str:
        return (
            f"<Finding {self.kind} race on {self.array}: {self.first.what} on "
            f"{self.first.stream!r} at {line(self.first.site)}, then {self.second.what} "
            f"on {self.second.stream!r} at {line(self.second.site)}>"
        )

    def __str__(self) -> str:
        return (
            f"{self.kind} race on {self.array}:\n"
            f"  first:  {self.first.what} on {self.first.stream!r} at {line(self.first.site)}\n"
            f"  second: {self.second.what} on {self.second.stream!r} at "
            f"{line(self.second.site)}\n"
            f"  missing: {self.missing}\n"
            f"  fix: {self.fix}"
        )


class Segment:
    """Bytes ``[lo, hi)`` of a region with one history. Each segment owns its ``readers``
    dict (a split copies it), so a read updates it in place."""

    __slots__ = ("lo", "hi", "writer", "readers")

    def __init__(self, lo: int, hi: int, writer: Stamp | None, readers: dict[int, Stamp]):
        self.lo, self.hi, self.writer, self.readers = lo, hi, writer, readers

    def part(self, lo: int, hi: int) -> Segment:
        return Segment(lo, hi, self.writer, dict(self.readers))


class Region:
    """One allocation's bytes ``[ptr, end)`` and their history. ``where`` is the line that
    allocated it (`cuctx._trace.user_where`; None: first seen in an access), ``label``
    (dtype, shape) of the first array seen in it, both put in words only for a finding;
    ``exact`` (dtype, shape) of a C-contiguous array that is all of it (so an array of
    that dtype and shape at its start is all of it)."""

    __slots__ = ("ptr", "end", "where", "segments", "label", "exact")

    def __init__(self, ptr: int, end: int, where: tuple | None) -> None:
        self.ptr, self.end, self.where = ptr, end, where
        self.segments = [Segment(ptr, end, None, {})]
        self.label: tuple[Any, Any] | None = None
        self.exact: tuple[Any, Any] | None = None

    def describe(self) -> str:
        if self.label is not None:
            dtype, shape = self.label
            what = f"a {dtype} array of shape {tuple(shape)}"
        else:
            what = f"{self.end - self.ptr} bytes at {self.ptr:#x}"
        if self.where is None:
            return f"{what} (allocated outside the check, or by another library)"
        return f"{what} allocated at {line(site_of(self.where))}"

    def access(
        self, lo: int, hi: int, mode: str, stamp: Stamp, clock: dict[int, int], host: dict[int, int]
    ) -> list[tuple[str, Stamp]] | None:
        """Check ``[lo, hi)`` accessed in ``mode`` by ``stamp`` (its actor's clock ``clock``
        beyond the host's ``host``: `_racecheck_clocks`) against the history and record it;
        returns (kind, earlier stamp) per race, or None."""
        segments = self.segments
        if len(segments) == 1:
            whole = segments[0]
            if whole.lo == lo and whole.hi == hi:  # the whole array, touched alike so far
                return touch(whole, mode != "w", mode != "r", stamp, clock, host, None)
        reads, writes = mode != "w", mode != "r"
        races: list[tuple[str, Stamp]] | None = None
        out: list[Segment] = []
        for seg in segments:  # (they cover the region: it starts as one)
            if seg.hi <= lo or seg.lo >= hi:
                out.append(seg)
                continue
            # The bytes outside the range keep the old history (copies); the segment itself
            # becomes the part inside it.
            if seg.lo < lo:
                out.append(seg.part(seg.lo, lo))
                seg.lo = lo
            if seg.hi > hi:
                out.append(seg.part(hi, seg.hi))
                seg.hi = hi
            races = touch(seg, reads, writes, stamp, clock, host, races)
            out.append(seg)
        out.sort(key=_start)
        self.segments = _merged(out)
        return races

    def retire(self, host: dict[int, int]) -> bool:
        """Drop the stamps ``host`` (the host's clock) is past; True when none are left."""
        idle = True
        for seg in self.segments:
            w = seg.writer
            if w is not None and host.get(w[0], 0) > w[1]:
                seg.writer = w = None
            readers = seg.readers
            if readers:
                for actor in [a for a, r in readers.items() if host.get(a, 0) > r[1]]:
                    del readers[actor]
            idle = idle and w is None and not readers
        if len(self.segments) > 1:
            self.segments = _merged(self.segments)
        return idle


def touch(
    seg: Segment,
    reads: bool,
    writes: bool,
    stamp: Stamp,
    clock: dict[int, int],
    host: dict[int, int],
    races: list[tuple[str, Stamp]] | None,
) -> list[tuple[str, Stamp]] | None:
    """Check ``seg`` against ``stamp``'s access, then record the access in it."""
    actor = stamp[0]
    w = seg.writer
    if w is not None and w[0] != actor and not ordered(w[0], w[1], clock, host):
        races = (races or []) + [(RAW if reads else WAW, w)]
    readers = seg.readers
    if writes:
        if readers:
            for r in readers.values():
                if r[0] != actor and not ordered(r[0], r[1], clock, host):
                    races = (races or []) + [(WAR, r)]
            seg.readers = {}
        seg.writer = stamp
    else:
        readers[actor] = stamp
    return races


def _start(seg: Segment) -> int:
    return seg.lo


def _merged(segments: list[Segment]) -> list[Segment]:
    """Neighbours with the same history become one (slices touched alike stay few)."""
    out: list[Segment] = []
    for seg in segments:
        last = out[-1] if out else None
        if (
            last is not None
            and last.hi == seg.lo
            and last.writer is seg.writer
            and last.readers == seg.readers
        ):
            last.hi = seg.hi
        else:
            out.append(seg)
    return out
