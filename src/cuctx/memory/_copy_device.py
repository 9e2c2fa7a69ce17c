"""Copies between two device arrays (`cuctx.copy`'s device-to-device direction): within a
device, between contexts of a device, between devices, and with host pools' arrays.

Within a device the copy is `_copy`'s plan issued on one stream, staged through a device
temporary where the two arrays' memory overlaps, or through a host temporary where the layouts
disagree. Between devices it is cuMemcpyPeerAsync of C-contiguous buffers (no peer access
needed), a non-contiguous side staged on its own device; while its stream is captured (CUDA
cannot capture cuMemcpyPeerAsync) it is the copy within a device, of device pointers, which
needs peer access. With a host pool's array (host memory) it is a copy made by the other side's
device. Kept apart from `_copy` (planning, issuing, host copies, fills), which it builds on:
what it adds is which stream and which device make a copy between two contexts.
"""

from __future__ import annotations

from .. import _lifetimes, _record, _trace
from .._calls import fail
from ..stream import Stream, resolve_stream
from . import _alloc
from ._alloc import allocate, in_host_pool
from ._copy import _checked, _dense_host, _host_copy, _issue, _layouts, _unified, announce_copy


def _either_stream(stream, dst, src, operation: str) -> Stream:
    """The stream of a copy between contexts: ``stream`` if it is of src's context, else
    ``stream`` (or the current stream) of dst's."""
    if stream is not None:
        given = resolve_stream(stream)
        if given._ctx is src._ctx:
            return given
    return resolve_stream(stream, dst._ctx, operation)


def copy_device(dst, src, stream) -> None:
    dst._check("cuctx.copy")
    src._check("cuctx.copy")
    if dst._ctx._backend is not src._ctx._backend:
        raise ValueError("cuctx.copy: the arrays belong to different backends")
    layouts = _checked(dst, src, True, True)
    if not layouts.size:
        return
    if (
        _alloc.host_pools
        and dst._ctx._device is not src._ctx._device
        and _unified(dst, src, True, True)
    ):
        stream = _host_pool_stream(stream, dst, src)
    elif dst._ctx._device is not src._ctx._device:
        if _record.threads:  # an autograph call enqueues what it recorded, and stops
            _record.interrupt("cuctx.copy between devices")
        stream = _either_stream(stream, dst, src, "cuctx.copy (between devices)")
        if not (_lifetimes.capturing and stream.is_capturing):
            return _copy_peer(dst, src, stream)
        # cuMemcpyPeerAsync is not capturable: in a graph the copy is the device-to-device
        # copy below, made by the capturing stream's device, which must reach the other one.
        _check_graph_peer_access(stream, dst, src)
    else:
        # One device, one context or two: under unified addressing every context of a device
        # can use the memory of the others (docs/memory.md, "Contexts").
        stream = _either_stream(stream, dst, src, "cuctx.copy")
    (d_lo, d_hi), (s_lo, s_hi) = layouts.dst_span, layouts.src_span
    if dst.ptr + d_lo < src.ptr + s_hi and src.ptr + s_lo < dst.ptr + d_hi:
        # Overlapping memory: a copy's order of reads and writes is undefined; stage.
        staged = _dense_device(src, stream)
        copy_device(staged, src, stream)
        src = staged
        layouts = _layouts(dst, src, True, True)
    if layouts.staged:  # the layouts disagree: NumPy reorders on the host
        host = _dense_host(src)
        _host_copy(src, host, stream, to_device=False)
        _host_copy(dst, host, stream, to_device=True)
        return
    _issue(stream, layouts.plan, dst, src, True, True, dst.ptr, src.ptr)


def _host_pool_stream(stream, dst, src) -> Stream:
    """The stream of a copy between devices with a side in a host pool (host memory): a
    copy to or from the other side's device, on a stream of that side's context (the driver
    checks device memory against the current context); between two host pools' arrays, as
    between devices."""
    if in_host_pool(dst) and in_host_pool(src):
        return _either_stream(stream, dst, src, "cuctx.copy")
    device_side = src if in_host_pool(dst) else dst
    return resolve_stream(
        stream,
        device_side._ctx,
        "cuctx.copy (of host memory of a host pool, made by the other side's device)",
    )


def _check_graph_peer_access(run: Stream, dst, src) -> None:
    """Raise unless ``run``'s device has peer access (cuctx's: its pool grant included) to
    the device of the other side of a copy between devices that ``run`` captures."""
    here = run._ctx._device
    other = src._ctx._device if dst._ctx._device is here else dst._ctx._device
    if other not in here._peers:
        raise ValueError(
            f"cuctx.copy from device {src.device.ordinal} to device {dst.device.ordinal} "
            f"captured on {run!r}: CUDA cannot capture cuMemcpyPeerAsync, and the copy a graph "
            f"holds is made by device {here.ordinal}, which needs peer access to device "
            f"{other.ordinal}: call cuctx.Device({here.ordinal}).enable_peer_access("
            f"{other.ordinal}) before the capture, or copy outside it"
        )


def _copy_peer(dst, src, run: Stream) -> None:
    """Between devices, on ``run`` (of either side's context): cuMemcpyPeerAsync (no peer
    access needed) of C-contiguous buffers; a side that is not is staged through a
    contiguous array on its own device."""
    source, target = src, dst
    if not ((src._c and dst._c) or (src._f and dst._f)):
        if not src._c:
            near = run if run._ctx is src._ctx else resolve_stream(None, src._ctx, "cuctx.copy")
            source = src.copy(near)
            if near is not run:
                run.wait(near)
                source.record_stream(run)
        if not dst._c:
            near = run if run._ctx is dst._ctx else resolve_stream(None, dst._ctx, "cuctx.copy")
            target = _dense_device(dst, near)
            if near is not run:
                target.record_stream(run)
    (err,) = run._call(
        run._backend.driver.cuMemcpyPeerAsync,
        target.ptr,
        target._ctx._handle,
        source.ptr,
        source._ctx._handle,
        target.nbytes,
        run._handle,
    )
    if err:
        fail(run._backend, err, "cuMemcpyPeerAsync", run._ctx)
    if _trace.sinks:
        announce_copy(run, target, source, True, True)
    if target is not dst:
        near = target._alloc.stream
        if near is not run:
            near.wait(run)
        copy_device(dst, target, near)


def _dense_device(like, stream: Stream):
    """A new C-contiguous device array shaped like the non-empty ``like``, on ``stream``."""
    alloc = allocate(like.nbytes, stream)
    return type(like)._make(stream._ctx, alloc.ptr, like.shape, like.dtype, None, alloc)
