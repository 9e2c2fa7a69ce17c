"""What the user's code calls an object: the names that hold it in the user's frame at the
line that submitted an operation. Trace sinks run inside that line, on the submitting
thread, so the frame is there to read: the race checker names the streams of its fixes
with these names, the timeline labels its lanes with them.

The timeline looks names up inside the user's call (once per stream and line), so the
search is kept short: the frame's locals first, its globals only when the locals name
nothing (a module's globals can hold hundreds of names; merging them into one dict for
every lookup cost tens of microseconds a call, enough to starve a GPU of work)."""

from __future__ import annotations

from typing import Any, NamedTuple

# Containers longer than this are not searched: ``data[81234]`` names nothing a reader knows,
# and the search runs inside the user's call.
_SEARCHED = 64


class Scope(NamedTuple):
    """The variables of one of the user's frames: its locals, then its globals."""

    locals: dict[str, Any]
    globals: dict[str, Any]


_NOWHERE = Scope({}, {})


def user_scope(frame: Any, site: tuple[str, int, str] | None) -> Scope:
    """The variables of the user's frame at ``site`` (still running: the sink is called from
    inside that line); ``frame`` is one below it (the sink's caller)."""
    while frame is not None and site is not None:
        if frame.f_lineno == site[1] and frame.f_code.co_filename == site[0]:
            return Scope(frame.f_locals, frame.f_globals)
        frame = frame.f_back
    return _NOWHERE


def names_of(obj: Any, scope: Scope) -> list[str]:
    """Every name the user's frame has for ``obj``, best first: the variables holding it,
    then items of the short lists, tuples and str-keyed dicts the variables hold
    (``streams[1]``, ``by_kind['copy']``), then attributes of ``self``
    (``self.copy_stream``); the locals' names, else the globals'. Names starting with "_"
    are skipped. Only identity is tested: no user ``__eq__`` runs."""
    return _names_in(obj, scope.locals, search_self=True) or (
        _names_in(obj, scope.globals, search_self=False)
        if scope.globals is not scope.locals
        else []
    )  # (a module's frame: one dict)


def _names_in(obj: Any, variables: dict[str, Any], search_self: bool) -> list[str]:
    direct: list[str] = []
    inside: list[str] = []
    for name, value in variables.items():
        if value is obj:
            if not name.startswith("_"):
                direct.append(name)
        elif isinstance(value, (list, tuple)):
            if len(value) <= _SEARCHED and not name.startswith("_"):
                inside += [f"{name}[{i}]" for i, item in enumerate(value) if item is obj]
        elif isinstance(value, dict) and len(value) <= _SEARCHED and not name.startswith("_"):
            inside += [
                f"{name}[{key!r}]"
                for key, item in value.items()
                if item is obj and isinstance(key, str)
            ]
    names = direct + inside
    attributes = getattr(variables.get("self"), "__dict__", None) if search_self else None
    if isinstance(attributes, dict):
        names += [
            f"self.{name}"
            for name, value in attributes.items()
            if value is obj and not name.startswith("_")
        ]
    return names
