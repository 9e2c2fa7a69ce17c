"""Dev tool: does a memory pool outlive the contexts of its device (issue 21, the pool crash)?
Each case runs in a child process (a crash there ends only it) and prints how the child
ended: the pool made while the primary context was retained, an allocation from it freed,
then the pool destroyed with the context alive, after the primary context was released (no
context left on the device), or after a new primary context replaced it; with and without an
IPC export of the pool. Raw cuda.bindings.

    usage: python scripts/probe_pool_lifetime.py       (on a machine with a GPU)
"""

import subprocess
import sys
import textwrap

CHILD = textwrap.dedent("""
    import os, sys
    from cuda.bindings import driver as d
    case, export = sys.argv[1], sys.argv[2] == "export"
    def ok(result):
        err = result[0] if isinstance(result, tuple) else result
        assert err == d.CUresult.CUDA_SUCCESS, (case, err)
        return result[1] if isinstance(result, tuple) and len(result) > 1 else None
    ok(d.cuInit(0))
    dev = ok(d.cuDeviceGet(0))
    ctx = ok(d.cuDevicePrimaryCtxRetain(dev))
    ok(d.cuCtxPushCurrent(ctx))
    props = d.CUmemPoolProps()
    props.allocType = d.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    props.location.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    props.location.id = 0
    fd_type = d.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
    props.handleTypes = fd_type if export else 0
    pool = ok(d.cuMemPoolCreate(props))
    if export:
        fd = ok(d.cuMemPoolExportToShareableHandle(pool, fd_type, 0))
    stream = ok(d.cuStreamCreate(1))
    ptr = ok(d.cuMemAllocFromPoolAsync(1 << 20, pool, stream))
    ok(d.cuMemFreeAsync(ptr, stream))
    ok(d.cuStreamSynchronize(stream))
    ok(d.cuStreamDestroy(stream))
    ok(d.cuCtxPopCurrent())
    if case != "alive":
        ok(d.cuDevicePrimaryCtxRelease(dev))  # the last retain: the context is destroyed
    if case == "new-context":
        ok(d.cuDevicePrimaryCtxRetain(dev))
    print(case, "export" if export else "plain", "destroy:", d.cuMemPoolDestroy(pool)[0].name,
          flush=True)
    if export:
        os.close(fd)
""")


def main() -> None:
    for case in ("alive", "no-context", "new-context"):
        for export in ("plain", "export"):
            for attempt in range(3):  # a crash may not come every time
                proc = subprocess.run([sys.executable, "-c", CHILD, case, export],
                                      capture_output=True, text=True, timeout=60)
                how = f"exit {proc.returncode}" if proc.returncode >= 0 else \
                    f"signal {-proc.returncode}"
                print(f"{case:12} {export:7} try {attempt}: {how}; "
                      f"{(proc.stdout + proc.stderr).strip()[-200:]}", flush=True)


if __name__ == "__main__":
    main()
