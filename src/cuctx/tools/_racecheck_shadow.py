"""The race checker's memory: shadow state per allocation by byte range, and findings.

A `Region` is one allocation (from an ``alloc`` operation, or memory first seen in an access:
arrays of other libraries, allocations made before the check began). Its `segments` split
its bytes into ranges with the same history: the last writer and the last reader per actor
(a stream, for FastTrack's reason: an operation ordered after an actor's latest read is
ordered after its earlier ones too). Each record is a `Stamp`: the actor, its epoch and the
operation, so checking an access is one look at each segment it overlaps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

RAW, WAR, WAW = "read-after-write", "write-after-read", "write-after-write"
USE_AFTER_FREE, FREE_IN_USE = "use after free", "free while in use"


class OpInfo(NamedTuple):
    """One operation as a finding names it."""
    what: str  # "fill", "copy", "launch of 'sum'", "graph launch: kernel 'k' (node at ...)"
    stream: Any
    site: tuple[str, int, str] | None
    thread: int


class Stamp(NamedTuple):
    actor: int
    epoch: int
    op: OpInfo


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
        return (f"<Finding {self.kind} race on {self.array}: {self.first.what} on "
                f"{self.first.stream!r} at {line(self.first.site)}, then {self.second.what} "
                f"on {self.second.stream!r} at {line(self.second.site)}>")

    def __str__(self) -> str:
        return (f"{self.kind} race on {self.array}:\n"
                f"  first:  {self.first.what} on {self.first.stream!r} at {line(self.first.site)}\n"
                f"  second: {self.second.what} on {self.second.stream!r} at "
                f"{line(self.second.site)}\n"
                f"  missing: {self.missing}\n"
                f"  fix: {self.fix}")


class Segment:
    __slots__ = ("lo", "hi", "writer", "readers")

    def __init__(self, lo: int, hi: int, writer: Stamp | None, readers: dict[int, Stamp]):
        self.lo, self.hi, self.writer, self.readers = lo, hi, writer, readers


class Region:
    """One allocation's bytes ``[ptr, end)`` and their history."""
    __slots__ = ("ptr", "end", "site", "segments", "label")

    def __init__(self, ptr: int, end: int, site: tuple[str, int, str] | None) -> None:
        self.ptr, self.end, self.site = ptr, end, site
        self.segments: list[Segment] = []
        self.label = ""  # the first array seen in it ("a float32 array (4, 1024)")

    def describe(self) -> str:
        what = self.label or f"{self.end - self.ptr} bytes at {self.ptr:#x}"
        if self.site is None:
            return f"{what} (allocated outside the check, or by another library)"
        return f"{what} allocated at {line(self.site)}"

    def access(self, lo: int, hi: int, mode: str, stamp: Stamp,
               clock: dict[int, int]) -> list[tuple[str, Stamp]]:
        """Check ``[lo, hi)`` accessed in ``mode`` by ``stamp`` (its actor's clock ``clock``)
        against the history and record it; returns (kind, earlier stamp) per race."""
        races: list[tuple[str, Stamp]] = []
        reads, writes = "r" in mode, "w" in mode
        segments = self.segments
        if len(segments) == 1:
            whole = segments[0]
            if whole.lo == lo and whole.hi == hi:  # the whole array, touched alike so far
                w = whole.writer
                if (w is not None and w.actor != stamp.actor) or (writes and whole.readers):
                    self._check(whole, reads, writes, stamp, clock, races)
                self._touch(whole, stamp, writes)
                return races
        out: list[Segment] = []
        pos = lo
        for seg in self.segments:
            if seg.hi <= lo or seg.lo >= hi:
                out.append(seg)
                continue
            if seg.lo < lo:
                out.append(Segment(seg.lo, lo, seg.writer, seg.readers))
            if pos < seg.lo:  # bytes of the range no one touched yet
                out.append(self._touch(Segment(pos, seg.lo, None, {}), stamp, writes))
            part = Segment(max(seg.lo, lo), min(seg.hi, hi), seg.writer, seg.readers)
            self._check(part, reads, writes, stamp, clock, races)
            out.append(self._touch(part, stamp, writes))
            pos = part.hi
            if seg.hi > hi:
                out.append(Segment(hi, seg.hi, seg.writer, seg.readers))
        if pos < hi:
            out.append(self._touch(Segment(pos, hi, None, {}), stamp, writes))
        out.sort(key=lambda s: s.lo)
        self.segments = _merged(out)
        return races

    @staticmethod
    def _check(seg: Segment, reads: bool, writes: bool, stamp: Stamp, clock: dict[int, int],
               races: list[tuple[str, Stamp]]) -> None:
        w = seg.writer
        if w is not None and w.actor != stamp.actor and clock.get(w.actor, 0) <= w.epoch:
            races.append((RAW if reads else WAW, w))
        if writes:
            for r in seg.readers.values():
                if r.actor != stamp.actor and clock.get(r.actor, 0) <= r.epoch:
                    races.append((WAR, r))

    @staticmethod
    def _touch(seg: Segment, stamp: Stamp, writes: bool) -> Segment:
        if writes:
            seg.writer, seg.readers = stamp, {}
        elif seg.readers.get(stamp.actor) is not stamp:  # (split parts share a dict)
            seg.readers = {**seg.readers, stamp.actor: stamp}
        return seg


def _merged(segments: list[Segment]) -> list[Segment]:
    """Neighbours with the same history become one (slices touched alike stay few)."""
    out: list[Segment] = []
    for seg in segments:
        last = out[-1] if out else None
        if last is not None and last.hi == seg.lo and last.writer is seg.writer \
                and last.readers == seg.readers:
            last.hi = seg.hi
        else:
            out.append(seg)
    return out
