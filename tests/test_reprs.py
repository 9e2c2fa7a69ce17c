"""Every object cuctx hands out prints as what it is: its kind, its state, its device or
context and its handle in hex, never Python's ``<... object at 0x...>``; and printing never
raises, also once its context is destroyed or poisoned, or the object itself is closed. On both
backends (the text is cuctx's own); poisoning a context on purpose needs the sim."""

from __future__ import annotations

import re

import numpy as np
import pytest

import cuctx
import cuctx.sim
import cuctx.tools
from conftest import requires_nvrtc
from cuctx import GraphCaptureError, StickyFaultError
from scenarios import ADD_SOURCE, add, library_fixture

pytestmark = [requires_nvrtc, pytest.mark.usefixtures("nvrtc_cache")]

lib = library_fixture(ADD_SOURCE, add=add)
DEFAULT = re.compile(r"object at 0x")


def surface(lib: cuctx.Library) -> dict[str, object]:
    """One of each object a user gets from cuctx, made in the current context."""
    ctx = cuctx.current_context()
    s, t = cuctx.Stream(), cuctx.Stream()
    x = cuctx.zeros(8, np.float32, stream=s)
    graph = cuctx.Graph()
    node = graph.fill(x, 1.0)
    module = cuctx.Module.from_source(ADD_SOURCE, sim_kernels={"add": add})

    @cuctx.autograph
    def step(a):
        a.fill(2.0, stream=s)

    step(x)
    with cuctx.racecheck("collect") as rc:
        x.fill(3.0, stream=s)
        x.fill(4.0, stream=t)  # nothing orders it after the fill on s: a finding
    cuctx.current_context().synchronize()  # that work done, the timeline holds only its own
    with cuctx.timeline() as tl:
        x.fill(5.0, stream=s)
    return {
        "Device": ctx.device,
        "DeviceProperties": ctx.device.properties,
        "MemInfo": ctx.device.mem_info(),
        "ComputeCapability": ctx.device.compute_capability,
        "Context": ctx,
        "ContextFlags": cuctx.ContextFlags(0),
        "Stream": s,
        "Event": s.record(),
        "DeviceArray": x,
        "Library": lib,
        "Kernel": lib["add"],
        "KernelAttributes": lib["add"].attributes(),
        "Launcher": lib["add"][1, 8, 0, s],
        "BlockSizeSuggestion": lib["add"].suggest_block_size(),
        "Module": module,
        "Graph": graph,
        "GraphNode": node,
        "GraphExec": graph.instantiate(),
        "Capture": s.capture(),
        "AutoGraph": step,
        "RaceCheck": rc,
        "Finding": rc.findings[0],
        "Timeline": tl,
        "Record": tl.records[0],
        "Summary": tl.summary(),
        "Operation": tl.records[0].operation,
        "Access": tl.records[0].operation.accesses[0],
        "Backend": cuctx.backend(),
        "MemoryPool": cuctx.MemoryPool(ctx.device, max_size=1),
        "IsolatedExecutor": executor(),
        "CompileResult": cuctx.compile_source(
            ADD_SOURCE, arch="sm_%d%d" % tuple(ctx.device.compute_capability)
        ),
    }


def executor() -> cuctx.IsolatedExecutor:
    """An executor of one worker, shut down (its repr says so) before it is printed."""
    ex = cuctx.IsolatedExecutor(devices=[0])
    assert "shut down" not in repr(ex)
    ex.shutdown()
    return ex


def public_classes() -> set[type]:
    return {
        obj
        for module in (cuctx, cuctx.tools)
        for obj in map(module.__dict__.get, module.__all__)
        if isinstance(obj, type) and not issubclass(obj, BaseException)
    }


def test_every_public_class_is_in_the_surface_and_prints_its_own_way(lib):
    """A class added to cuctx.__all__ comes here too: made in `surface` and printed."""
    made = surface(lib)
    missing = {c.__name__ for c in public_classes()} - {type(o).__name__ for o in made.values()}
    assert not missing, f"add one of each to surface(): {sorted(missing)}"
    for name, obj in made.items():
        assert type(obj).__repr__ is not object.__repr__, name
        assert not DEFAULT.search(repr(obj)), (name, repr(obj))


def test_reprs_name_kind_state_context_and_hex_handles(lib):
    made = surface(lib)
    ctx, s, tl = made["Context"], made["Stream"], made["Timeline"]
    props = ctx.device.properties
    on = f"ctx {ctx.handle:#x}"
    expect = {
        "Context": ["primary", "device 0", f"{ctx.handle:#x}", "active"],
        "Stream": ["created", f"{s.handle:#x}", "device 0", on],
        "Event": ["recorded", f"{made['Event'].handle:#x}", on],
        "DeviceArray": ["float32", "(8,)", "device 0", f"{made['DeviceArray'].ptr:#x}"],
        "DeviceProperties": [
            f"device 0 ({cuctx.backend().name})",
            f"compute capability {props.compute_capability_major}.{props.compute_capability_minor}",
            f"{props.multiprocessor_count} SMs",
        ],
        "Library": [f"{made['Library'].handle:#x}"],
        "Kernel": [f"'add' {made['Kernel'].handle:#x} of <Library {made['Library'].handle:#x}"],
        "Module": [handle(made["Module"]), f"{ctx.handle:#x} active"],
        "Launcher": ["'add'", "block=(8, 1, 1)", f"{s.handle:#x}"],
        "Graph": [handle(made["Graph"]), "1 fill", on],
        "GraphNode": ["fill", "float32", __file__],
        "GraphExec": [f"{made['GraphExec'].handle:#x}", handle(made["Graph"])],
        "Capture": ["thread_local", f"{s.handle:#x}", "not begun"],
        "AutoGraph": ["'surface.<locals>.step'", "1 calls"],
        "RaceCheck": ["'collect'", "not watching", "1 finding"],
        "Finding": [
            "write-after-write",
            f"fill on <Stream created {s.handle:#x}",
            "then fill on <Stream created 0x",
        ],
        "Timeline": [f"{len(tl.records)} records", "1 context", tl.source],
        "Record": ["memset", on, f"stream {s.handle:#x}", __file__],
        "Summary": ["'s'", f"'context': {ctx.handle:#x}", f"'stream': {s.handle:#x}"],
        "Operation": ["memset", f"{s.handle:#x}", __file__],
        "Access": [f"ptr={made['DeviceArray'].ptr:#x}", "nbytes=32", "mode='w'"],
        "MemoryPool": [handle(made["MemoryPool"]), "device 0, max_size 1: used 0 B, reserved 0 B"],
        "IsolatedExecutor": ["process", "devices=[0]", "workers=1", "shut down"],
    }
    for name, parts in expect.items():
        text = repr(made[name])
        for part in parts:
            assert part in text, (name, part, text)


def handle(obj: object) -> str:
    """The driver handle of a Graph, Module or MemoryPool (no public ``handle``), in hex."""
    return f"{int(obj._handle):#x}"


def made_in_a_context_that_ends(lib: cuctx.Library, end: str) -> dict[str, object]:
    if end == "poisoned" and cuctx.backend().sim is None:
        pytest.skip("poisoning a context on purpose needs the sim (cuctx.sim.inject_fault)")
    ctx = cuctx.Context.create(0)
    try:
        made = surface(lib)
    finally:
        cuctx.Context.pop()
    if end == "destroyed":
        ctx.destroy()
    else:
        cuctx.sim.inject_fault(ctx)
        with pytest.raises(StickyFaultError):
            ctx.synchronize()
    return made


@pytest.mark.parametrize("end", ["destroyed", "poisoned"])
def test_reprs_never_raise_once_the_context_is_gone(lib, end):
    made = made_in_a_context_that_ends(lib, end)
    assert made["Context"]._state == end
    for name, obj in made.items():
        assert not DEFAULT.search(repr(obj)), (name, repr(obj))
    for name in (
        "Context",
        "Stream",
        "Event",
        "DeviceArray",
        "Module",
        "Launcher",
        "Graph",
        "GraphExec",
        "Capture",
    ):
        assert end in repr(made[name]), (name, repr(made[name]))


def test_reprs_of_closed_and_unfinished_objects(lib):
    with cuctx.Device(0):
        made = surface(lib)
        exe, module = made["GraphExec"], made["Module"]
        exe.destroy()
        assert repr(exe).startswith("<GraphExec destroyed of <Graph 0x")
        module.unload()
        assert repr(module).endswith(" unloaded>")
        other = cuctx.Library.from_source(ADD_SOURCE, sim_kernels={"add": add})
        kernel = other["add"]
        other.unload()
        assert repr(kernel).endswith(" unloaded>>")

        s, x = made["Stream"], made["DeviceArray"]
        capture = s.capture()
        with capture as graph:
            assert re.search(rf"capturing since {re.escape(__file__)}:\d+>$", repr(capture))
            assert "not made yet" in repr(graph)
            x.fill(1.0, stream=s)
        assert re.search(r", ended: <Graph 0x[0-9a-f]+ 1 nodes: 1 fill", repr(capture))
        broken = s.capture()
        with pytest.raises(GraphCaptureError):
            with broken as never:
                with pytest.raises(GraphCaptureError):
                    s.synchronize()
        assert "broken (" in repr(broken) and "not made yet" in repr(never)

        rc = cuctx.racecheck("warn")
        with rc:
            assert "watching, 0 findings" in repr(rc) and "not watching" not in repr(rc)
        assert repr(rc) == "<RaceCheck mode='warn', not watching, 0 findings>"


def test_a_partition_says_its_contexts_and_whether_it_is_closed(sim):
    with cuctx.Device(0).partition([64, 64]) as partition:
        assert repr(partition).endswith("of [64, 64] SMs, active>")
        handles = ", ".join(f"{ctx.handle:#x}" for ctx in partition)
    assert repr(partition) == (
        f"<Partition of device 0: 2 green contexts ({handles}) of [64, 64] SMs, closed>"
    )
