"""When the race checker runs, and who hears of what it finds.

One `Watch` (the history of every stream and byte range, and the trace sink) serves every
checker at once. A `RaceCheck` is a scope on it: a mode, its findings, the pairs of lines it
reported. The scopes stack: at the bottom the whole run's (``CUCTX_RACECHECK=raise|warn``,
or "warn" by default while the active backend is the sim), above it the ``with
cuctx.racecheck()`` blocks in the order they opened. The innermost one says what a finding
does (raise, warn, collect); every open scope lists it, once, so a race is reported once
(not again by the whole run's checker after the block), and a block sees the races with
work queued before it.

The watch is on the trace (the fast paths step aside) only while some scope is open and the
innermost is not "off". When it goes off it forgets what it saw, and a switch of backend
starts it over: it never reports a race with work it did not see.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

from .. import _driver, _trace
from ..errors import RaceError, RaceWarning
from ._racecheck import Watch
from ._racecheck_shadow import Finding

MODES = ("raise", "warn", "collect", "off")
_WATCH = Watch()
# The whole run's scope (None: the whole run is not checked), and CUCTX_RACECHECK as read at
# import: "raise", "warn", "off", or None when unset (then the active backend decides).
_whole_run: RaceCheck | None = None
_env: str | None = None


class RaceCheck:
    """``with cuctx.racecheck(mode) as rc:`` checks every operation in the block (on every
    thread) for races between streams. ``mode``: "raise" (`RaceError` from the operation
    that completes a race), "warn" (a `RaceWarning`), "collect" (only ``rc.findings``),
    "off" (nothing is checked in the block). The innermost block's mode wins, over the
    checker of the whole run too. ``rc.findings`` lists every finding, each reported once
    per pair of lines."""

    def __init__(self, mode: str = "raise") -> None:
        if mode not in MODES:
            raise ValueError(f"racecheck mode {mode!r}: use 'raise', 'warn', 'collect' or 'off'")
        self.mode = mode
        self.findings: list[Finding] = []
        self._seen: set = set()  # (kind, first site/what, second site/what): reported once
        # What frees (run from finalizers, which cannot raise to anyone) would have raised:
        # raised by the thread's next operation, or at the end of the block.
        self._pending: dict[int, list[Exception]] = {}

    def __repr__(self) -> str:
        watching = "watching" if self in _WATCH.scopes and _WATCH.on else "not watching"
        n = len(self.findings)
        return f"<RaceCheck mode={self.mode!r}, {watching}, {n} finding{'s' * (n != 1)}>"

    def __enter__(self) -> RaceCheck:
        with _WATCH.lock:
            _WATCH.scopes.append(self)
            _update()
        return self

    def __exit__(self, *exc: Any) -> None:
        with _WATCH.lock:
            if self in _WATCH.scopes:
                _WATCH.scopes.remove(self)
            _update()
        if exc[0] is None:
            self._raise_pending(None)

    def _tell(self, found: list[Finding], op: _trace.Operation) -> None:
        """Do what the mode says with the findings of ``op`` (called outside the lock)."""
        if self._pending and op.kind != "free":
            self._raise_pending(op.thread)
        if not found or self.mode not in ("raise", "warn"):
            return
        try:
            if self.mode == "raise":
                raise RaceError(found)
            for finding in found:
                _warn(finding)
        except (RaceError, RaceWarning) as exc:  # a RaceWarning: a filter made it an error
            if op.kind != "free":
                raise
            self._pending.setdefault(op.thread, []).append(exc)

    def _raise_pending(self, thread: int | None) -> None:
        """Raise what the frees of ``thread`` (None: of every thread) could not."""
        if thread is None:
            pending = [exc for excs in self._pending.values() for exc in excs]
            self._pending.clear()
        else:
            pending = self._pending.pop(thread, [])
        if not pending:
            return
        if isinstance(pending[0], RaceError):
            raise RaceError([f for exc in pending for f in exc.findings])
        raise RaceWarning("\n\n".join(map(str, pending)))


def _warn(finding: Finding) -> None:
    """A `RaceWarning` pointing at the line that completed the race (Python prints it)."""
    site = finding.second.site
    if site is None:
        warnings.warn(str(finding), RaceWarning, stacklevel=2)
    else:
        warnings.warn_explicit(str(finding), RaceWarning, site[0], site[1])


def _update() -> None:
    """The watch on the trace while a scope wants it (the innermost open one is not "off");
    taken off, it forgets its history, as it will not see what runs meanwhile."""
    scopes = _WATCH.scopes
    want = bool(scopes) and scopes[-1].mode != "off"
    if want and not _WATCH.on:
        _trace.add_sink(_WATCH.see)
    elif _WATCH.on and not want:
        _trace.remove_sink(_WATCH.see)
        _WATCH.reset(_WATCH.backend)
    _WATCH.on = want


def _check_whole_run(mode: str | None) -> None:
    """The whole run's scope: a fresh one in ``mode``, or none."""
    global _whole_run
    if _whole_run is not None:
        _WATCH.scopes.remove(_whole_run)
    _whole_run = RaceCheck(mode) if mode else None
    if _whole_run is not None:
        _WATCH.scopes.insert(0, _whole_run)
    _update()


def _follow(backend: _driver.Backend) -> None:
    """A backend became active (the first use chose it, or `cuctx.set_backend`): the checker
    starts over, and unless CUCTX_RACECHECK said otherwise, checks the whole run on the sim
    ("warn") and not on the cuda backend."""
    with _WATCH.lock:
        if backend is _WATCH.backend:
            return
        _WATCH.reset(backend)
        if _env is None:
            _check_whole_run("warn" if backend.sim is not None else None)


def racecheck(mode: str = "raise") -> RaceCheck:
    """``with cuctx.racecheck(mode="raise") as rc:``: check the stream ordering of every
    operation in the block; see docs/checks.md."""
    return RaceCheck(mode)


def from_env() -> None:
    """Read ``CUCTX_RACECHECK`` (when cuctx is imported): "raise" or "warn" check the whole
    run on any backend, "off" (or "0") nowhere; unset, the sim's runs are checked ("warn").
    Another value is a ValueError at the first use of a device (when the backend is chosen,
    as for a wrong CUCTX_BACKEND), not at the import: `python -m cuctx info` says it in one
    line."""
    global _env
    value = os.environ.get("CUCTX_RACECHECK", "")
    mode = value.strip().lower()
    mode = "off" if mode == "0" else mode
    if mode not in ("", "raise", "warn", "off"):

        def refuse(backend: _driver.Backend) -> None:
            raise ValueError(
                f"CUCTX_RACECHECK={value!r}: use 'raise', 'warn' or 'off', or "
                "leave it unset (then the sim's runs are checked in 'warn' mode, "
                "a GPU's are not)"
            )

        _driver.on_select(refuse)
        return
    _env = mode or None
    with _WATCH.lock:
        _check_whole_run(mode if mode in ("raise", "warn") else None)
    _driver.on_select(_follow)
