"""Graph launches as the race checker sees them. A launch's event wait nodes order it after
the records of their events and its event record nodes take its clock after the nodes (a
graph orders no more than that with the streams around it); its nodes' accesses are checked
as one operation's, each named by its node. Nodes of one launch that touch the same bytes,
one writing, with no path between them in the graph race each other: checked once per
executable and set of ranges.

A base of `Watch` (_racecheck.py), whose history these read and write: apart from it because
a graph's own structure (its events, its paths) is a question no other operation asks.
"""

from __future__ import annotations

import weakref
from typing import Any

from .. import _trace
from ._racecheck_clocks import join
from ._racecheck_shadow import Finding, OpInfo
from ._racecheck_words import node_what


class GraphChecks:
    """`Watch`'s handler of ``graph_launch`` operations and the check inside one graph."""

    def _graph_launch(self, op: _trace.Operation) -> list[Finding]:
        """The nodes' accesses; the graph's event wait nodes count as waits before them, its
        record nodes as records after them (ordering no more than the graph does)."""
        events = [
            (node.kind, node.keep[0])
            for node in op.fields["graph"].nodes
            if node.kind in ("record", "wait") and node.keep
        ]
        clock = self._enter(op.stream, op.thread).clock
        for kind, event in events:
            if kind == "wait":
                join(clock, self._snapshot(event))
        found = self._accesses(op) + self._inside_graph(op)
        for kind, event in events:
            if kind == "record":
                self._events[event._key] = (dict(clock), weakref.ref(event))
        return found

    def _inside_graph(self, op: _trace.Operation) -> list[Finding]:
        """Nodes of one launch that touch the same bytes, one writing, with no path between
        them in the graph: checked once per executable and set of ranges."""
        nodes = op.fields["nodes"]
        key = tuple((a.ptr, a.nbytes, a.mode) for _, acc in nodes for a in acc)
        exe = op.fields["exec"]
        if self._graph_checked.get(exe) == key:
            return []
        self._graph_checked[exe] = key
        graph = op.fields["graph"]
        conflicts = [
            (a, b)
            for i, (a, acc_a) in enumerate(nodes)
            for b, acc_b in nodes[i + 1 :]
            if _conflict(acc_a, acc_b)
        ]
        if not conflicts:
            return []
        after: dict[Any, set] = {}
        for src, dst in graph.edges:
            after.setdefault(src, set()).add(dst)
        found: list[Finding] = []
        for a, b in conflicts:
            if not (_reaches(after, a, b) or _reaches(after, b, a)):
                first = OpInfo(node_what(a), op.stream, a.site, op.thread)
                second = OpInfo(node_what(b), op.stream, b.site, op.thread)
                found += self._report("unordered nodes of one graph", None, first, second)
        return found


def _conflict(a: tuple, b: tuple) -> bool:
    return any(
        x.ptr < y.ptr + y.nbytes and y.ptr < x.ptr + x.nbytes and ("w" in x.mode or "w" in y.mode)
        for x in a
        for y in b
        if not x.host
    )


def _reaches(after: dict, a: Any, b: Any) -> bool:
    todo, seen = [a], set()
    while todo:
        n = todo.pop()
        for m in after.get(n, ()):
            if m is b:
                return True
            if m not in seen:
                seen.add(m)
                todo.append(m)
    return False
