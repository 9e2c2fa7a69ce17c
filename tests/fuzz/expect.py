"""Expectations: how a call may end, built from the conditions the model knows of.

A condition is ``fail(types)`` (the call must raise one of ``types``) or ``maybe(types)``
(it may raise one of them); `combine` merges them into what `model.attempt` takes: None
(must succeed), a tuple of types (must fail), or a `Maybe` (may fail with those types).
"""

from __future__ import annotations

import cuctx

from .model import FAULTS, CtxRec, Maybe


class Cond(tuple):
    """(must_fail, types)."""


def fail(*types) -> Cond:
    return Cond((True, types))


def maybe(*types) -> Cond:
    return Cond((False, types))


def combine(*conds: Cond | None):
    must, types = False, []
    for cond in conds:
        if cond is None:
            continue
        must = must or cond[0]
        types.extend(t for t in cond[1] if t not in types)
    if must:
        return tuple(types)
    return Maybe(types) if types else None


def usable(*recs: CtxRec | None) -> Cond | None:
    """The condition a call that works in these contexts has from their states."""
    conds = []
    for rec in recs:
        if rec is None:
            continue
        if rec.state == "destroyed":
            conds.append(fail(cuctx.ContextDestroyedError))
        elif rec.state == "faulted":
            conds.append(maybe(*FAULTS))
    if not conds:
        return None
    return Cond((any(c[0] for c in conds), tuple({t for c in conds for t in c[1]})))
