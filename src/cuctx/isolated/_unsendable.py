"""Why a call cannot go to a worker: which argument (or what the function uses), what it is,
and what to do instead. Only run once pickling the call failed, so it may pickle again.

An object whose own pickling refuses with a TypeError that names it (cuctx's classes say
what to do instead) is let speak for itself; for any other cuctx object the message says
the one thing true of them all: it belongs to this process's CUDA context.
"""

from __future__ import annotations

import types
from typing import Any, Callable, Iterator

from . import _wire

_WAY = (
    "which lives in this process's CUDA context and cannot go to another process. Make "
    "such objects in the worker instead (load the Library, make Streams and Events "
    "inside the call, or in a module the call imports); for data, pass an array of a "
    "MemoryPool(device, ipc=True) (the same memory) or its to_host() (a copy)"
)


def unsendable(
    fn: Callable, name: str, args: tuple, kwargs: dict, reductions: dict, error: Exception
) -> TypeError:
    """The TypeError `submit` raises for a call whose pickling raised ``error``."""
    if _fails(fn, reductions) is not None:  # then what it takes along by value does
        found = _first_failure(_captured(fn, name), reductions) or _first_failure(
            iter([(f"the function {name}", fn)]), reductions
        )
    else:
        found = _first_failure(_argument_parts(args, kwargs, name), reductions)
    if found is None:  # only the whole fails (a pickler's limit, say): say what it said
        return TypeError(
            f"cannot send {name} and its arguments to a worker process: {_text(error)}"
        )
    where, culprit, own = found
    if isinstance(own, TypeError) and type(culprit).__name__ in str(own):
        why = str(own)  # the object's own refusal names it and the way
    elif type(culprit).__module__.split(".")[0] == "cuctx":
        why = f"{culprit!r} is a cuctx.{type(culprit).__name__}, {_WAY}"
    else:
        why = f"{type(culprit).__qualname__} {culprit!r:.80}: {_text(own)}"
    return TypeError(f"cannot send {where} to a worker process: {why}")


def _text(error: Exception) -> str:
    return f"{type(error).__name__}: {error}"


def _captured(fn: Callable, name: str) -> Iterator[tuple[str, Any]]:
    """(where, value) for what ``fn`` takes along when it goes by value: the values of its
    closure, of the globals its code names, of its defaults."""
    function = getattr(fn, "__func__", fn)  # a bound method's function
    if isinstance(function, types.FunctionType):
        code = function.__code__
        for var, cell in zip(code.co_freevars, function.__closure__ or ()):
            try:
                yield f"{name} (it uses {var})", cell.cell_contents
            except ValueError:  # an empty cell
                pass
        for var in _names(code):
            if var in function.__globals__:
                yield f"{name} (it uses the global {var})", function.__globals__[var]
        for i, default in enumerate(function.__defaults__ or ()):
            yield f"{name} (its default argument {i})", default


def _names(code: types.CodeType) -> Iterator[str]:
    yield from code.co_names
    for const in code.co_consts:  # nested functions, lambdas, comprehensions
        if isinstance(const, types.CodeType):
            yield from _names(const)


def _argument_parts(args: tuple, kwargs: dict, name: str) -> Iterator[tuple[str, Any]]:
    for i, arg in enumerate(args):
        yield f"argument {i} of {name}", arg
    for key, value in kwargs.items():
        yield f"the keyword argument {key}= of {name}", value


def _first_failure(
    parts: Iterator[tuple[str, Any]], reductions: dict
) -> tuple[str, Any, Exception] | None:
    """(where, the innermost object that fails, its error) for the first part that fails."""
    for where, value in parts:
        error = _fails(value, reductions)
        if error is not None:
            return where, *_innermost(value, error, reductions)
    return None


def _innermost(
    value: Any, error: Exception, reductions: dict, depth: int = 3
) -> tuple[Any, Exception]:
    """The element of a list, tuple, set or dict ``value`` that fails (some levels down)."""
    if depth and isinstance(value, (list, tuple, set, frozenset, dict)):
        items = value.values() if isinstance(value, dict) else value
        for item in items:
            inner = _fails(item, reductions)
            if inner is not None:
                return _innermost(item, inner, reductions, depth - 1)
    return value, error


def _fails(value: Any, reductions: dict) -> Exception | None:
    try:
        _wire.dumps(value, reductions)
    except Exception as exc:  # noqa: BLE001 - any failure to pickle is what is looked for
        return exc
    return None
