"""What the real driver does with memory across contexts, with a destroyed context left
current, and with CUDA called from a host function (dev tool; run on the GPU machine).

Each case runs in a child process (a sticky fault poisons only that process) and prints one
JSON line: the case and the result codes it saw. ``python scripts/probe_contexts.py``.
"""

import json
import subprocess
import sys

PTX = rb"""
.version 8.0
.target sm_90
.address_size 64
.visible .entry rd(.param .u64 p, .param .u64 o) {
  .reg .b64 %rd<5>; .reg .b32 %r<2>;
  ld.param.u64 %rd1, [p]; ld.param.u64 %rd2, [o];
  cvta.to.global.u64 %rd3, %rd1; cvta.to.global.u64 %rd4, %rd2;
  ld.global.u32 %r1, [%rd3]; st.global.u32 [%rd4], %r1; ret;
}
"""

PRELUDE = r"""
import ctypes, json, sys
from cuda.bindings import driver as d
PTX = %r
out = {}
def name(r):
    r = r[0] if isinstance(r, tuple) else r
    return r.name if hasattr(r, "name") else repr(r)
d.cuInit(0)
_, dev = d.cuDeviceGet(0)
def ctx():
    err, c = d.cuCtxCreate(None, 0, dev); assert not err, err; return c
def kernel():
    err, mod = d.cuModuleLoadData(PTX); assert not err, err
    err, fn = d.cuModuleGetFunction(mod, b"rd"); assert not err, err
    return fn
def launch(fn, p, o):
    args = ((int(p), int(o)), (ctypes.c_void_p, ctypes.c_void_p))
    return d.cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, None, args, 0)
""" % (PTX,)

CASES = {
    # memory of context A used in context B of the same device
    "kernel_in_B_reads_cuMemAlloc_of_A": r"""
A = ctx(); _, pA = d.cuMemAlloc(64); d.cuMemsetD32(pA, 7, 16)
B = ctx(); _, pB = d.cuMemAlloc(64); fn = kernel()
out["launch"] = name(launch(fn, pA, pB)); out["sync"] = name(d.cuCtxSynchronize())
v = (ctypes.c_int * 1)(); out["read"] = name(d.cuMemcpyDtoH(v, pB, 4)); out["value"] = v[0]
""",
    "kernel_in_B_reads_cuMemAllocAsync_of_A": r"""
A = ctx(); _, pA = d.cuMemAllocAsync(64, None); d.cuMemsetD32(pA, 7, 16); d.cuCtxSynchronize()
B = ctx(); _, pB = d.cuMemAlloc(64); fn = kernel()
out["launch"] = name(launch(fn, pA, pB)); out["sync"] = name(d.cuCtxSynchronize())
v = (ctypes.c_int * 1)(); out["read"] = name(d.cuMemcpyDtoH(v, pB, 4)); out["value"] = v[0]
""",
    "copies_in_B_with_memory_of_A": r"""
A = ctx(); _, pA = d.cuMemAllocAsync(64, None); d.cuMemsetD32(pA, 7, 16); d.cuCtxSynchronize()
B = ctx(); _, pB = d.cuMemAlloc(64)
out["ctx_attr_of_pA_in_B"] = [name(r) for r in d.cuPointerGetAttribute(d.CUpointer_attribute.CU_POINTER_ATTRIBUTE_CONTEXT, pA)][:1]
out["dtod"] = name(d.cuMemcpyDtoD(pB, pA, 4))
out["dtod_async"] = name(d.cuMemcpyDtoDAsync(pB, pA, 4, None))
out["memset_A_in_B"] = name(d.cuMemsetD32(pA, 9, 16))
out["sync"] = name(d.cuCtxSynchronize())
v = (ctypes.c_int * 1)(); out["read_A_in_B"] = name(d.cuMemcpyDtoH(v, pA, 4)); out["value"] = v[0]
""",
    "enable_peer_same_device": r"""
A = ctx(); _, pA = d.cuMemAlloc(64); d.cuMemsetD32(pA, 7, 16)
B = ctx(); _, pB = d.cuMemAlloc(64); fn = kernel()
out["enable_peer_B_to_A"] = name(d.cuCtxEnablePeerAccess(A, 0))
out["can_access_peer_0_0"] = [name(x) if hasattr(x, "name") else x for x in d.cuDeviceCanAccessPeer(dev, dev)]
out["launch"] = name(launch(fn, pA, pB)); out["sync"] = name(d.cuCtxSynchronize())
v = (ctypes.c_int * 1)(); out["read"] = name(d.cuMemcpyDtoH(v, pB, 4)); out["value"] = v[0]
""",
    # the context stack walk, then PyTorch on the same thread
    "torch_after_stack_walk": r"""
A = ctx(); B = ctx()
out["push_A"] = name(d.cuCtxPushCurrent(A)); out["pop"] = name(d.cuCtxPopCurrent())
out["destroy_A"] = name(d.cuCtxDestroy(A)); out["destroy_B"] = name(d.cuCtxDestroy(B))
err, cur = d.cuCtxGetCurrent(); out["current_is_A"] = int(cur) == int(A); out["current_nonnull"] = int(cur) != 0
import torch
try:
    out["torch"] = float(torch.ones(4, device="cuda").sum())
except Exception as exc:
    out["torch"] = repr(exc)[:200]
""",
    "torch_after_stack_walk_with_cuctx": r"""
import cuctx
A = cuctx.Context.create(0); B = cuctx.Context.create(0)
A.push(); cuctx.Context.pop(); A.destroy(); B.destroy()
out["current"] = repr(cuctx.current_context())
err, cur = d.cuCtxGetCurrent(); out["driver_current_nonnull"] = int(cur) != 0
import torch
try:
    out["torch"] = float(torch.ones(4, device="cuda").sum())
except Exception as exc:
    out["torch"] = repr(exc)[:200]
""",
    # CUDA called from inside a host function
    "cuda_in_host_func": r"""
import threading
A = ctx(); err, s = d.cuStreamCreate(0)
seen = {}
@ctypes.CFUNCTYPE(None, ctypes.c_void_p)
def cb(_):
    seen["get_current"] = name(d.cuCtxGetCurrent())
    seen["mem_alloc"] = name(d.cuMemAlloc(64))
    seen["memset_async"] = name(d.cuMemsetD8Async(0, 0, 0, s))
    seen["stream_query"] = name(d.cuStreamQuery(s))
fnptr = d.CUhostFn(ctypes.cast(cb, ctypes.c_void_p).value)
out["launch_host_func"] = name(d.cuLaunchHostFunc(s, fnptr, 0))
out["sync"] = name(d.cuStreamSynchronize(s))
out.update(seen)
""",
}


def main() -> None:
    only = sys.argv[1:]
    for case, body in CASES.items():
        if only and case not in only:
            continue
        code = PRELUDE + body + "\nprint(json.dumps(out))\n"
        try:
            run = subprocess.run(
                [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
            )
            line = (run.stdout.strip().splitlines() or [""])[-1]
            result = (
                json.loads(line)
                if line.startswith("{")
                else {"rc": run.returncode, "stderr": run.stderr[-600:]}
            )
        except subprocess.TimeoutExpired:
            result = {"timeout": "60 s (deadlock?)"}
        print(json.dumps({"case": case, **result}), flush=True)


if __name__ == "__main__":
    main()
