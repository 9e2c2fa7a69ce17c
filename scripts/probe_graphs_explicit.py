"""The explicit-graph steps of scripts/probe_graphs.py: graphs built node by node, their
executables and per-node parameters, whole-graph updates, memory nodes, conditional nodes
and dot files."""

from __future__ import annotations

import tempfile
from pathlib import Path

from cuda.bindings import driver as d
from probe_graphs_common import HOST, PTX, T, Recorder, Setup, put_twin, types, with_grid


def explicit(r: Recorder, s: Setup) -> object:
    """Graph G (every basic node kind), its queries, an executable of it, its per-node
    parameters and enabled nodes. Returns the event its record and wait nodes use."""
    step, drv, ctx, stream = r.step, r.drv, s.ctx, s.stream
    put, other = s.put, s.other
    a, b, c = s.allocs
    pinned, seen = s.pinned, s.seen

    step("cuGraphCreate flags=1", lambda: drv.cuGraphCreate(1))
    g = r.graph("G")
    k = r.add("k", "Kernel", g, r.kernel(put, a, 1))
    m = r.add("m", "Memset", g, r.memset(a + 4, 2, 3), ctx, after=[k])
    cp = r.add("cp", "Memcpy", g, r.copy(b, a, 16), ctx, after=[m])
    h = r.add("h", "Host", g, r.host(seen, 7), after=[cp])
    e = r.add("e", "Empty", g, after=[k])
    _, event = drv.cuEventCreate(0)
    r.add("rec", "EventRecord", g, event, after=[h])
    r.add("wait", "EventWait", g, event, after=[e])
    r.add("dup deps", "Empty", g, after=[k, k])
    _, foreign_graph = drv.cuGraphCreate(0)
    foreign = drv.cuGraphAddEmptyNode(foreign_graph, None, 0)[1]
    r.add("foreign dep", "Empty", g, after=[foreign])
    step("add Empty to a null graph", lambda: drv.cuGraphAddEmptyNode(d.CUgraph(0), None, 0))
    step(
        "add Memset outside any allocation",
        lambda: drv.cuGraphAddMemsetNode(g, None, 0, r.memset(16, 0, 4), ctx),
    )
    step(
        "add Memset elementSize 3",
        lambda: drv.cuGraphAddMemsetNode(g, None, 0, r.memset(a, 0, 4, size=3), ctx),
    )
    step(
        "add Memset misaligned",
        lambda: drv.cuGraphAddMemsetNode(g, None, 0, r.memset(a + 2, 0, 4), ctx),
    )
    step(
        "add Memcpy past the end",
        lambda: drv.cuGraphAddMemcpyNode(g, None, 0, r.copy(b, a, 512), ctx),
    )
    step("add Host null fn", lambda: drv.cuGraphAddHostNode(g, None, 0, d.CUDA_HOST_NODE_PARAMS()))
    step(
        "add Memcpy pageable host",
        lambda: drv.cuGraphAddMemcpyNode(
            g, None, 0, r.copy(s.pageable.ctypes.data, a, 16, dst_kind=HOST), ctx
        )[0],
    )
    child = r.graph("child")
    r.add("ck", "Kernel", child, r.kernel(put, c, 5))
    r.add("child", "ChildGraph", g, child)
    step("GetNodes count", lambda: drv.cuGraphGetNodes(g))
    step("GetNodes", lambda: drv.cuGraphGetNodes(g, 10))
    step("GetRootNodes", lambda: drv.cuGraphGetRootNodes(g, 3))
    step("GetEdges count", lambda: drv.cuGraphGetEdges(g))
    step("GetEdges", lambda: drv.cuGraphGetEdges(g, 6))
    step("node types", lambda: types(drv, g))
    step("NodeGetDependencies of cp", lambda: drv.cuGraphNodeGetDependencies(cp, 2))
    step("instantiate UPLOAD flag", lambda: drv.cuGraphInstantiate(g, 2))
    step("instantiate AUTO_FREE|DEVICE_LAUNCH", lambda: drv.cuGraphInstantiate(g, 5))
    step("instantiate DEVICE_LAUNCH with host nodes", lambda: drv.cuGraphInstantiate(g, 4)[0])
    x = r.instantiate("X", g)
    step("upload", lambda: drv.cuGraphUpload(x, stream))
    step("launch", lambda: drv.cuGraphLaunch(x, stream))
    step("sync", lambda: drv.cuStreamSynchronize(stream))
    step("memory after launch", lambda: (r.read(a), r.read(b), r.read(c, 1), seen[:]))
    step("launch legacy stream", lambda: drv.cuGraphLaunch(x, 0))
    drv.cuCtxSynchronize()  # done before the steps below change what a later launch writes
    step("launch null exec", lambda: drv.cuGraphLaunch(d.CUgraphExec(0), stream))

    # -- per-node parameters of an executable -------------------------------------------------
    step(
        "kernel set params", lambda: drv.cuGraphExecKernelNodeSetParams(x, k, r.kernel(put, a, 10))
    )
    step(
        "kernel set params other function",
        lambda: drv.cuGraphExecKernelNodeSetParams(x, k, r.kernel(other, a, 10)),
    )
    step(
        "kernel set params on memset node",
        lambda: drv.cuGraphExecKernelNodeSetParams(x, m, r.kernel(put, a, 10)),
    )
    for label, params in (
        ("value and address", r.memset(a + 8, 3, 3)),
        ("narrower", r.memset(a + 4, 3, 2)),
        ("wider", r.memset(a + 4, 3, 8)),
        ("element size 1", r.memset(a + 4, 3, 12, size=1)),
        ("2D", r.memset(a + 4, 3, 3, height=2, pitch=16)),
        ("back", r.memset(a + 4, 4, 3)),
    ):
        step(
            f"memset set params {label}",
            lambda params=params: drv.cuGraphExecMemsetNodeSetParams(x, m, params, ctx),
        )
    for label, params in (
        ("other buffer", r.copy(c, a, 16)),
        ("bigger", r.copy(b, a, 64)),
        ("to pinned host", r.copy(pinned, a, 16, dst_kind=HOST)),
        ("2D", r.copy(b, a, 8, height=2)),
        ("back", r.copy(b, a, 16)),
    ):
        step(
            f"memcpy set params {label}",
            lambda params=params: drv.cuGraphExecMemcpyNodeSetParams(x, cp, params, ctx),
        )
    step("host set params", lambda: drv.cuGraphExecHostNodeSetParams(x, h, r.host(seen, 8)))
    step(
        "set params with a foreign node",
        lambda: drv.cuGraphExecKernelNodeSetParams(x, foreign, r.kernel(put, a, 1)),
    )
    for label, node in (("kernel", k), ("memset", m), ("memcpy", cp), ("host", h), ("empty", e)):
        step(f"disable {label}", lambda node=node: drv.cuGraphNodeSetEnabled(x, node, 0))
        step(f"enabled? {label}", lambda node=node: drv.cuGraphNodeGetEnabled(x, node))
        step(f"enable {label}", lambda node=node: drv.cuGraphNodeSetEnabled(x, node, 1))
    step(
        "disable memset, launch",
        lambda: (
            drv.cuGraphNodeSetEnabled(x, m, 0),
            drv.cuMemsetD32Async(a, 0, 16, stream),
            drv.cuGraphLaunch(x, stream),
        ),
    )
    step("memory after the second launch", lambda: (r.read(a), r.read(b), seen[:]))
    step("exec destroy", lambda: drv.cuGraphExecDestroy(x))
    r.forget(x)
    return event


def updates(r: Recorder, s: Setup, backend, event) -> None:
    """cuGraphExecUpdate: a base graph (kernel -> memset -> copy, a host node, an event
    record, a child graph) against variants, each on a fresh executable."""
    step, drv, ctx, stream = r.step, r.drv, s.ctx, s.stream
    put, other = s.put, s.other
    a, b, c = s.allocs
    seen: list = []
    _, event2 = drv.cuEventCreate(0)
    _, dev = drv.cuCtxGetDevice()
    _, ctx2 = drv.cuCtxCreate(None, 0, dev)
    _, mod2 = drv.cuModuleLoadData(PTX)
    _, put2 = drv.cuModuleGetFunction(mod2, b"put")
    if backend.sim is not None:
        backend.sim.set_kernel_twin(put2, put_twin)
    drv.cuCtxPopCurrent()

    def base(
        name,
        kernel=None,
        memset=None,
        copy=None,
        host=7,
        record=event,
        child=5,
        extra=False,
        swap=False,
        cross=False,
    ):
        g = r.graph(name)
        k = r.add(f"{name}.k", "Kernel", g, kernel or r.kernel(put, a, 1))
        m = r.add(
            f"{name}.m",
            "Memset",
            g,
            memset or r.memset(a + 4, 2, 4),
            ctx,
            after=[] if swap else [k],
        )
        cp = r.add(
            f"{name}.cp", "Memcpy", g, copy or r.copy(b, a, 16), ctx, after=[k] if cross else [m]
        )
        r.add(f"{name}.h", "Host", g, r.host(seen, host), after=[cp])
        r.add(f"{name}.rec", "EventRecord", g, record, after=[cp])
        inner = r.graph(f"{name}.inner")
        r.add(f"{name}.ik", "Kernel", inner, r.kernel(put, c, child))
        r.add(f"{name}.child", "ChildGraph", g, inner)
        if extra:
            r.add(f"{name}.extra", "Empty", g)
        return g

    g0 = base("U0")
    variants = {
        "same structure, new values": dict(
            kernel=r.kernel(put, b, 3),
            memset=r.memset(b, 4, 4),
            copy=r.copy(c, b, 16),
            host=9,
            child=6,
        ),
        "an extra node": dict(extra=True),
        "a dependency removed": dict(swap=True),
        "a dependency moved": dict(cross=True),
        "kernel: another function": dict(kernel=r.kernel(other, a, 1)),
        "kernel: a function of another context": dict(kernel=r.kernel(put2, a, 1)),
        "kernel: another grid": dict(kernel=with_grid(r.kernel(put, a, 1), 2)),
        "memset: narrower": dict(memset=r.memset(a + 4, 2, 2)),
        "memset: wider": dict(memset=r.memset(a + 4, 2, 16)),
        "memset: element size 1": dict(memset=r.memset(a + 4, 2, 16, size=1)),
        "memset: element size 2 same bytes": dict(memset=r.memset(a + 4, 2, 8, size=2)),
        "memset: 2D": dict(memset=r.memset(a + 4, 2, 2, height=2, pitch=16)),
        "memcpy: to pinned host": dict(copy=r.copy(s.pinned, a, 16, dst_kind=HOST)),
        "memcpy: bigger": dict(copy=r.copy(b, a, 128)),
        "memcpy: 2D": dict(copy=r.copy(b, a, 8, height=2)),
        "event record: another event": dict(record=event2),
    }
    for label, kwargs in variants.items():
        g1 = base(f"V[{label}]", **kwargs)
        x = r.instantiate(f"U0 for {label}", g0)
        step(f"update: {label}", lambda x=x, g1=g1: drv.cuGraphExecUpdate(x, g1))
        step(f"launch after update: {label}", lambda x=x: drv.cuGraphLaunch(x, stream))
        step(f"sync after update: {label}", lambda: drv.cuStreamSynchronize(stream))
        drv.cuGraphExecDestroy(x)
        r.forget(x)
    kinds = r.graph("kinds")
    r.add("kinds.m", "Memset", kinds, r.memset(a, 1, 4), ctx)
    x = r.instantiate("kinds exec", kinds)
    swapped = r.graph("swapped")
    r.add("swapped.k", "Kernel", swapped, r.kernel(put, a, 1))
    step("update: node type changed", lambda: drv.cuGraphExecUpdate(x, swapped))
    step("update: null graph", lambda: drv.cuGraphExecUpdate(x, d.CUgraph(0)))
    drv.cuCtxDestroy(ctx2)
    drv.cuCtxSetCurrent(ctx)


def memory_and_conditionals(r: Recorder, s: Setup) -> None:
    step, drv, ctx, stream = r.step, r.drv, s.ctx, s.stream
    a = s.allocs[0]
    _, dev = drv.cuCtxGetDevice()

    def alloc_params(nbytes=64):
        params = d.CUDA_MEM_ALLOC_NODE_PARAMS()
        params.poolProps.allocType = d.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        params.poolProps.location.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        params.poolProps.location.id = int(dev)
        params.bytesize = nbytes
        return params

    g = r.graph("M")
    params = alloc_params()
    node = r.add("M.alloc", "MemAlloc", g, params)
    ptr = int(params.dptr)
    step("alloc node: dptr set", lambda: ptr != 0)
    r.add("M.fill", "Memset", g, r.memset(ptr, 5, 16), ctx, after=[node])
    step(
        "alloc node of 0 bytes", lambda: drv.cuGraphAddMemAllocNode(g, None, 0, alloc_params(0))[0]
    )
    step("free node of a cuMemAlloc pointer", lambda: drv.cuGraphAddMemFreeNode(g, None, 0, a)[0])
    x = r.instantiate("M exec", g)
    step("M: second instantiate", lambda: drv.cuGraphInstantiate(g, 0)[0])
    step("M: launch", lambda: (drv.cuGraphLaunch(x, stream), drv.cuStreamSynchronize(stream)))
    step("M: value", lambda: r.read(ptr, 2))
    step("M: relaunch unfreed", lambda: drv.cuGraphLaunch(x, stream))
    step("M: cuMemFreeAsync", lambda: drv.cuMemFreeAsync(ptr, stream))
    step(
        "M: relaunch after the free",
        lambda: (drv.cuGraphLaunch(x, stream), drv.cuStreamSynchronize(stream)),
    )
    step("M: exec destroy", lambda: drv.cuGraphExecDestroy(x))
    r.forget(x)
    auto = r.instantiate("M auto-free", g, 1)
    step(
        "M: auto-free relaunch",
        lambda: (
            drv.cuGraphLaunch(auto, stream),
            drv.cuGraphLaunch(auto, stream),
            drv.cuStreamSynchronize(stream),
        ),
    )
    free = r.graph("F")
    r.add("F.free", "MemFree", free, ptr)
    step("second free node", lambda: drv.cuGraphAddMemFreeNode(free, None, 0, ptr)[0])
    step(
        "child graph with memory nodes",
        lambda: drv.cuGraphAddChildGraphNode(r.graph("holder"), None, 0, g)[0],
    )
    drv.cuGraphExecDestroy(auto)
    r.forget(auto)

    def conditional(label, g, kind, size, default=0, flags=1):
        err, handle = drv.cuGraphConditionalHandleCreate(g, ctx, default, flags)
        params = d.CUgraphNodeParams()
        params.type = T.CU_GRAPH_NODE_TYPE_CONDITIONAL
        params.conditional.handle, params.conditional.type = handle, kind
        params.conditional.size, params.conditional.ctx = size, ctx
        result = step(
            f"add conditional {label}", lambda: drv.cuGraphAddNode(g, None, None, 0, params)
        )
        bodies = params.conditional.phGraph_out if result and not result[0] else []
        step(f"conditional {label}: bodies", lambda: len([b for b in bodies if int(b)]))
        return bodies

    cond = d.CUgraphConditionalNodeType
    c = r.graph("Cond")
    if_bodies = conditional("IF default 1", c, cond.CU_GRAPH_COND_TYPE_IF, 1, default=1)
    if if_bodies:
        r.add("if.m", "Memset", if_bodies[0], r.memset(a, 7, 1), ctx)
    else_bodies = conditional("IF/ELSE default 0", c, cond.CU_GRAPH_COND_TYPE_IF, 2)
    if len(else_bodies) == 2:
        r.add("else.m", "Memset", else_bodies[1], r.memset(a + 4, 8, 1), ctx)
    while_bodies = conditional("WHILE default 0", c, cond.CU_GRAPH_COND_TYPE_WHILE, 1)
    if while_bodies:
        r.add("while.m", "Memset", while_bodies[0], r.memset(a + 8, 9, 1), ctx)
    conditional("WHILE size 2", r.graph("bad while"), cond.CU_GRAPH_COND_TYPE_WHILE, 2)
    drv.cuMemsetD32Async(a, 0, 4, stream)
    cx = r.instantiate("Cond exec", c)
    step("Cond: launch", lambda: (drv.cuGraphLaunch(cx, stream), drv.cuStreamSynchronize(stream)))
    step("Cond: memory", lambda: r.read(a))
    # A host node is not among the kinds a body may hold (docs), yet the driver adds it:
    # does instantiation refuse it? (In a graph of its own, so Cond above instantiates.)
    hb = r.graph("host body")
    host_bodies = conditional("IF for a host node", hb, cond.CU_GRAPH_COND_TYPE_IF, 1)
    if host_bodies:
        step(
            "host node in a body",
            lambda: drv.cuGraphAddHostNode(host_bodies[0], None, 0, r.host([], 1))[0],
        )
    step("instantiate a host node in a body", lambda: drv.cuGraphInstantiate(hb, 0)[0])
    unused = r.graph("unused handle")
    drv.cuGraphConditionalHandleCreate(unused, ctx, 0, 0)
    step("instantiate with an unused handle", lambda: drv.cuGraphInstantiate(unused, 0)[0])
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "g.dot"
        step("dot print", lambda: drv.cuGraphDebugDotPrint(c, str(path).encode(), 0))
        step("dot file written", lambda: path.exists())
    step(
        "dot print to a missing directory",
        lambda: drv.cuGraphDebugDotPrint(c, b"/nonexistent-dir/g.dot", 0),
    )
