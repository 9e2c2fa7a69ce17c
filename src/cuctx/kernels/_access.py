"""How a kernel uses its pointer parameters, for the trace (and so the race checker): read
("r"), written ("w") or both ("rw").

In order: an annotation (`Kernel.set_access`, or ``access=`` of one `cuctx.launch`), then
``const`` in the parameter list of the source cuctx compiled (``const float* x`` is read;
``float* const x`` is a constant pointer to writable memory: read-write), else read-write.
``const`` does not survive into PTX, so the source text is parsed, keyed by the kernel's name
(its C name, or the name a template's or C++ function's lowered name carries).
"""

from __future__ import annotations

import re
from typing import Any, Mapping

MODES = ("r", "w", "rw")

_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
_GLOBAL = re.compile(r"__global__\b")
_NAME = re.compile(r"([A-Za-z_]\w*)\s*(?:<[^()]*>)?\s*\($")
_IDENT = re.compile(r"[A-Za-z_]\w*")
_MANGLED = re.compile(r"_Z(\d+)")


def _balanced(text: str, i: int) -> int:
    """The index just past the ')' closing the '(' at ``i``."""
    depth = 0
    for j in range(i, len(text)):
        depth += {"(": 1, ")": -1}.get(text[j], 0)
        if depth == 0:
            return j + 1
    return len(text)


def _split(params: str) -> list[str]:
    """Split a parameter list at its top-level commas (templates and parentheses nest)."""
    parts, depth, start = [], 0, 0
    for i, c in enumerate(params):
        if c in "<([":
            depth += 1
        elif c in ">)]":
            depth -= 1
        elif c == "," and depth == 0:
            parts.append(params[start:i])
            start = i + 1
    parts.append(params[start:])
    return [p.strip() for p in parts if p.strip() and p.strip() != "void"]


def _param(text: str) -> tuple[str, str | None]:
    """(name, "r" for a pointer to const, None otherwise) of one parameter declaration."""
    text = text.split("=")[0].split("[")[0].strip()
    names = _IDENT.findall(text)
    name = names[-1] if names else ""
    star = text.rfind("*")
    if star < 0:
        return name, None
    return name, "r" if re.search(r"\bconst\b", text[:star]) else None


def parse(source: str) -> dict[str, list[list[tuple[str, str | None]]]]:
    """Every ``__global__`` function of ``source``: name -> one parameter list per
    definition (overloads, templates), each parameter (name, "r" or None)."""
    text = _COMMENT.sub(" ", source)
    found: dict[str, list[list[tuple[str, str | None]]]] = {}
    for match in _GLOBAL.finditer(text):
        paren = text.find("(", match.end())
        if paren < 0:
            continue
        name = _NAME.search(text[match.end():paren + 1])
        if name is None:
            continue
        end = _balanced(text, paren)
        found.setdefault(name[1], []).append([_param(p) for p in
                                              _split(text[paren + 1:end - 1])])
    return found


def base_name(kernel_name: str, user_name: str) -> str:
    """The name the source declares: ``axpy`` for "axpy<float>" or ``_Z4axpyPKfPf``."""
    name = user_name if user_name != kernel_name else kernel_name
    mangled = _MANGLED.match(name)
    if mangled:
        return name[mangled.end():mangled.end() + int(mangled[1])]
    return name.split("<")[0].split("::")[-1].strip()


def declared(kernel: Any) -> list[tuple[str, str | None]] | None:
    """The kernel's parameters as its source declares them (None: no source, or the
    definitions with its parameter count disagree)."""
    owner = kernel._owner
    source = getattr(owner, "_source", None)
    if source is None:
        return None
    parsed = getattr(owner, "_access_parsed", None)
    if parsed is None:
        parsed = owner._access_parsed = parse(source)
    count = len(kernel.param_layout)
    lists = [p for p in parsed.get(
        base_name(kernel.name, owner._user_name(kernel.name)), ()) if len(p) == count]
    if not lists:
        return None
    merged = []
    for params in zip(*lists):  # overloads agree on a parameter, or it is read-write
        modes = {m for _, m in params}
        merged.append((params[0][0], modes.pop() if len(modes) == 1 else None))
    return merged


def resolve(kernel: Any, given: Mapping[str | int, str]) -> dict[int, str]:
    """``given`` (parameter name or index -> mode) checked and keyed by index."""
    names = [name for name, _ in declared(kernel) or ()]
    count = len(kernel.param_layout)
    out = {}
    for key, mode in given.items():
        if mode not in MODES:
            raise ValueError(f"access mode {mode!r} for parameter {key!r} of "
                             f"{kernel.name!r}: use 'r', 'w' or 'rw'")
        if isinstance(key, str):
            if key not in names:
                raise ValueError(
                    f"kernel {kernel.name!r} has no parameter called {key!r}"
                    + (f" (its parameters: {', '.join(names)})" if names else
                       " that cuctx knows of (no source was compiled): name it by index"))
            key = names.index(key)
        if not isinstance(key, int) or not 0 <= key < count:
            raise ValueError(f"kernel {kernel.name!r} has parameters 0 to {count - 1}, "
                             f"not {key!r}")
        out[key] = mode
    return out


def modes(kernel: Any, override: Mapping[int, str] | None = None) -> tuple[str, ...]:
    """One mode per parameter: ``override`` (a launch's), the kernel's annotation, const in
    its source, else read-write."""
    base = kernel._access_modes
    if base is None:
        source = declared(kernel) or ()
        modes_ = ["rw" if m is None else m for _, m in source] or ["rw"] * len(
            kernel.param_layout)
        for index, mode in (kernel._access or {}).items():
            modes_[index] = mode
        base = kernel._access_modes = tuple(modes_)
    if override:
        base = tuple(override.get(i, m) for i, m in enumerate(base))
    return base
