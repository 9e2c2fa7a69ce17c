"""The conditional-node steps of scripts/probe_graphs.py that came with cuctx's "if_else" and
"switch" nodes: IF with an else body, SWITCH and WHILE nodes driven by kernels that call
cudaGraphSetConditional, the sizes each type takes, a switch's default, and a handle used by
two nodes or by a node of another graph.

The setter kernels are NVRTC's PTX for this source, with the declaration cuctx's compiler
supplies (kernels/_compiler.py) and the PTX version lowered to one every CUDA 12 and 13
driver reads:

    extern "C" __global__ void setc(cudaGraphConditionalHandle h, unsigned int v) {
        cudaGraphSetConditional(h, v); }
    extern "C" __global__ void countdown(unsigned int* c, cudaGraphConditionalHandle h) {
        unsigned int v = *c - 1; *c = v; cudaGraphSetConditional(h, v != 0); }
"""

from __future__ import annotations

import ctypes

import numpy as np
from cuda.bindings import driver as d
from probe_graphs_common import T, Recorder, Setup

SETTER_PTX = b"""
.version 8.0
.target sm_90
.address_size 64
.extern .func cudaGraphSetConditional(.param .b64 h, .param .b32 v);
.visible .entry setc(.param .u64 setc_h, .param .u32 setc_v) {
  .reg .b32 %r<2>; .reg .b64 %rd<2>;
  ld.param.u64 %rd1, [setc_h]; ld.param.u32 %r1, [setc_v];
  { .param .b64 param0; st.param.b64 [param0+0], %rd1;
    .param .b32 param1; st.param.b32 [param1+0], %r1;
    call.uni cudaGraphSetConditional, (param0, param1); }
  ret;
}
.visible .entry countdown(.param .u64 countdown_c, .param .u64 countdown_h) {
  .reg .pred %p<2>; .reg .b32 %r<4>; .reg .b64 %rd<4>;
  ld.param.u64 %rd1, [countdown_c]; ld.param.u64 %rd2, [countdown_h];
  cvta.to.global.u64 %rd3, %rd1; ld.global.u32 %r1, [%rd3];
  add.s32 %r2, %r1, -1; st.global.u32 [%rd3], %r2;
  setp.ne.s32 %p1, %r2, 0; selp.u32 %r3, 1, 0, %p1;
  { .param .b64 param0; st.param.b64 [param0+0], %rd2;
    .param .b32 param1; st.param.b32 [param1+0], %r3;
    call.uni cudaGraphSetConditional, (param0, param1); }
  ret;
}
"""
COND = d.CUgraphConditionalNodeType


def add_conditional(r: Recorder, ctx, label: str, g, kind, size: int, h, after=()) -> list:
    """A conditional node added as a step; its body graphs (none when refused)."""
    params = d.CUgraphNodeParams()
    params.type = T.CU_GRAPH_NODE_TYPE_CONDITIONAL
    params.conditional.handle, params.conditional.type = h, kind
    params.conditional.size, params.conditional.ctx = size, ctx
    result = r.step(
        f"add conditional {label}",
        lambda: r.drv.cuGraphAddNode(g, list(after), None, len(after), params),
    )
    return list(params.conditional.phGraph_out) if result and not result[0] else []


def conditional_kinds(r: Recorder, s: Setup, backend) -> None:
    step, drv, ctx, stream = r.step, r.drv, s.ctx, s.stream
    c = s.allocs[2]
    loaded = step("load the setter module", lambda: drv.cuModuleLoadData(SETTER_PTX))
    if loaded is None or loaded[0]:
        return
    _, setc = drv.cuModuleGetFunction(loaded[1], b"setc")
    _, countdown = drv.cuModuleGetFunction(loaded[1], b"countdown")
    if backend.sim is not None:  # the kernels' twins set the condition through the sim

        def setc_twin(grid, block, h, v):
            backend.sim.set_conditional(h, v)

        def countdown_twin(grid, block, counter, h):
            view = counter.view(np.uint32, 1)
            view[0] -= 1
            backend.sim.set_conditional(h, int(view[0] != 0))

        backend.sim.set_kernel_twin(setc, setc_twin)
        backend.sim.set_kernel_twin(countdown, countdown_twin)

    def handle(g, default=0, flags=0):
        return drv.cuGraphConditionalHandleCreate(g, ctx, default, flags)[1]

    def node(label, g, kind, size, h, after=()):
        return add_conditional(r, ctx, label, g, kind, size, h, after)

    def run(label, g, words=4, counter=0):
        """Zero ``words`` words at c (the first set to ``counter``), launch ``g``, read."""
        drv.cuMemsetD32Async(c, 0, words, stream)
        drv.cuMemsetD32Async(c, counter, 1, stream)
        result = step(f"{label}: instantiate", lambda: drv.cuGraphInstantiate(g, 0))
        if result is None or result[0]:
            return
        step(
            f"{label}: launch",
            lambda: (drv.cuGraphLaunch(result[1], stream), drv.cuStreamSynchronize(stream)),
        )
        step(f"{label}: memory", lambda: r.read(c, words))
        drv.cuGraphExecDestroy(result[1])

    for value in (1, 0):  # IF with two bodies: the first when non-zero, the second when zero
        g = r.graph(f"IF/ELSE set to {value}")
        h = handle(g)
        k = r.add(f"IF/ELSE set to {value}.setc", "Kernel", g, r.kernel(setc, int(h), value))
        bodies = node(f"IF/ELSE set to {value}", g, COND.CU_GRAPH_COND_TYPE_IF, 2, h, [k])
        for i, body in enumerate(bodies):
            r.add(
                f"IF/ELSE set to {value}.body{i}",
                "Memset",
                body,
                r.memset(c + 4 * i, 10 + i, 1),
                ctx,
            )
        run(f"IF/ELSE set to {value}", g)
    for value in (0, 2, 3):  # SWITCH: body n when the value is n, none past the last
        g = r.graph(f"SWITCH set to {value}")
        h = handle(g)
        k = r.add(f"SWITCH set to {value}.setc", "Kernel", g, r.kernel(setc, int(h), value))
        bodies = node(f"SWITCH set to {value}", g, COND.CU_GRAPH_COND_TYPE_SWITCH, 3, h, [k])
        for i, body in enumerate(bodies):
            r.add(
                f"SWITCH set to {value}.body{i}",
                "Memset",
                body,
                r.memset(c + 4 * i, 20 + i, 1),
                ctx,
            )
        run(f"SWITCH set to {value}", g)
    g = r.graph("SWITCH default 1")
    bodies = node(
        "SWITCH default 1",
        g,
        COND.CU_GRAPH_COND_TYPE_SWITCH,
        2,
        handle(g, 1, d.CU_GRAPH_COND_ASSIGN_DEFAULT),
    )
    for i, body in enumerate(bodies):
        r.add(f"SWITCH default 1.body{i}", "Memset", body, r.memset(c + 4 * i, 30 + i, 1), ctx)
    run("SWITCH default 1", g)

    g = r.graph("WHILE countdown")  # a body kernel counts c down and stops the loop at zero
    h = handle(g, 1, d.CU_GRAPH_COND_ASSIGN_DEFAULT)
    bodies = node("WHILE countdown", g, COND.CU_GRAPH_COND_TYPE_WHILE, 1, h)
    if bodies:
        values = (ctypes.c_uint64 * 2)(c, int(h))
        array = (ctypes.c_void_p * 2)(ctypes.addressof(values), ctypes.addressof(values) + 8)
        r.keep.append((values, array))
        params = r.kernel(countdown, 0, 0)
        params.kernelParams = ctypes.addressof(array)
        r.add("WHILE countdown.k", "Kernel", bodies[0], params)
    run("WHILE countdown", g, 1, counter=3)

    for label, kind, size in (
        ("SWITCH size 0", COND.CU_GRAPH_COND_TYPE_SWITCH, 0),
        ("IF size 3", COND.CU_GRAPH_COND_TYPE_IF, 3),
    ):
        g = r.graph(label)
        node(label, g, kind, size, handle(g))
    shared = r.graph("shared handle")  # one handle driving two nodes
    h = handle(shared, 1, d.CU_GRAPH_COND_ASSIGN_DEFAULT)
    for i in range(2):
        for body in node(f"shared handle {i}", shared, COND.CU_GRAPH_COND_TYPE_IF, 1, h):
            r.add(f"shared handle {i}.m", "Memset", body, r.memset(c + 4 * i, 40 + i, 1), ctx)
    run("shared handle", shared)
    mine, theirs = r.graph("handle owner"), r.graph("handle borrower")
    node("with another graph's handle", theirs, COND.CU_GRAPH_COND_TYPE_IF, 1, handle(mine))


def conditional_rules(r: Recorder, s: Setup) -> None:
    """What cuctx refuses before the driver sees it, as the driver answers it: a conditional
    node in a child graph, an event node in a body; and the per-node calls of an executable
    on the nodes of its bodies (cuctx's update_node and enable take them)."""
    step, drv, ctx, stream = r.step, r.drv, s.ctx, s.stream
    c = s.allocs[2]

    def if_node(label, g):
        h = drv.cuGraphConditionalHandleCreate(g, ctx, 1, d.CU_GRAPH_COND_ASSIGN_DEFAULT)[1]
        return add_conditional(r, ctx, label, g, COND.CU_GRAPH_COND_TYPE_IF, 1, h)

    inner = r.graph("child with a conditional")
    if_node("in a child", inner)
    step(
        "child graph with a conditional node",
        lambda: drv.cuGraphAddChildGraphNode(r.graph("conditional child holder"), None, 0, inner)[
            0
        ],
    )
    eb = r.graph("event body")
    bodies = if_node("for an event node", eb)
    if bodies:
        _, event = drv.cuEventCreate(0)
        r.add("event body.record", "EventRecord", bodies[0], event)
    step("instantiate an event record node in a body", lambda: drv.cuGraphInstantiate(eb, 0)[0])

    g = r.graph("body updates")
    bodies = if_node("body updates", g)
    if not bodies:
        return
    k = r.add("body updates.k", "Kernel", bodies[0], r.kernel(s.put, c, 1))
    m = r.add("body updates.m", "Memset", bodies[0], r.memset(c + 4, 2, 1), ctx)
    nested = if_node("nested in body updates", bodies[0])
    deep = (
        r.add("body updates.deep", "Memset", nested[0], r.memset(c + 8, 3, 1), ctx)
        if nested
        else None
    )
    drv.cuMemsetD32Async(c, 0, 3, stream)
    x = r.instantiate("body updates exec", g)
    if x is None:
        return
    step(
        "body updates: launch",
        lambda: (drv.cuGraphLaunch(x, stream), drv.cuStreamSynchronize(stream)),
    )
    step("body updates: memory", lambda: r.read(c, 3))
    step(
        "body updates: kernel set params",
        lambda: drv.cuGraphExecKernelNodeSetParams(x, k, r.kernel(s.put, c, 10)),
    )
    step(
        "body updates: memset set params",
        lambda: drv.cuGraphExecMemsetNodeSetParams(x, m, r.memset(c + 4, 20, 1), ctx),
    )
    step(
        "body updates: disable a node of a nested body",
        lambda: drv.cuGraphNodeSetEnabled(x, deep, 0),
    )
    drv.cuMemsetD32Async(c, 0, 3, stream)
    step(
        "body updates: relaunch",
        lambda: (drv.cuGraphLaunch(x, stream), drv.cuStreamSynchronize(stream)),
    )
    step("body updates: memory after", lambda: r.read(c, 3))
    drv.cuGraphExecDestroy(x)
