"""Dev tool: what a GPU answers for explicit memory pools, IPC between processes and managed
memory, the calls the sim models in src/cuctx/_driver/sim/_pools.py, _ipc.py and _managed.py
(tests/memory/test_pool.py, test_ipc.py, test_managed.py). Raw cuda.bindings; each case runs
in its own process, because misuse may crash or poison the context; the IPC cases run an
importing process beside the exporting one (started with subprocess, the pool's file
descriptor passed to it, never pickled). Each line prints the case and what the driver
answered, so the sim's answers can be compared line by line:

    usage: python scripts/probe_ipc.py            (on a machine with a GPU)
"""

import subprocess
import sys
import textwrap

SETUP = r"""
import ctypes, os, sys, time
from cuda.bindings import driver as d
A = d.CUmemPool_attribute
FD = d.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR

def name(x):
    if hasattr(x, "name"):
        return x.name
    if hasattr(x, "getPtr"):
        try:
            return int(x)
        except TypeError:
            return type(x).__name__
    return x

def show(label, result):
    result = result if isinstance(result, tuple) else (result,)
    print(f"{label}: {[name(x) for x in result]}")
    return result

def ok(result):
    assert int(result[0]) == 0, result
    return result[1] if len(result) == 2 else result[1:]

ok(d.cuInit(0)); dev = ok(d.cuDeviceGet(0))
ctx = ok(d.cuDevicePrimaryCtxRetain(dev)); ok(d.cuCtxSetCurrent(ctx))
stream = ok(d.cuStreamCreate(0))

def pool_props(handle_types=0, max_size=0):
    props = d.CUmemPoolProps()
    props.allocType = d.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    props.location.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    props.location.id = 0
    props.handleTypes = handle_types
    props.maxSize = max_size
    return props

def attrs(pool, label=""):
    out = {}
    for a in (A.CU_MEMPOOL_ATTR_USED_MEM_CURRENT, A.CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
              A.CU_MEMPOOL_ATTR_USED_MEM_HIGH, A.CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH):
        err, value = d.cuMemPoolGetAttribute(pool, a)
        out[a.name.removeprefix("CU_MEMPOOL_ATTR_")] = int(value) if not err else err.name
    print(f"{label}: {out}")

def export_data(ptr):
    data = ok(d.cuMemPoolExportPointer(ptr))
    return ctypes.string_at(data.getPtr(), 64).hex()

def import_data(text):
    data = d.CUmemPoolPtrExportData()
    ctypes.memmove(data.getPtr(), bytes.fromhex(text), 64)
    return data
"""

CASES = {
    "pool attributes": """
pool = ok(d.cuMemPoolCreate(pool_props()))
for a in A:
    try:
        show(f"get {a.name}", d.cuMemPoolGetAttribute(pool, a))
    except Exception as exc:
        print(f"get {a.name}: raises {type(exc).__name__}: {exc}")
attrs(pool, "fresh pool")
p1 = ok(d.cuMemAllocFromPoolAsync(1000, pool, stream)); attrs(pool, "after 1000 bytes")
p2 = ok(d.cuMemAllocFromPoolAsync(3 << 20, pool, stream)); attrs(pool, "after 3 MiB more")
print("addresses", hex(int(p1)), hex(int(p2)), int(p2) - int(p1))
ok(d.cuMemFreeAsync(p1, stream)); attrs(pool, "after freeing the 1000 (queued)")
ok(d.cuStreamSynchronize(stream)); attrs(pool, "after a stream synchronize")
ok(d.cuMemFreeAsync(p2, stream)); ok(d.cuStreamSynchronize(stream))
attrs(pool, "all freed, synchronized (threshold 0)")
show("set USED_MEM_HIGH 0", d.cuMemPoolSetAttribute(pool, A.CU_MEMPOOL_ATTR_USED_MEM_HIGH,
                                                   d.cuuint64_t(0)))
show("set USED_MEM_HIGH 5", d.cuMemPoolSetAttribute(pool, A.CU_MEMPOOL_ATTR_USED_MEM_HIGH,
                                                   d.cuuint64_t(5)))
show("set RESERVED_MEM_HIGH 5", d.cuMemPoolSetAttribute(
    pool, A.CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, d.cuuint64_t(5)))
show("set USED_MEM_CURRENT 0", d.cuMemPoolSetAttribute(
    pool, A.CU_MEMPOOL_ATTR_USED_MEM_CURRENT, d.cuuint64_t(0)))
attrs(pool, "after the resets")
try:
    d.cuMemPoolSetAttribute(pool, A.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, 5)
except Exception as exc:
    print(f"set threshold with an int: raises {type(exc).__name__}: {exc}")
show("set threshold 64 MiB", d.cuMemPoolSetAttribute(
    pool, A.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, d.cuuint64_t(64 << 20)))
p = ok(d.cuMemAllocFromPoolAsync(8 << 20, pool, stream)); ok(d.cuMemFreeAsync(p, stream))
ok(d.cuStreamSynchronize(stream)); attrs(pool, "8 MiB freed, synchronized (threshold 64 MiB)")
ok(d.cuCtxSynchronize()); attrs(pool, "after a context synchronize")
show("trim to 1 MiB", d.cuMemPoolTrimTo(pool, 1 << 20)); attrs(pool, "after the trim")
show("trim to 0", d.cuMemPoolTrimTo(pool, 0)); attrs(pool, "after the trim")
show("alloc 0 bytes", d.cuMemAllocFromPoolAsync(0, pool, stream))
show("destroy", d.cuMemPoolDestroy(pool))
show("alloc from the destroyed pool", d.cuMemAllocFromPoolAsync(64, pool, stream))
show("destroy again", d.cuMemPoolDestroy(pool))
default = ok(d.cuDeviceGetDefaultMemPool(dev))
show("destroy the default pool", d.cuMemPoolDestroy(default))
""",
    "pool limits": """
for size in (1, 1 << 20, 3 << 20, 32 << 20, 40 << 20):
    r = show(f"create maxSize={size}", d.cuMemPoolCreate(pool_props(max_size=size)))
    if int(r[0]):
        continue
    pool = r[1]
    got = []
    for n in (512, 1 << 20, 2 << 20, 4 << 20, 16 << 20, 24 << 20, 64 << 20):
        r = d.cuMemAllocFromPoolAsync(n, pool, stream)
        print(f"  alloc {n}: {r[0].name}")
        if not int(r[0]):
            got.append(r[1])
    attrs(pool, "  then")
    for p in got:
        ok(d.cuMemFreeAsync(p, stream))
    ok(d.cuStreamSynchronize(stream)); ok(d.cuMemPoolDestroy(pool))
props = pool_props(); props.location.id = 7
show("create on device 7", d.cuMemPoolCreate(props))
props = pool_props(); props.allocType = 0
show("create with allocType INVALID", d.cuMemPoolCreate(props))
show("create with handle types 0x10 (unknown)", d.cuMemPoolCreate(pool_props(0x10)))
ok(d.cuCtxSetCurrent(None))
r = show("create with no current context", d.cuMemPoolCreate(pool_props()))
ok(d.cuCtxSetCurrent(ctx))
""",
    "pool lifetime": """
free0 = ok(d.cuMemGetInfo())[0]
pool = ok(d.cuMemPoolCreate(pool_props()))
p = ok(d.cuMemAllocFromPoolAsync(64 << 20, pool, stream)); ok(d.cuStreamSynchronize(stream))
show("memset a live allocation", d.cuMemsetD32Async(p, 7, 16, stream))
show("destroy with it live", d.cuMemPoolDestroy(pool))
show("memset after the destroy", d.cuMemsetD32Async(p, 9, 16, stream))
host = (ctypes.c_uint32 * 16)()
show("read back", d.cuMemcpyDtoH(ctypes.addressof(host), p, 64)); print("value", host[0])
show("free after the destroy", d.cuMemFreeAsync(p, stream))
show("synchronize", d.cuStreamSynchronize(stream))
print("free MiB held", (free0 - ok(d.cuMemGetInfo())[0]) >> 20)
pool = ok(d.cuMemPoolCreate(pool_props()))
p = ok(d.cuMemAllocFromPoolAsync(64 << 20, pool, stream))
ok(d.cuCtxSynchronize())
ok(d.cuDevicePrimaryCtxRelease(dev)); show("reset the context", d.cuDevicePrimaryCtxReset(dev))
ctx = ok(d.cuDevicePrimaryCtxRetain(dev)); ok(d.cuCtxSetCurrent(ctx))
attrs(pool, "the pool after a reset")
show("free after the reset", d.cuMemFreeAsync(p, 0)); ok(d.cuCtxSynchronize())
attrs(pool, "then")
show("destroy", d.cuMemPoolDestroy(pool))
""",
    "export misuse": """
plain = ok(d.cuMemPoolCreate(pool_props()))
p = ok(d.cuMemAllocFromPoolAsync(4096, plain, stream))
show("export a non-IPC pool", d.cuMemPoolExportToShareableHandle(plain, FD, 0))
show("export a pointer of a non-IPC pool", d.cuMemPoolExportPointer(p))
q = ok(d.cuMemAllocAsync(4096, stream))
show("export a pointer of the default pool", d.cuMemPoolExportPointer(q))
r = ok(d.cuMemAlloc(4096))
show("export a cuMemAlloc pointer", d.cuMemPoolExportPointer(r))
ipc = ok(d.cuMemPoolCreate(pool_props(FD)))
s = ok(d.cuMemAllocFromPoolAsync(4096, ipc, stream))
show("export a pointer before the pool was shared", d.cuMemPoolExportPointer(s))
show("export with flags 1", d.cuMemPoolExportToShareableHandle(ipc, FD, 1))
show("export as NONE", d.cuMemPoolExportToShareableHandle(
    ipc, d.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_NONE, 0))
r = show("export as FD", d.cuMemPoolExportToShareableHandle(ipc, FD, 0))
print("handle type", type(r[1]).__name__)
r2 = show("export as FD again", d.cuMemPoolExportToShareableHandle(ipc, FD, 0))
print("another descriptor", r2[1] != r[1])
show("export before the allocation ran", d.cuMemPoolExportPointer(s))
show("  the stream", d.cuStreamQuery(stream))
ok(d.cuStreamSynchronize(stream))
show("export after a synchronize", d.cuMemPoolExportPointer(s))
show("export an inner pointer", d.cuMemPoolExportPointer(int(s) + 256))
u = ok(d.cuMemAllocFromPoolAsync(4096, ipc, 0))
show("export of a legacy-stream allocation, before a synchronize", d.cuMemPoolExportPointer(u))
show("export twice, same bytes", (export_data(s) == export_data(s),))
t = ok(d.cuMemAllocFromPoolAsync(4096, ipc, stream)); ok(d.cuStreamSynchronize(stream))
print("two exports differ", export_data(s) != export_data(t))
print("export data", export_data(s))
before, where = export_data(t), int(t)
ok(d.cuMemFreeAsync(t, stream)); ok(d.cuStreamSynchronize(stream))
t = ok(d.cuMemAllocFromPoolAsync(4096, ipc, stream)); ok(d.cuStreamSynchronize(stream))
print("reused the address", int(t) == where, "same export bytes", export_data(t) == before)
show("import a pool in its own process", d.cuMemPoolImportFromShareableHandle(r[1], FD, 0))
show("import a pointer in its own process", d.cuMemPoolImportPointer(
    ipc, import_data(export_data(s))))
ok(d.cuMemFreeAsync(t, stream))
show("export after a queued free", d.cuMemPoolExportPointer(t))
plain_g = None
print("capture:")
ok(d.cuStreamBeginCapture(stream, d.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL))
g = d.cuMemAllocFromPoolAsync(4096, ipc, stream); show("  alloc from an IPC pool", g)
if not int(g[0]):
    show("  export it", d.cuMemPoolExportPointer(g[1]))
    d.cuMemFreeAsync(g[1], stream)
show("  end capture", d.cuStreamEndCapture(stream))
ok(d.cuStreamBeginCapture(stream, d.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL))
g = d.cuMemAllocFromPoolAsync(4096, plain, stream); show("  alloc from a plain pool", g)
if not int(g[0]):
    d.cuMemFreeAsync(g[1], stream)
e = show("  end capture", d.cuStreamEndCapture(stream))
if not int(e[0]):
    show("  node count", d.cuGraphGetNodes(e[1], 0))
""",
    "managed memory": """
free0 = ok(d.cuMemGetInfo())[0]
G = d.CUmemAttach_flags.CU_MEM_ATTACH_GLOBAL
show("managed 0 bytes", d.cuMemAllocManaged(0, G))
show("managed flags 0", d.cuMemAllocManaged(64, 0))
show("managed flags 3", d.cuMemAllocManaged(64, 3))
p = show("managed 1 MiB global", d.cuMemAllocManaged(1 << 20, G))[1]
print("held MiB", (free0 - ok(d.cuMemGetInfo())[0]) >> 20)
show("IS_MANAGED", d.cuPointerGetAttribute(d.CUpointer_attribute.CU_POINTER_ATTRIBUTE_IS_MANAGED, p))
show("DEVICE_ORDINAL", d.cuPointerGetAttribute(
    d.CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p))
ok(d.cuMemsetD32Async(p, 0x01020304, 4, stream)); ok(d.cuStreamSynchronize(stream))
print("host reads", hex((ctypes.c_uint32 * 4).from_address(int(p))[0]))
(ctypes.c_uint32 * 4).from_address(int(p))[1] = 77
host = (ctypes.c_uint32 * 4)()
ok(d.cuMemcpyDtoH(ctypes.addressof(host), p, 16)); print("device reads", list(host))
show("free async", d.cuMemFreeAsync(p, stream)); show("sync", d.cuStreamSynchronize(stream))
q = ok(d.cuMemAllocManaged(4096, G)); show("cuMemFree", d.cuMemFree(q))
show("cuMemFree again", d.cuMemFree(q))
print("held MiB after", (free0 - ok(d.cuMemGetInfo())[0]) >> 20)
""",
}

# The IPC cases: this process exports, a second one (started with the pool's descriptor
# passed to it) imports; they talk over the child's stdin/stdout, one line per step.
EXPORTER = r"""
import subprocess
free0 = ok(d.cuMemGetInfo())[0]
pool = ok(d.cuMemPoolCreate(pool_props(FD)))
p = ok(d.cuMemAllocFromPoolAsync(1 << 20, pool, stream))
ok(d.cuMemsetD32Async(p, 0x11111111, 1 << 18, stream)); ok(d.cuStreamSynchronize(stream))
fd = ok(d.cuMemPoolExportToShareableHandle(pool, FD, 0))
child = subprocess.Popen([sys.executable, "-c", SETUP + IMPORTER, str(fd)], pass_fds=[fd],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
os.close(fd)
def ask(line):
    child.stdin.write(line + "\n"); child.stdin.flush()
    while True:
        out = child.stdout.readline()
        if not out or out.startswith("done"):
            return
        print("  importer", out.rstrip())
print("exporter's pointer", hex(int(p)))
ask("import " + export_data(p))
host = (ctypes.c_uint32 * 4)()
ok(d.cuMemcpyDtoH(ctypes.addressof(host), p, 16)); print("exporter reads", hex(host[0]))
start = time.perf_counter()
show("exporter frees while imported", d.cuMemFreeAsync(p, stream))
show("exporter synchronizes", d.cuStreamSynchronize(stream))
print(f"(took {1000 * (time.perf_counter() - start):.1f} ms)")
q = ok(d.cuMemAllocFromPoolAsync(1 << 20, pool, stream))
print("next allocation reuses it", int(q) == int(p))
ok(d.cuMemsetD32Async(q, 0x22222222, 1 << 18, stream)); ok(d.cuStreamSynchronize(stream))
ask("read")
ok(d.cuMemcpyDtoH(ctypes.addressof(host), q, 16)); print("exporter reads its reuse", hex(host[0]))
old = export_data(q)
ok(d.cuMemFreeAsync(q, stream)); ok(d.cuStreamSynchronize(stream))
ask("import-freed " + old)
w = ok(d.cuMemAllocFromPoolAsync(1 << 20, pool, stream)); ok(d.cuStreamSynchronize(stream))
ask("import-sync " + export_data(w))
show("destroy the pool while imported, w live", d.cuMemPoolDestroy(pool))
ask("read-w")
ok(d.cuMemFreeAsync(w, stream)); ok(d.cuStreamSynchronize(stream))
ask("exit")
print("importer exit status", child.wait(timeout=60))
print("exporter's memory held after all that (MiB)", (free0 - ok(d.cuMemGetInfo())[0]) >> 20)
"""
IMPORTER = r"""
fd = int(sys.argv[1])
pool = None
host = (ctypes.c_uint32 * 4)()
for line in sys.stdin:
    cmd, *rest = line.split()
    if cmd == "import":
        r = show("import the pool", d.cuMemPoolImportFromShareableHandle(fd, FD, 0))
        pool = r[1]
        again = show("import the pool again", d.cuMemPoolImportFromShareableHandle(fd, FD, 0))
        print("same pool handle", int(again[1] or 0) == int(pool))
        attrs(pool, "imported pool")
        show("allocate from the imported pool", d.cuMemAllocFromPoolAsync(64, pool, stream))
        show("export the imported pool", d.cuMemPoolExportToShareableHandle(pool, FD, 0))
        bad = rest[0][:-2] + ("00" if rest[0][-2:] != "00" else "01")
        show("import a pointer of altered data", d.cuMemPoolImportPointer(pool, import_data(bad)))
        ptr = ok(d.cuMemPoolImportPointer(pool, import_data(rest[0])))
        print("imported pointer", hex(int(ptr)))
        ptr2 = ok(d.cuMemPoolImportPointer(pool, import_data(rest[0])))
        print("imported again", hex(int(ptr2)), "same" if int(ptr2) == int(ptr) else "different")
        ok(d.cuMemcpyDtoH(ctypes.addressof(host), ptr, 16)); print("reads", hex(host[0]))
        show("DEVICE_ORDINAL", d.cuPointerGetAttribute(
            d.CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr))
        show("export the imported pointer", d.cuMemPoolExportPointer(ptr))
        show("free the second import", d.cuMemFreeAsync(ptr2, stream))
        show("synchronize", d.cuStreamSynchronize(stream))
        show("read the first import after that", d.cuMemcpyDtoH(ctypes.addressof(host), ptr, 16))
        ptr = ok(d.cuMemPoolImportPointer(pool, import_data(rest[0])))
        print("imported a third time", hex(int(ptr)))
        ok(d.cuMemsetD32Async(ptr, 0x33333333, 4, stream)); ok(d.cuStreamSynchronize(stream))
        print("wrote 0x33333333")
    elif cmd == "read":
        r = show("read after the exporter freed and reused", d.cuMemcpyDtoH(
            ctypes.addressof(host), ptr, 16))
        if not int(r[0]):
            print("reads", hex(host[0]))
    elif cmd == "import-freed":
        show("import a freed allocation's export", d.cuMemPoolImportPointer(
            pool, import_data(rest[0])))
    elif cmd == "import-sync":
        w = ok(d.cuMemPoolImportPointer(pool, import_data(rest[0])))
        ok(d.cuMemsetD32Async(w, 0x44444444, 4, stream)); ok(d.cuStreamSynchronize(stream))
        print("wrote w")
    elif cmd == "read-w":
        r = show("read w after the pool was destroyed", d.cuMemcpyDtoH(
            ctypes.addressof(host), w, 16))
        show("cuMemFree of the import (synchronous)", d.cuMemFree(w))
        show("cuMemFree again", d.cuMemFree(w))
    elif cmd == "exit":
        show("free the import", d.cuMemFreeAsync(ptr, stream))
        show("synchronize", d.cuStreamSynchronize(stream))
        print("done", flush=True)
        break
    print("done", flush=True)
"""


def run(name: str, code: str) -> None:
    print(f"== {name}", flush=True)
    source = SETUP + textwrap.dedent(code)
    env_code = f"SETUP = {SETUP!r}\nIMPORTER = {IMPORTER!r}\n"
    proc = subprocess.run(
        [sys.executable, "-c", env_code + source], capture_output=True, text=True, timeout=240
    )
    print(proc.stdout.rstrip())
    if proc.returncode:
        print(f"EXIT {proc.returncode}: {proc.stderr[-600:]}")


for case, code in CASES.items():
    run(case, code)
run("IPC between two processes", EXPORTER)
