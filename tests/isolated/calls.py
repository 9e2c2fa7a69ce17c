"""What the tests of cuctx.IsolatedExecutor run in workers (importable there: the worker gets
the caller's sys.path), and a kernel that faults on both backends."""

from __future__ import annotations

import os
import signal
import sys
import time

import numpy as np

import cuctx
import cuctx.sim

# A kernel that stores one int at the address it is given: address 0 is an illegal address
# on a GPU, and its sim twin's view of it is one too. PTX: the driver needs no compiler.
STORE_PTX = b"""
.version 8.0
.target sm_70
.address_size 64
.visible .entry store(.param .u64 p)
{
    .reg .b64 %rd<2>;
    .reg .b32 %r<2>;
    ld.param.u64 %rd1, [p];
    mov.u32 %r1, 1;
    st.global.u32 [%rd1], %r1;
    ret;
}
"""


def store(grid, block, p):
    """The sim twin of STORE_PTX's `store`."""
    p.view(np.int32, 1)[0] = 1


def where() -> tuple[int, int]:
    """(this process's id, the ordinal of the current device)."""
    return os.getpid(), cuctx.current_device().ordinal


def square(x: int) -> int:
    return x * x


def raise_value_error(text: str) -> None:
    raise ValueError(text)


def store_to(address: int) -> str:
    """Launch `store` at ``address`` on the current stream and return: a fault (address 0)
    happens asynchronously, after the call's own code has finished."""
    library = cuctx.Library.from_bytes(STORE_PTX, sim_kernels={"store": store})
    library["store"][1, 1](address)
    return "launched"


def inject_fault() -> None:
    """On the sim: the current context faults at its next work (the worker's synchronize)."""
    cuctx.sim.inject_fault(cuctx.current_context())


def fault_and_catch() -> str:
    """Meet the fault, catch it and return as if all was well."""
    try:
        store_to(0)
        cuctx.synchronize()
    except cuctx.StickyFaultError:
        pass
    return "caught"


def fault_in_own_context() -> None:
    """Fault in a context the call creates, left alive for the worker's synchronize."""
    global KEPT
    KEPT = cuctx.Context.create(cuctx.current_device())
    cuctx.sim.inject_fault(KEPT)
    cuctx.Context.pop()


def exit_with(status: int) -> None:
    os._exit(status)


def sys_exit(status) -> None:
    sys.exit(status)


def interrupt() -> None:
    raise KeyboardInterrupt


class Stop(BaseException):
    """An exception that is not an Exception (as asyncio.CancelledError is not)."""


def raise_stop() -> None:
    raise Stop("stopped")


def kill_self() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def sleep(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def sleep_then_where(seconds: float) -> tuple[int, int]:
    time.sleep(seconds)
    return where()


def count_then(path: str, then) -> None:
    """Append a line to ``path`` (how many times the call ran), then call ``then``."""
    with open(path, "a") as f:
        f.write("ran\n")
    then()


def device_array() -> cuctx.DeviceArray:
    return cuctx.zeros(4)


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def children(pid: int) -> list[tuple[int, str]]:
    """(pid, state) of the processes whose parent is ``pid`` (Linux /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append((int(entry), fields[0]))
    return found


def started_at(pid: int) -> int:
    """When process ``pid`` started, in clock ticks since boot (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[19])


def fill(array: cuctx.DeviceArray, value: float) -> None:
    array.fill(value)


def add_one(array: cuctx.DeviceArray) -> tuple[int, ...]:
    """Add 1 to a caller's array in place (through the host: no compiler needed)."""
    array.copy_from(array.to_host() + 1)
    return array.shape


def write_then_fault(array: cuctx.DeviceArray, value: float) -> None:
    """Write ``value`` into the caller's array (completed), then fault."""
    array.fill(value)
    cuctx.synchronize()
    cuctx.sim.inject_fault(cuctx.current_context())


def imported_pools() -> list[str]:
    """The keys of the caller's ipc pools this worker has imported."""
    from cuctx.isolated import _worker

    return sorted(_worker._pools)
