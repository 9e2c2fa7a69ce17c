"""Sim twins checked against their kernels when the library is loaded, on every backend:
a twin that cannot take the kernel's arguments, or whose annotations contradict the
parameter types, is an error naming the twin, its signature and where it is defined,
rather than a failed launch later (on the sim) or never (on a GPU, which runs the real
code)."""

from __future__ import annotations

import inspect
from typing import Any, Callable

from ._ptx import ParamType


def where(fn: Callable) -> str:
    """``file:line`` of a function's definition (of its class's ``__call__`` for other
    callables); its repr when Python does not know."""
    call = type(fn).__dict__.get("__call__") if not hasattr(fn, "__code__") else None
    code = getattr(fn, "__code__", None) or getattr(call, "__code__", None)
    return f"{code.co_filename}:{code.co_firstlineno}" if code else repr(fn)


def _title(key: str, fn: Callable, signature: inspect.Signature | None) -> str:
    name = getattr(fn, "__qualname__", type(fn).__name__)
    shown = f"{name}{signature}" if signature is not None else name
    return f"sim_kernels[{key!r}]: the twin {shown} ({where(fn)})"


def _annotation(parameter: inspect.Parameter) -> Any:
    note = parameter.annotation
    return getattr(note, "__name__", note)  # a class, or its name under PEP 563


def _contradicts(note: Any, ptype: ParamType) -> bool:
    if note == "float":
        return ptype.kind == "int"
    if note == "int":
        return ptype.kind == "float"
    if note == "complex":
        return ptype.size not in (8, 16) or ptype.kind != "struct"
    return False


def check_twin(
    key: str, fn: Any, kernel: str, count: int, types: tuple[ParamType, ...] | None
) -> None:
    """Raise TypeError unless ``fn(grid, block, *args)`` takes the ``count`` arguments of
    ``kernel`` and annotates none of them against its parameter ``types``."""
    if not callable(fn):
        raise TypeError(
            f"sim_kernels[{key!r}] must be a function fn(grid, block, *args), "
            f"not {type(fn).__name__}"
        )
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # some builtins have none: nothing to check
        return
    try:
        signature.bind(None, None, *[None] * count)
    except TypeError:
        raise TypeError(
            f"{_title(key, fn, signature)} cannot be called as twin(grid, block, *args) with "
            f"the {count} argument(s) of kernel {kernel!r}: a twin takes grid, block and one "
            f"argument per kernel parameter ({count})"
        ) from None
    if types is None:
        return
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    parameters = [p for p in signature.parameters.values() if p.kind in positional][2:]
    for index, (parameter, ptype) in enumerate(zip(parameters, types)):
        if parameter.annotation is inspect.Parameter.empty:
            continue
        note = _annotation(parameter)
        if _contradicts(note, ptype):
            raise TypeError(
                f"{_title(key, fn, signature)} annotates {parameter.name!r} as {note}, but "
                f"parameter {index} of kernel {kernel!r} is {ptype.describe()}; drop the "
                "annotation (the type is known) or correct it"
            )
