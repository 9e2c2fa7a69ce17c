"""A finding in words: the edge that is missing and the line that would add it, naming the
streams as the user's code does (the variables that hold them at the racing line)."""

from __future__ import annotations

import weakref
from typing import Any

from ._names import Scope, names_of, user_scope
from ._racecheck_shadow import FREE_IN_USE, USE_AFTER_FREE, OpInfo, line


def explain(kind: str, first: OpInfo, second: OpInfo, frame: Any) -> tuple[str, str]:
    """(missing edge, fix) for a race of ``kind`` between ``first`` and ``second``;
    ``frame`` is the checker's caller, below the user's frames it names streams from."""
    scope = user_scope(frame, second.site)
    a, b = _name(first.stream, scope), _name(second.stream, scope)
    fix = f"{b}.wait({a})"
    if a == b and first.stream is not second.stream:  # default streams of two contexts
        ctx = _name(first.stream._ctx, scope)
        a, b = f"{a} of {ctx}", f"{b} of {_name(second.stream._ctx, scope)}"
        fix = f"{ctx}.synchronize()"
    at_a = f" at line {first.site[1]}" if first.site else ""
    before_b = f" before line {second.site[1]}" if second.site else ""
    if kind == USE_AFTER_FREE:
        return (
            f"the memory was freed on {a}{at_a} (its last array went away) before this "
            "use was queued",
            f"keep a reference to the array until the work{before_b.replace('before', 'at')}"
            " has run (synchronize its stream first)",
        )
    if kind == FREE_IN_USE:
        return (
            f"the free on {b} is not ordered after the {first.what} on {a}{at_a}: the "
            f"array's last reference went while {a} may still use it",
            f"call array.record_stream({a}) after line {first.site[1] if first.site else '?'}"
            f", or {b}.wait({a}) (or {a}.synchronize()) before its last reference goes",
        )
    if first.stream is second.stream:  # two nodes of one graph launch
        return (
            "the graph has no path between the two nodes",
            f"add the second node with after=[the first node] (line "
            f"{second.site[1] if second.site else '?'})",
        )
    return (
        f"nothing orders the {second.what} on {b} after the {first.what} on {a}{at_a}: "
        f"{b} did not wait for {a} (or for an event recorded on {a} after it), and the "
        f"host did not synchronize {a} in between",
        fix + before_b,
    )


def node_what(node: Any) -> str:
    site = node.site
    return f"graph launch, node {node.description!r} added at " + (
        f"{site[0]}:{site[1]}" if site else "?"
    )


def label_of(array: Any) -> tuple[Any, Any] | None:
    """(dtype, shape) of an array, which a finding puts in words ("a float32 array of shape
    (1024,)"); None if unknown."""
    dtype, shape = getattr(array, "dtype", None), getattr(array, "shape", None)
    return (dtype, shape) if dtype is not None and shape is not None else None


def _name(stream: Any, scope: Scope) -> str:
    """A stream (or a context) as the user's code names it, else in words."""
    if stream is None:
        return "the host"
    names = names_of(stream, scope)
    if names:
        return names[0]
    kind = getattr(stream, "kind", "")
    if kind == "legacy":
        return "cuctx.legacy_stream()"
    if kind == "per-thread":
        return "cuctx.per_thread_stream()"
    return repr(stream)


class _DroppedStream:
    """A free's stream the program has dropped since, as a finding names it."""

    __slots__ = ("kind", "_described")

    def __init__(self, kind: str, described: str) -> None:
        self.kind, self._described = kind, described

    def __repr__(self) -> str:
        return f"{self._described} (dropped since)"


def kept_free(info: tuple) -> tuple:
    """A free's info as the latest frees keep it: its stream weakly (a record must not keep
    a dropped stream, and with it its context, alive), with the words for it once gone."""
    what, stream, where, thread = info
    return what, (weakref.ref(stream), stream.kind, stream._key, stream._ctx._key), where, thread


def named_free(kept: tuple) -> tuple:
    """`kept_free`'s record as a stamp's info again."""
    what, (ref, kind, key, ctx_key), where, thread = kept
    stream = ref()
    if stream is None:
        stream = _DroppedStream(kind, f"<Stream {kind} {key:#x} ctx {ctx_key:#x}>")
    return what, stream, where, thread


__all__ = ["explain", "kept_free", "label_of", "line", "named_free", "node_what"]
