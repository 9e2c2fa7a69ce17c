"""What the user's code calls an object: the names that hold it in the user's frame at the
line that submitted an operation. Trace sinks run inside that line, on the submitting
thread, so the frame is there to read: the race checker names the streams of its fixes
with these names, the timeline labels its lanes with them."""

from __future__ import annotations

from typing import Any

# Containers longer than this are not searched: ``data[81234]`` names nothing a reader knows,
# and the search runs inside the user's call.
_SEARCHED = 64


def user_scope(frame: Any, site: tuple[str, int, str] | None) -> dict[str, Any]:
    """The variables of the user's frame at ``site`` (still running: the sink is called from
    inside that line), locals over globals; ``frame`` is one below it (the sink's caller)."""
    while frame is not None and site is not None:
        if frame.f_code.co_filename == site[0] and frame.f_lineno == site[1]:
            return {**frame.f_globals, **frame.f_locals}
        frame = frame.f_back
    return {}


def names_of(obj: Any, scope: dict[str, Any]) -> list[str]:
    """Every name ``scope`` has for ``obj``, best first: the variables holding it, then items
    of the short lists, tuples and str-keyed dicts the variables hold (``streams[1]``,
    ``by_kind['copy']``), then attributes of ``self`` (``self.copy_stream``). Names starting
    with "_" are skipped. Only identity is tested: no user ``__eq__`` runs."""
    names = [name for name, value in scope.items() if value is obj and not name.startswith("_")]
    for name, value in scope.items():
        if name.startswith("_") or value is obj:
            continue
        if isinstance(value, (list, tuple)) and len(value) <= _SEARCHED:
            names += [f"{name}[{i}]" for i, item in enumerate(value) if item is obj]
        elif isinstance(value, dict) and len(value) <= _SEARCHED:
            names += [f"{name}[{key!r}]" for key, item in value.items()
                      if item is obj and isinstance(key, str)]
    attributes = getattr(scope.get("self"), "__dict__", None)
    if isinstance(attributes, dict):
        names += [f"self.{name}" for name, value in attributes.items()
                  if value is obj and not name.startswith("_")]
    return names
