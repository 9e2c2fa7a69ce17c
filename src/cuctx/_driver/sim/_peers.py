"""Peer access of the sim: which devices may use each other's memory.

Two grants exist, as on the real driver. cuCtxEnablePeerAccess lets the current context use
the allocations of a peer context (memory from cuMemAlloc); it is per context pair and ends
when either context is destroyed or reset. Memory from a memory pool (cuMemAllocAsync) is
not covered by it: each pool (`_pools`) has an access list (cuMemPoolSetAccess /
cuMemPoolGetAccess), in which the owning device always has read-write access.

The sim's devices are NVLink-connected H100s: each can access every other one; no device
is its own peer (cuDeviceCanAccessPeer(d, d) is 0, and enabling access to a context of the
same device answers CUDA_ERROR_PEER_ACCESS_UNSUPPORTED, as recorded on a real H100).

Kernels are held to the grants (`_reach`, asked by `_library._kernel_view` for every view a
twin makes): memory of another device is an illegal address for a kernel without them, as
it is unmapped on a GPU. Read-only access (CU_MEM_ACCESS_FLAGS_PROT_READ) is refused for
a pool with CUDA_ERROR_NOT_SUPPORTED, and lowering the owning device's access with
CUDA_ERROR_INVALID_DEVICE (both measured: two H200s and an H100, driver 580). A host pool's
memory belongs to no device: every device needs a grant (the CUDA
13 documentation: its default accessibility is from the host only). Copies between devices
need neither with cuMemcpyPeerAsync, which names both contexts; a copy of device pointers
(cuMemcpyDtoDAsync, 2D, 3D) needs the current context to reach both sides
(`_memory._copy_context`, `_may_reach`).
"""

from __future__ import annotations

from cuda.bindings.driver import CUmemAccess_flags, CUmemLocationType

from ._common import (
    CONTEXT_IS_DESTROYED,
    INVALID_CONTEXT,
    INVALID_DEVICE,
    INVALID_VALUE,
    NOT_INITIALIZED,
    NOT_SUPPORTED,
    OK,
    PEER_ACCESS_ALREADY_ENABLED,
    PEER_ACCESS_NOT_ENABLED,
    PEER_ACCESS_UNSUPPORTED,
)

NONE = CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_NONE
READ = CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READ
READWRITE = CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
_GRANTS = {READWRITE: "rw"}
_DEVICE = CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE


class PeerModel:
    """cuDeviceCanAccessPeer, cuCtxEnablePeerAccess/DisablePeerAccess,
    cuMemPoolSetAccess/GetAccess (of the pools of `_pools`)."""

    def _init_peers(self):
        self._peer_access: set[tuple[int, int]] = set()  # (context, peer context) handles

    def cuDeviceCanAccessPeer(self, dev, peerDev):
        if not self._initialized:
            return (NOT_INITIALIZED, None)
        if self._device(dev) is None or self._device(peerDev) is None:
            return (INVALID_DEVICE, None)
        return (OK, int(int(dev) != int(peerDev)))

    # -- context peer access ----------------------------------------------------------------

    def _peer_context(self, peerContext):
        """(error, the current context, the peer context) for the two calls below."""
        err, ctx = self._work_context()
        if err:
            return err, None, None
        peer = self._lookup(peerContext)
        if peer is None:
            return INVALID_CONTEXT, None, None
        if peer.destroyed:
            return CONTEXT_IS_DESTROYED, None, None
        if not peer.active:  # a primary context nobody retains
            return INVALID_CONTEXT, None, None
        return OK, ctx, peer

    def cuCtxEnablePeerAccess(self, peerContext, Flags):
        err, ctx, peer = self._peer_context(peerContext)
        if err:
            return (err,)
        if int(Flags) != 0:
            return (INVALID_VALUE,)
        if not self.cuDeviceCanAccessPeer(ctx.device, peer.device)[1]:
            return (PEER_ACCESS_UNSUPPORTED,)
        with self._lock:
            if (ctx.handle, peer.handle) in self._peer_access:
                return (PEER_ACCESS_ALREADY_ENABLED,)
            self._peer_access.add((ctx.handle, peer.handle))
        return (OK,)

    def cuCtxDisablePeerAccess(self, peerContext):
        err, ctx, peer = self._peer_context(peerContext)
        if err:
            return (err,)
        with self._lock:
            if (ctx.handle, peer.handle) not in self._peer_access:
                return (PEER_ACCESS_NOT_ENABLED,)
            self._peer_access.discard((ctx.handle, peer.handle))
        return (OK,)

    def _reach(self, ctx, block) -> str | None:
        """What a kernel running in ``ctx`` may do with ``block``: "rw" or None.
        A host pool's block (`_pools`): what its access list grants ``ctx``'s device (the
        host's memory: no device has access by right). Memory of its own device: "rw" (any
        context of it). A pool's block of another device: what that pool's access list
        grants. Any other block of another device (cuMemAlloc, a library's variables): "rw"
        with peer access from ``ctx`` to the block's context. Graph allocations carry their
        own access list, which the sim does not model: they are let through."""
        pool = block.pool
        if block.graph is not None:
            return "rw"
        if pool is not None and pool.location == "host":
            return _GRANTS.get(pool.access.get(ctx.device))
        if block.device == ctx.device:
            return "rw"
        if pool is not None:  # the default pool's or an explicit one's access list
            return _GRANTS.get(pool.access.get(ctx.device))
        return "rw" if (ctx.handle, block.ctx.handle) in self._peer_access else None

    def _may_reach(self, ctx, block) -> bool:
        """Whether a copy checked against ``ctx`` (`_memory._copy_context`) may use ``block``."""
        return self._reach(ctx, block) == "rw"

    def _release_context_resources(self, ctx):
        with self._lock:
            self._peer_access = {pair for pair in self._peer_access if ctx.handle not in pair}
        super()._release_context_resources(ctx)

    # -- pool access -------------------------------------------------------------------

    def cuMemPoolSetAccess(self, pool, map, count):  # noqa: A002 - the driver's parameter name
        found = self._pool(pool)
        if found is None or count < 0 or count > len(map or ()):
            return (INVALID_VALUE,)
        # -1: a host pool, whose memory no device owns; a managed pool's access list is
        # recorded for every device alike (an H100, driver 580: device 0 of a pool located
        # on device 0 reads PROT_NONE, and setting it is answered CUDA_SUCCESS)
        owner = -1 if found.location == "managed" else found.device
        changes = {}
        for desc in list(map or ())[:count]:  # all checked before any is applied
            if desc.location.type != _DEVICE or desc.flags not in (READWRITE, READ, NONE):
                return (INVALID_VALUE,)
            if desc.flags == READ:
                return (NOT_SUPPORTED,)
            device = desc.location.id
            if self._device(device) is None:
                return (INVALID_DEVICE,)
            if device == owner:
                if desc.flags != READWRITE:  # the owner's access cannot be lowered
                    return (INVALID_DEVICE,)
                continue
            if owner >= 0 and not self.cuDeviceCanAccessPeer(device, owner)[1]:
                return (INVALID_DEVICE,)
            changes[device] = desc.flags
        with self._lock:
            found.access.update(changes)
        return (OK,)

    def cuMemPoolGetAccess(self, memPool, location):
        found = self._pool(memPool)
        if found is None or location is None or location.type != _DEVICE:
            return (INVALID_VALUE, None)
        if self._device(location.id) is None:
            return (INVALID_DEVICE, None)
        if location.id == found.device and found.location != "managed":
            return (OK, READWRITE)
        return (OK, found.access.get(location.id, NONE))
