"""The one generator of launch fast paths: a `Plan` (data) becomes the Python source of one
function, compiled and kept under a short readable name in `linecache`, so tracebacks show
its lines and `inspect.getsource` finds it.

A fast path is made for one launcher and one plan (the argument types of its first launch).
It does only what that case needs: the context, library, host-function and capture guards,
the thread's parameter buffer, a type guard (and a dtype guard for arrays), the conversions
the plan names, one ``struct.pack_into`` and the bound driver call (or, while an
`@autograph` call records on the thread, handing the packed bytes to its recorder:
`cuctx._record`), then, while a trace sink listens, the announcement
(`_trace.emit_launch`). Anything else returns ``general(args)``, the launcher's checked
path, which raises the right error or packs what the fast path's codes cannot (so a fast
path changes cost, never behaviour).

``CUCTX_FASTPATH=0`` in the environment turns fast paths off (everything takes the checked
path); `ENABLED` holds the setting, read when a launcher would generate its fast path, so
tests can monkeypatch it.
"""

from __future__ import annotations

import linecache
import os
import threading
from typing import Any, Callable

from .. import _lifetimes, _record, _trace
from ._args import ARRAY, PACK_ERRORS, VALUE
from .._driver import in_host_function
from ._plan import Plan
from ..context import ACTIVE

ENABLED: bool = os.environ.get("CUCTX_FASTPATH", "1") != "0"

_sources: dict[str, str] = {}  # linecache names given out -> their source
_lock = threading.Lock()


def fast_launch(
    plan: Plan,
    *,
    ctx: Any,
    owner: Any,
    local: threading.local,
    general: Callable,
    fail: Callable,
    stream: Any,
) -> tuple[Callable, str]:
    """``launch(args)`` for ``plan`` and its source. ``local.state`` is the calling thread's
    ``(buffer, go)``: its parameter buffer and the bound driver call reading it; a thread
    without one, and every case the plan was not made for, goes to ``general(args)``."""
    source = launch_source(plan)
    types = ", ".join(t.__name__ for t in plan.types)
    name = _register(f"{_trace.GENERATED}fast launch {plan.kernel} ({types})>", source)
    scope = {
        "__name__": __name__,
        "ACTIVE": ACTIVE,
        "trace": _trace,
        "hostfn": in_host_function,
        "capturing": _lifetimes.capturing,
        "pack_errors": PACK_ERRORS,
        "pack_into": plan.layout.pack_into,
        "ctx": ctx,
        "device": ctx._device,
        "owner": owner,
        "local": local,
        "general": general,
        "fail": fail,
        "stream": stream,
        "recording": _record.threads,
        "get_ident": threading.get_ident,
        "launcher": general.__self__,
        "plan": plan,
        **{f"T{i}": t for i, t in enumerate(plan.types)},
        **{f"G{i}": p.convert for i, p in enumerate(plan.params) if p.convert},
        **{
            f"D{i}": p.dtypes[0] if len(p.dtypes) == 1 else p.dtypes
            for i, p in enumerate(plan.params)
            if p.dtypes
        },
    }
    exec(compile(source, name, "exec"), scope)  # noqa: S102 - our own source, from a plan
    return scope["launch"], source


def launch_source(plan: Plan) -> str:
    """The source of a fast path for ``plan`` (its names are bound by `fast_launch`)."""
    n = len(plan.params)
    lines = [
        "def launch(args):",
        "    # Unusable context, unloaded code, inside a host function, a graph being captured:",
        "    if ctx._state is not ACTIVE or not owner._loaded or hostfn or capturing:",
        "        return general(args)",
        "    try:",
        "        buffer, go = local.state  # this thread's parameter buffer and driver call",
        "    except AttributeError:",
        "        return general(args)",
        f"    if len(args) != {n}:",
        "        return general(args)",
    ]
    if n:
        lines.append(f"    {', '.join(f'a{i}' for i in range(n))}, = args")
        guard = " or ".join(f"type(a{i}) is not T{i}" for i in range(n))
        lines += [f"    if {guard}:", "        return general(args)"]
    values = []
    for i, p in enumerate(plan.params):
        if p.kind == ARRAY:  # a DeviceArray: the checks of _args._device_array_pointer
            # (and of _args._typed where the parameter says its dtypes)
            test = "is not" if p.dtypes and len(p.dtypes) == 1 else "not in"
            dtype = f" or a{i}.dtype {test} D{i}" if p.dtypes else ""
            lines += [
                f"    c = a{i}._ctx",
                f"    if c._state is not ACTIVE or c._device is not device or not a{i}._c{dtype}:",
                "        return general(args)",
            ]
            values.append(f"a{i}.ptr")
        else:
            values.append(f"a{i}" if p.kind == VALUE else f"G{i}(a{i}, stream)")
    lines += [
        "    try:",
        f"        pack_into(buffer, 0{''.join(', ' + v for v in values)})",
        "    except pack_errors:  # a value its code cannot hold: unsigned, or an error",
        "        return general(args)",
        "    if recording:  # some thread records an autograph call: is it this one?",
        "        r = recording.get(get_ident())",
        "        if r is not None and r.launch(launcher, buffer, args, plan):",
        "            return",
        "    err, = go()",
        "    if err:",
        "        fail(err)",
        "    if trace.sinks:  # announced as the checked path does, the accesses lazily",
        "        trace.emit_launch(launcher, args, plan)",
    ]
    return "\n".join(lines) + "\n"


def _register(name: str, source: str) -> str:
    """Put ``source`` in `linecache` under ``name`` (numbered when that name holds other
    source), where tracebacks and `inspect` look for it. Kept for the process: there is one
    entry per distinct source, which only a new kernel or type signature makes."""
    with _lock:
        unique, n = name, 1
        while _sources.get(unique, source) != source:
            n += 1
            unique = f"{name[:-1]} #{n}>"
        _sources[unique] = source
        # mtime None: linecache.checkcache keeps the entry (there is no file to compare).
        linecache.cache[unique] = (len(source), None, source.splitlines(True), unique)
    return unique
