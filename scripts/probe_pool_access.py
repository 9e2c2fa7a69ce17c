"""Dev tool: what a GPU answers where the sim made a choice nobody measured yet (issue 23):
read-only access to a pool (CU_MEM_ACCESS_FLAGS_PROT_READ), the access of host and managed
pools (CUDA 13 pool locations), cuMemGetAddressRange of a pool allocation and of its import
in another process, and IPC events (a handle of an event without CU_EVENT_INTERPROCESS, one
opened in its own process). Raw cuda.bindings; each line prints the case and the driver's
answer, to compare with src/cuctx/_driver/sim/_peers.py, _pools.py, _ipc.py, _events.py.

    usage: python scripts/probe_pool_access.py            (on a machine with a GPU; the
           read-only access of a peer needs two)
"""

import ctypes
import os
import subprocess
import sys
import textwrap

from cuda.bindings import driver as d

F = d.CUmemAccess_flags
L = d.CUmemLocationType
FD = d.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR


def show(label, result):
    result = result if isinstance(result, tuple) else (result,)
    shown = [
        getattr(x, "name", x if isinstance(x, (int, str)) else type(x).__name__) for x in result
    ]
    print(f"{label}: {shown}")
    return result


def pool(location=L.CU_MEM_LOCATION_TYPE_DEVICE, kind="PINNED", handles=0, ordinal=0):
    props = d.CUmemPoolProps()
    props.allocType = getattr(d.CUmemAllocationType, f"CU_MEM_ALLOCATION_TYPE_{kind}")
    props.location.type = location
    props.location.id = ordinal
    props.handleTypes = handles
    return show(
        f"cuMemPoolCreate({location.name}, {kind}, handles {handles})", d.cuMemPoolCreate(props)
    )[-1]


def access(label, handle, device, flags=None):
    where = d.CUmemLocation()
    where.type, where.id = L.CU_MEM_LOCATION_TYPE_DEVICE, device
    if flags is not None:
        desc = d.CUmemAccessDesc()
        desc.location.type, desc.location.id, desc.flags = where.type, device, flags
        show(
            f"{label}: cuMemPoolSetAccess(device {device}, {flags.name})",
            d.cuMemPoolSetAccess(handle, [desc], 1),
        )
    show(f"{label}: cuMemPoolGetAccess(device {device})", d.cuMemPoolGetAccess(handle, where))


IMPORT = r"""
import ctypes, os, sys
from cuda.bindings import driver as d
d.cuInit(0); ctx = d.cuDevicePrimaryCtxRetain(d.cuDeviceGet(0)[1])[1]; d.cuCtxPushCurrent(ctx)
fd, raw = int(sys.argv[1]), bytes.fromhex(sys.argv[2])
FD = d.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
err, imported = d.cuMemPoolImportFromShareableHandle(fd, FD, 0)
data = d.CUmemPoolPtrExportData(); ctypes.memmove(data.getPtr(), raw, 64)
err, ptr = d.cuMemPoolImportPointer(imported, data)
print("imported pointer: cuMemGetAddressRange", d.cuMemGetAddressRange(ptr)[0].name,
      d.cuMemGetAddressRange(ptr)[2])
"""


def main() -> None:
    d.cuInit(0)
    count = d.cuDeviceGetCount()[1]
    ctx = d.cuDevicePrimaryCtxRetain(d.cuDeviceGet(0)[1])[1]
    d.cuCtxPushCurrent(ctx)
    print(f"driver {d.cuDriverGetVersion()[1]}, {count} device(s)")

    device_pool = pool(handles=FD)
    if count > 1:
        access("device pool", device_pool, 1, F.CU_MEM_ACCESS_FLAGS_PROT_READ)
    access("device pool", device_pool, 0, F.CU_MEM_ACCESS_FLAGS_PROT_NONE)  # the owner
    host_pool = pool(L.CU_MEM_LOCATION_TYPE_HOST)
    if host_pool is not None:
        access("host pool", host_pool, 0)
        access("host pool", host_pool, 0, F.CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
    pool(L.CU_MEM_LOCATION_TYPE_HOST, handles=FD)
    managed_pool = pool(kind="MANAGED")
    if managed_pool is not None:
        access("managed pool", managed_pool, 0)
        access("managed pool", managed_pool, count - 1, F.CU_MEM_ACCESS_FLAGS_PROT_NONE)

    stream = d.cuStreamCreate(1)[1]
    ptr = show("cuMemAllocFromPoolAsync(64)", d.cuMemAllocFromPoolAsync(64, device_pool, stream))[
        -1
    ]
    d.cuStreamSynchronize(stream)
    show("pool allocation of 64 bytes: cuMemGetAddressRange", d.cuMemGetAddressRange(ptr))
    fd = show(
        "cuMemPoolExportToShareableHandle", d.cuMemPoolExportToShareableHandle(device_pool, FD, 0)
    )[-1]
    data = show("cuMemPoolExportPointer", d.cuMemPoolExportPointer(ptr))[-1]
    raw = ctypes.string_at(data.getPtr(), 64).hex()
    subprocess.run(
        [sys.executable, "-c", textwrap.dedent(IMPORT), str(fd), raw], pass_fds=[fd], check=False
    )
    os.close(fd)

    plain = d.cuEventCreate(int(d.CUevent_flags.CU_EVENT_DISABLE_TIMING))[1]
    show("cuIpcGetEventHandle(event without CU_EVENT_INTERPROCESS)", d.cuIpcGetEventHandle(plain))
    flags = int(d.CUevent_flags.CU_EVENT_INTERPROCESS | d.CUevent_flags.CU_EVENT_DISABLE_TIMING)
    shared = d.cuEventCreate(flags)[1]
    handle = show("cuIpcGetEventHandle(ipc event)", d.cuIpcGetEventHandle(shared))[-1]
    show("cuIpcOpenEventHandle in the exporting process", d.cuIpcOpenEventHandle(handle))


if __name__ == "__main__":
    main()
