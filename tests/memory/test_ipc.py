"""Arrays of an ``ipc=True`` pool shared with another process (spawned, as CUDA needs): the
pool's descriptor goes over a Unix socket, an array's description by pickle, and the other
process's writes are what this one reads, on both backends (the sim's IPC pool is shared
memory that the other process's sim maps). Imports are cached per allocation and freed once;
an empty array shares too; a descriptor claiming more than the allocation it names holds is
refused there; arrays of any other memory refuse to be shared, naming MemoryPool(device,
ipc=True); nothing leaks on either side."""

from __future__ import annotations

import gc
import multiprocessing
import os
import pickle
import re
import tempfile
from multiprocessing.reduction import recv_handle, send_handle

import numpy as np
import pytest

import cuctx
from cuctx import Device, MemoryPool

SPAWN = multiprocessing.get_context("spawn")  # fork breaks CUDA


def _worker(conn, backend: str) -> None:
    """The other process: import the pool and the array, check what it sees, write, report."""
    report = {}
    try:
        cuctx.set_backend(backend)
        fd = recv_handle(conn)
        key, desc, whole, empty = conn.recv()
        with Device(0):
            pool = MemoryPool._import(Device(0), fd, key)
            os.close(fd)  # the caller's to close; the pool keeps what it needs
            unused = os.open(os.devnull, os.O_RDONLY)  # a known key does not read its fd
            report["same pool again"] = MemoryPool._import(0, unused, key) is pool
            os.close(unused)
            view = pool._import_array(desc)
            again = pool._import_array(desc)
            report["one import"] = view.ptr == again.ptr and view._alloc is again._alloc
            report["read"] = view.to_host().tolist()
            view.copy_from(np.arange(100, 100 + view.size, dtype=view.dtype))
            del again
            gc.collect()
            report["after dropping one"] = view.to_host().tolist()  # still mapped
            report.update(_refusals(pool, view))
            report.update(_forgeries(pool, desc, whole))
            nothing = pool._import_array(empty)
            report["empty"] = (nothing.shape, nothing.ptr, nothing.pool is pool)
            del view
            gc.collect()  # the import is freed, and its stream synchronized
            report["imports left"] = len(pool._imports)
    except BaseException as exc:  # noqa: BLE001 - the parent reports it
        report["error"] = f"{type(exc).__name__}: {exc}"
    conn.send(report)


def _refusals(pool: MemoryPool, view: cuctx.DeviceArray) -> dict[str, str]:
    """What an imported pool and array refuse, in words."""
    found = {}
    for name, call in [
        ("allocate", lambda: cuctx.empty(4, pool=pool)),
        ("used", lambda: pool.used),
        ("share", pool._share),
        ("describe", view._ipc_descriptor),
    ]:
        try:
            call()
        except (TypeError, ValueError) as exc:
            found[name] = f"{type(exc).__name__}: {exc}"
    return found


def _forgeries(pool: MemoryPool, desc, whole) -> dict[str, str]:
    """Descriptors altered to reach past the 64-byte allocation they name, refused."""
    found = {}
    for name, forged in [
        ("claims more", whole._replace(nbytes=6400, shape=(1600,))),
        ("past the end", desc._replace(shape=(100,))),
        ("before the start", desc._replace(strides=(-4,))),
    ]:
        try:
            pool._import_array(forged)
        except ValueError as exc:
            found[name] = str(exc)
    return found


@pytest.fixture
def device(backend):
    with Device(0):
        yield Device(0)
    gc.collect()
    cuctx.synchronize()


@pytest.mark.device_memory
def test_another_process_writes_what_this_one_reads(device, backend):
    before = device.mem_info().free
    pool = MemoryPool(device, ipc=True)
    arr = cuctx.to_device(np.arange(16, dtype=np.int32), pool=pool)
    cuctx.synchronize()  # the other process must not read before the copy ran
    ours, theirs = SPAWN.Pipe()
    worker = SPAWN.Process(target=_worker, args=(theirs, backend.name))
    worker.start()
    try:
        with pool._share() as shared:
            send_handle(ours, shared.fd, worker.pid)  # SCM_RIGHTS over the Unix socket
        ours.send(
            (
                shared.key,
                arr[4:12]._ipc_descriptor(),
                arr._ipc_descriptor(),
                cuctx.empty((0, 2), np.int32, pool=pool)._ipc_descriptor(),
            )
        )
        assert ours.poll(120), "the worker did not answer"
        report = ours.recv()
    finally:
        worker.join(60)
        if worker.is_alive():
            worker.kill()
    assert "error" not in report, report["error"]
    assert worker.exitcode == 0
    assert report["same pool again"] and report["one import"]
    assert report["read"] == list(range(4, 12))
    assert report["after dropping one"] == list(range(100, 108))
    assert arr.to_host().tolist() == [0, 1, 2, 3, *range(100, 108), 12, 13, 14, 15]
    assert report["allocate"].startswith("ValueError") and "cannot allocate" in report["allocate"]
    assert report["used"].startswith("ValueError")
    assert report["share"].startswith("TypeError")
    assert report["describe"].startswith("TypeError")
    held = re.search(r"the allocation it names holds (\d+) bytes", report["claims more"])
    assert held and 64 <= int(held[1]) < 6400  # (the sim: its 512-byte block)
    assert "claims bytes [16, 416)" in report["past the end"]
    assert "claims bytes [-12, 20)" in report["before the start"]
    assert report["empty"] == ((0, 2), 0, True)
    assert report["imports left"] == 0
    del arr
    gc.collect()
    cuctx.synchronize()
    assert (pool.used, pool.reserved) == (0, 0)
    del pool
    gc.collect()
    assert device.mem_info().free == before


def test_a_descriptor_is_small_cached_and_picklable(device):
    pool = MemoryPool(device, ipc=True)
    arr = cuctx.zeros((4, 8), np.float32, pool=pool)
    desc = arr._ipc_descriptor()
    assert arr._ipc_descriptor() == desc  # one export per allocation
    col = arr[:, 2]._ipc_descriptor()
    assert (col.token, col.data) == (desc.token, desc.data)
    assert (col.offset, col.shape, col.strides) == (8, (4,), (32,))
    assert pickle.loads(pickle.dumps(desc)) == desc and len(pickle.dumps(desc)) < 400
    other = cuctx.zeros(4, pool=pool)._ipc_descriptor()
    assert other.token != desc.token and other.key == desc.key
    empty = cuctx.empty((3, 0), np.float32, pool=pool)
    assert empty.pool is pool  # an empty array has no memory, but its pool
    nothing = empty._ipc_descriptor()
    assert (nothing.token, nothing.data, nothing.nbytes, nothing.shape) == (0, b"", 0, (3, 0))


def test_memory_of_any_other_kind_refuses_to_be_shared(device):
    plain = cuctx.zeros(4, pool=MemoryPool(device))
    default = cuctx.zeros(4)
    managed = cuctx.managed_empty(4)

    class Foreign:
        __cuda_array_interface__ = default.__cuda_array_interface__

    foreign = cuctx.asarray(Foreign())
    for arr, what in [
        (plain, "memory of <MemoryPool 0x"),
        (default, "default pool"),
        (managed, "managed memory"),
        (foreign, "another library"),
    ]:
        with pytest.raises(
            TypeError, match=r"allocate it from a MemoryPool\(device, ipc=True\)"
        ) as info:
            arr._ipc_descriptor()
        assert what in str(info.value)
    with pytest.raises(TypeError, match=r"MemoryPool\(device, ipc=True\)"):
        MemoryPool(device)._share()


def test_a_shared_pool_closes_its_descriptor_and_is_not_pickled(device):
    shared = MemoryPool(device, ipc=True)._share()
    fd = shared.fd
    os.fstat(fd)  # open
    with pytest.raises(TypeError, match="Unix socket"):
        pickle.dumps(shared)
    shared.close()
    shared.close()  # once is enough; twice is harmless
    with pytest.raises(OSError):
        os.fstat(fd)
    assert "closed" in repr(shared)


def test_an_import_in_the_exporting_process_refuses_what_the_driver_refuses(device):
    pool = MemoryPool(device, ipc=True)
    desc = cuctx.zeros(4, pool=pool)._ipc_descriptor()
    with pytest.raises(ValueError, match="names another pool"):
        pool._import_array(desc)  # the exporting pool itself
    with pool._share() as shared:
        imported = MemoryPool._import(device, shared.fd, shared.key)  # the driver allows it
    assert imported is not pool and imported.ipc
    with pytest.raises(ValueError, match="a pool of this very process: use the array itself"):
        imported._import_array(desc)
    with pytest.raises(ValueError, match="names another pool"):
        imported._import_array(desc._replace(key="another"))


def test_bad_imports_are_refused(device):
    with pytest.raises(TypeError, match="fd must be an open file descriptor"):
        MemoryPool._import(device, "3", "key")
    with pytest.raises(TypeError, match="key must be the SharedPool's key"):
        MemoryPool._import(device, 3, 42)
    with tempfile.TemporaryFile() as not_a_pool:
        with pytest.raises(cuctx.CudaError, match="not a pool another process shared"):
            MemoryPool._import(device, not_a_pool.fileno(), "key")
    pool = MemoryPool(device, ipc=True)
    with pool._share() as shared:
        imported = MemoryPool._import(device, shared.fd, shared.key)
    with pytest.raises(TypeError, match="takes an IpcDescriptor"):
        imported._import_array(("key", 1))
