"""Record what the real driver does, so the sim can be checked against it (dev tool)."""

import json
import os
import sys
import subprocess
import importlib
from cuda.bindings import driver as d

out = os.environ.get("OUT", "/tmp")
info = {}
for m in [
    "cuda.bindings",
    "cuda.core",
    "cupy",
    "torch",
    "numba",
    "numba_cuda",
    "triton",
    "numpy",
    "cuda.bindings.nvrtc",
    "hypothesis",
    "pytest",
]:
    try:
        mod = importlib.import_module(m)
        info[m] = getattr(mod, "__version__", "?")
    except Exception as e:
        info[m] = f"ERR {e!r}"
info["python"] = sys.version
for cmd in (["nvcc", "--version"], ["gcc", "--version"], ["nvidia-smi"]):
    try:
        info[cmd[0]] = subprocess.run(cmd, capture_output=True, text=True).stdout[-600:]
    except Exception as e:
        info[cmd[0]] = repr(e)
print(d.cuInit(0))
info["driver_version"] = d.cuDriverGetVersion()[1]
err, n = d.cuDeviceGetCount()
info["count"] = n
err, dev = d.cuDeviceGet(0)
info["name"] = d.cuDeviceGetName(256, dev)[1].split(b"\0")[0].decode()
info["uuid"] = bytes(d.cuDeviceGetUuid(dev)[1].bytes).hex()
info["pci"] = d.cuDeviceGetPCIBusId(64, dev)[1].split(b"\0")[0].decode()
info["total_mem"] = d.cuDeviceTotalMem(dev)[1]
attrs = {}
for a in d.CUdevice_attribute:
    r = d.cuDeviceGetAttribute(a, dev)
    attrs[a.name] = int(r[1]) if r[0] == 0 else f"ERR {r[0].name}"
info["attributes"] = attrs
msgs = {}
for c in d.CUresult:
    e, s = d.cuGetErrorString(c)
    msgs[int(c)] = [c.name, s.decode() if e == 0 and s else None]
info["messages"] = msgs
beh = {}
STEPS = r"""def rec(k, r): beh[k] = [x.name if isinstance(x, d.CUresult) else repr(x) for x in (r if isinstance(r, tuple) else (r,))]
rec("get_device_99", d.cuDeviceGet(99))
rec("get_device_neg", d.cuDeviceGet(-1))
rec("pop_empty", d.cuCtxPopCurrent())
rec("get_current_empty", d.cuCtxGetCurrent())
rec("sync_no_ctx", d.cuCtxSynchronize())
rec("getdevice_no_ctx", d.cuCtxGetDevice())
err, ctx = d.cuCtxCreate(None, 0, dev)
rec("create", (err, ctx))
rec("get_current_after_create", d.cuCtxGetCurrent())
rec("api_version", d.cuCtxGetApiVersion(ctx))
rec("flags", d.cuCtxGetFlags())
rec("destroy", d.cuCtxDestroy(ctx))
rec("get_current_after_destroy", d.cuCtxGetCurrent())
rec("destroy_twice", d.cuCtxDestroy(ctx))
rec("push_destroyed", d.cuCtxPushCurrent(ctx))
rec("sync_on_destroyed_current", d.cuCtxSynchronize())
rec("pop_destroyed", d.cuCtxPopCurrent())
# destroyed by another thread while current here
err, ctx2 = d.cuCtxCreate(None, 0, dev)
t = threading.Thread(target=lambda: rec("destroy_from_other_thread", d.cuCtxDestroy(ctx2))); t.start(); t.join()
rec("current_after_other_destroy", d.cuCtxGetCurrent())
rec("sync_after_other_destroy", d.cuCtxSynchronize())
rec("getdevice_after_other_destroy", d.cuCtxGetDevice())
rec("malloc_after_other_destroy", d.cuMemAlloc(1024))
rec("pop_after_other_destroy", d.cuCtxPopCurrent())
rec("get_current_end", d.cuCtxGetCurrent())
rec("primary_state0", d.cuDevicePrimaryCtxGetState(dev))
err, p = d.cuDevicePrimaryCtxRetain(dev)
rec("primary_state1", d.cuDevicePrimaryCtxGetState(dev))
err, p2 = d.cuDevicePrimaryCtxRetain(dev)
rec("primary_same", (err, int(p) == int(p2)))
rec("release1", d.cuDevicePrimaryCtxRelease(dev))
rec("release2", d.cuDevicePrimaryCtxRelease(dev))
rec("primary_state_end", d.cuDevicePrimaryCtxGetState(dev))
rec("release_extra", d.cuDevicePrimaryCtxRelease(dev))
rec("set_current_none", d.cuCtxSetCurrent(None))
rec("create_flags_bad", d.cuCtxCreate(None, 0xFFFF, dev))
rec("attr_bad_dev", d.cuDeviceGetAttribute(d.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_WARP_SIZE, d.CUdevice(77)))
rec("can_access_peer_self", d.cuDeviceCanAccessPeer(dev, dev))
"""


def run_steps():
    lines = STEPS.strip("\n").splitlines()
    for n in range(1, len(lines) + 1):
        prog = (
            "import threading\nfrom cuda.bindings import driver as d\nd.cuInit(0)\nerr, dev = d.cuDeviceGet(0)\nbeh={}\n"
            + "def rec(k, r): beh[k] = [x.name if isinstance(x, d.CUresult) else repr(x) for x in (r if isinstance(r, tuple) else (r,))]\n"
            + "\n".join(lines[:n])
            + "\nimport json; print(json.dumps(beh))"
        )
        p = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True)
        if p.returncode != 0:
            beh["CRASH at: " + lines[n - 1]] = [p.returncode, p.stderr[-300:]]
            lines[n - 1] = "pass"
        else:
            beh.update(json.loads(p.stdout.strip().splitlines()[-1]))


run_steps()
for k in [
    "cuKernelGetParamInfo",
    "cuLibraryLoadData",
    "cuCtxCreate_v4",
    "cuLaunchKernelEx",
    "cuStreamGetDevice",
    "cuCtxGetDevice_v2",
    "cuStreamGetCtx_v2",
]:
    beh["has_" + k] = hasattr(d, k)
info["behaviour"] = beh
print(json.dumps(beh, indent=1))
print({k: v for k, v in info.items() if k not in ("attributes", "messages", "behaviour")})
json.dump(info, open(os.path.join(out, "probe.json"), "w"), indent=1)
