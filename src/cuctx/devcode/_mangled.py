"""Names as C++ mangles them (the Itanium ABI NVRTC and nvcc use): what a kernel or device
function was declared as, for messages that name it the way its source does."""

from __future__ import annotations

import re

_NAME_LENGTH = re.compile(r"[1-9][0-9]*")  # of a name in a mangled name


def declared_name(mangled: str) -> tuple[str, bool] | None:
    """The name a mangled C++ kernel was declared with, and whether it is a template
    instance: ``_Z8cpp_namePf`` -> ("cpp_name", False), ``_ZN2ns4tmplIfEEvPT_`` ->
    ("ns::tmpl", True). None for other names (extern "C" ones)."""
    if not mangled.startswith("_Z"):
        return None
    nested = mangled.startswith("_ZN")
    parts, i = [], 3 if nested else 2
    while (length := _NAME_LENGTH.match(mangled, i)) is not None:
        i = length.end() + int(length.group())
        parts.append(mangled[length.end() : i])
        if not nested:
            break
    return ("::".join(parts), mangled[i : i + 1] == "I") if parts else None
