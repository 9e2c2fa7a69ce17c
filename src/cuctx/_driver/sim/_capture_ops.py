"""What work enqueued on a capturing stream becomes: graph nodes of the capture's graph, made
with the same checks and works as explicit graphs' nodes (`_graph_nodes`), so a captured
graph and an explicit one behave and update alike.

launches -> kernel nodes; asynchronous copies -> memcpy nodes (pageable host memory too: the
H100 captures such a copy, which then reads or writes that memory at every launch); memsets
-> memset nodes; host functions -> host nodes; cuMemAllocAsync / cuMemFreeAsync -> memory
alloc / free nodes (a free must be of a graph allocation); cuEventRecord / cuStreamWaitEvent
-> dependencies (see `_capture`), no nodes. cuGraphLaunch and cuGraphUpload onto a
capturing stream are CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and invalidate the capture (H100),
as do cuMemcpyPeerAsync (a copy between devices is captured as a device to device copy
instead) and any other work reaching the engine on a capturing stream (the sim has no node
for it). Empty work (a zero size) adds no node.

cuGraphInstantiate is one of the "potentially unsafe" calls (`CaptureModel._refuse_unsafe`):
while the calling thread captures in thread-local or global mode, or another thread in
global mode, it is CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and invalidates those captures (an
H100 answers so in a thread-local capture; global mode is the stricter one, and a relaxed
capture allows it, by the CUDA programming guide's rules for such calls).
"""

from __future__ import annotations

from cuda.bindings.driver import (
    CUDA_MEMCPY2D,
    CUDA_MEMCPY3D,
    CUDA_MEMSET_NODE_PARAMS,
    CUcontext,
    CUdeviceptr,
    CUmemorytype,
)

from ._cargs import size_t, unsigned
from ._common import (
    CAPTURE_ISOLATION,
    CAPTURE_MERGE,
    CAPTURE_UNSUPPORTED,
    INVALID_HANDLE,
    INVALID_VALUE,
    NOT_SUPPORTED,
    OK,
)
from ._graph_nodes import HostWork, KernelWork, copy_work, memset_work

HOST, DEVICE = CUmemorytype.CU_MEMORYTYPE_HOST, CUmemorytype.CU_MEMORYTYPE_DEVICE
UNIFIED = CUmemorytype.CU_MEMORYTYPE_UNIFIED
EVENT_WAIT_EXTERNAL = 1
_2D_FIELDS = (
    "srcXInBytes",
    "srcY",
    "srcMemoryType",
    "srcHost",
    "srcDevice",
    "srcArray",
    "srcPitch",
    "dstXInBytes",
    "dstY",
    "dstMemoryType",
    "dstHost",
    "dstDevice",
    "dstArray",
    "dstPitch",
    "WidthInBytes",
    "Height",
)


class CaptureOps:
    """The enqueueing driver functions, turned into nodes while their stream captures."""

    def _capture_node(self, hStream, make, otherwise):
        """``otherwise()`` when ``hStream`` does not capture; else add ``make(stream)``'s work
        (a (CUresult, work or None) pair) to the capture; returns the call's 1-tuple."""
        if not self._captures:
            return otherwise()
        with self._lock:
            err, stream, capture = self._capture_of(hStream)
            if err:
                return (err,)
            if capture is None:
                return otherwise()
            err, work = make(stream)
            if err == CAPTURE_UNSUPPORTED:
                capture.invalid = True
            if not err and work is not None:
                self._add_captured(capture, stream, work)
            return (err,)

    def _enqueue(self, hStream, op, **how):
        if self._captures:
            err, _, capture = self._capture_of(hStream)
            if err or capture is not None:
                if capture is not None:
                    capture.invalid = True
                return err or CAPTURE_UNSUPPORTED
        return super()._enqueue(hStream, op, **how)

    # -- kernels, host functions, graphs ---------------------------------------------------

    def _launch(self, f, grid, block, shared, hStream, kernelParams, extra, cluster, cooperative):
        def make(stream):
            kernel = self._kernel(f)
            if kernel is None:
                return INVALID_HANDLE, None
            err, launch = self._prepared_launch(
                kernel, stream.ctx, grid, block, shared, kernelParams, extra, cluster, cooperative
            )
            return err, (KernelWork(launch) if not err else None)

        return self._capture_node(
            hStream,
            make,
            lambda: (
                super(CaptureOps, self)._launch(
                    f, grid, block, shared, hStream, kernelParams, extra, cluster, cooperative
                ),
            ),
        )[0]

    def cuLaunchHostFunc(self, hStream, fn, userData):
        def make(stream):
            if not int(fn or 0):
                return INVALID_VALUE, None
            return OK, HostWork(int(fn), int(userData or 0))

        return self._capture_node(
            hStream, make, lambda: super(CaptureOps, self).cuLaunchHostFunc(hStream, fn, userData)
        )

    def _no_graph_node(self, hGraphExec):
        """The ``make`` of a launch or upload of an executable onto a capturing stream: no
        node, CAPTURE_UNSUPPORTED (the capture is invalidated)."""

        def make(stream):
            exe = self._graph_exec(hGraphExec)
            return (INVALID_VALUE if exe is None else CAPTURE_UNSUPPORTED), None

        return make

    def cuGraphLaunch(self, hGraphExec, hStream):
        return self._capture_node(
            hStream,
            self._no_graph_node(hGraphExec),
            lambda: super(CaptureOps, self).cuGraphLaunch(hGraphExec, hStream),
        )

    def cuGraphUpload(self, hGraphExec, hStream):
        return self._capture_node(
            hStream,
            self._no_graph_node(hGraphExec),
            lambda: super(CaptureOps, self).cuGraphUpload(hGraphExec, hStream),
        )

    def cuGraphInstantiate(self, hGraph, flags):
        if self._captures:
            with self._lock:
                err = self._refuse_unsafe()
            if err:
                return (err, None)
        return super().cuGraphInstantiate(hGraph, flags)

    # -- copies and memsets -----------------------------------------------------------------

    def _linear_copy(self, stream, dst_kind, dst: int, src_kind, src: int, n: int):
        """(CUresult, CopyWork) for a 1D copy of ``n`` bytes in a capture."""
        if n == 0:
            return OK, None
        copy = CUDA_MEMCPY3D()
        copy.srcMemoryType, copy.dstMemoryType = src_kind, dst_kind
        for prefix, kind, address in (("src", src_kind, src), ("dst", dst_kind, dst)):
            setattr(copy, prefix + ("Host" if kind == HOST else "Device"), address)
            setattr(copy, prefix + "Pitch", n)
        copy.WidthInBytes, copy.Height, copy.Depth = n, 1, 1
        return self._captured_copy(stream, copy)

    def _captured_copy(self, stream, copy):
        for prefix in ("src", "dst"):
            try:
                getattr(copy, prefix + "MemoryType")
            except ValueError:
                return INVALID_VALUE, None
        return copy_work(self, copy, CUcontext(stream.ctx.handle), self._copy_context(stream.ctx))

    def cuMemcpyHtoDAsync(self, dstDevice, srcHost, ByteCount, hStream):
        n = size_t(ByteCount)
        return self._capture_node(
            hStream,
            lambda s: self._linear_copy(s, DEVICE, int(dstDevice), HOST, int(srcHost), n),
            lambda: super(CaptureOps, self).cuMemcpyHtoDAsync(dstDevice, srcHost, n, hStream),
        )

    def cuMemcpyDtoHAsync(self, dstHost, srcDevice, ByteCount, hStream):
        n = size_t(ByteCount)
        return self._capture_node(
            hStream,
            lambda s: self._linear_copy(s, HOST, int(dstHost), DEVICE, int(srcDevice), n),
            lambda: super(CaptureOps, self).cuMemcpyDtoHAsync(dstHost, srcDevice, n, hStream),
        )

    def cuMemcpyDtoDAsync(self, dstDevice, srcDevice, ByteCount, hStream):
        n = size_t(ByteCount)
        return self._capture_node(
            hStream,
            lambda s: self._linear_copy(s, DEVICE, int(dstDevice), DEVICE, int(srcDevice), n),
            lambda: super(CaptureOps, self).cuMemcpyDtoDAsync(dstDevice, srcDevice, n, hStream),
        )

    def cuMemcpyAsync(self, dst, src, ByteCount, hStream):
        """Captured: a memcpy node whose sides the driver infers from the addresses
        (CU_MEMORYTYPE_UNIFIED)."""
        n = size_t(ByteCount)
        return self._capture_node(
            hStream,
            lambda s: self._linear_copy(s, UNIFIED, int(dst), UNIFIED, int(src), n),
            lambda: super(CaptureOps, self).cuMemcpyAsync(dst, src, n, hStream),
        )

    def cuMemcpyPeerAsync(self, dstDevice, dstContext, srcDevice, srcContext, ByteCount, hStream):
        """Not capturable: CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED (two H200s, driver 580, issue
        21), the capture invalidated as by other unsupported work (scripts/
        probe_multi_device.py asks a GPU both). A copy between devices in a graph is a memcpy
        node of device pointers (cuMemcpyDtoDAsync, under unified addressing)."""
        n = size_t(ByteCount)
        return self._capture_node(
            hStream,
            lambda s: (CAPTURE_UNSUPPORTED, None),
            lambda: super(CaptureOps, self).cuMemcpyPeerAsync(
                dstDevice, dstContext, srcDevice, srcContext, n, hStream
            ),
        )

    def cuMemcpy2DAsync(self, pCopy, hStream):
        def make(stream):
            if not isinstance(pCopy, CUDA_MEMCPY2D):
                return INVALID_VALUE, None
            copy = CUDA_MEMCPY3D()
            for name in _2D_FIELDS:
                try:
                    setattr(copy, name, getattr(pCopy, name))
                except ValueError:  # a memory type never set: the copy's checks refuse it
                    pass
            copy.Depth = 1
            return (
                self._captured_copy(stream, copy)
                if pCopy.WidthInBytes and pCopy.Height
                else (OK, None)
            )

        return self._capture_node(
            hStream, make, lambda: super(CaptureOps, self).cuMemcpy2DAsync(pCopy, hStream)
        )

    def cuMemcpy3DAsync(self, pCopy, hStream):
        def make(stream):
            if not isinstance(pCopy, CUDA_MEMCPY3D):
                return INVALID_VALUE, None
            empty = not (pCopy.WidthInBytes and pCopy.Height and pCopy.Depth)
            return (OK, None) if empty else self._captured_copy(stream, pCopy)

        return self._capture_node(
            hStream, make, lambda: super(CaptureOps, self).cuMemcpy3DAsync(pCopy, hStream)
        )

    def _captured_memset(self, stream, dst, value, size, width, height=1, pitch=0):
        if width == 0 or height == 0:
            return OK, None
        params = CUDA_MEMSET_NODE_PARAMS()
        params.dst, params.value, params.elementSize = dst, value, size
        params.width, params.height, params.pitch = width, height, pitch
        return memset_work(self, params, CUcontext(stream.ctx.handle))

    def cuMemsetD8Async(self, dstDevice, uc, N, hStream):
        value, n = unsigned(uc, 8, "unsigned char"), size_t(N)
        return self._capture_node(
            hStream,
            lambda s: self._captured_memset(s, int(dstDevice), value, 1, n),
            lambda: super(CaptureOps, self).cuMemsetD8Async(dstDevice, uc, N, hStream),
        )

    def cuMemsetD16Async(self, dstDevice, us, N, hStream):
        value, n = unsigned(us, 16, "unsigned short"), size_t(N)
        return self._capture_node(
            hStream,
            lambda s: self._captured_memset(s, int(dstDevice), value, 2, n),
            lambda: super(CaptureOps, self).cuMemsetD16Async(dstDevice, us, N, hStream),
        )

    def cuMemsetD32Async(self, dstDevice, ui, N, hStream):
        value, n = unsigned(ui, 32, "unsigned int"), size_t(N)
        return self._capture_node(
            hStream,
            lambda s: self._captured_memset(s, int(dstDevice), value, 4, n),
            lambda: super(CaptureOps, self).cuMemsetD32Async(dstDevice, ui, N, hStream),
        )

    def cuMemsetD2D32Async(self, dstDevice, dstPitch, ui, Width, Height, hStream):
        value = unsigned(ui, 32, "unsigned int")
        pitch, width, height = size_t(dstPitch), size_t(Width), size_t(Height)
        return self._capture_node(
            hStream,
            lambda s: self._captured_memset(s, int(dstDevice), value, 4, width, height, pitch),
            lambda: super(CaptureOps, self).cuMemsetD2D32Async(
                dstDevice, dstPitch, ui, Width, Height, hStream
            ),
        )

    # -- stream-ordered memory --------------------------------------------------------------

    def cuMemAllocAsync(self, bytesize, hStream):
        nbytes = size_t(bytesize)
        return self._captured_alloc(
            hStream,
            nbytes,
            lambda: OK,
            lambda: super(CaptureOps, self).cuMemAllocAsync(nbytes, hStream),
        )

    def cuMemAllocFromPoolAsync(self, bytesize, pool, hStream):
        """Captured: a memory node the graph owns, as cuMemAllocAsync; an IPC pool's is
        CUDA_ERROR_NOT_SUPPORTED and leaves the capture valid (both measured on an H100)."""
        nbytes = size_t(bytesize)

        def usable():
            found = self._pool(pool)
            if found is None or found.imported:
                return INVALID_VALUE
            return NOT_SUPPORTED if found.ipc else OK

        return self._captured_alloc(
            hStream,
            nbytes,
            usable,
            lambda: super(CaptureOps, self).cuMemAllocFromPoolAsync(nbytes, pool, hStream),
        )

    def _captured_alloc(self, hStream, nbytes: int, usable, eager):
        """A stream-ordered allocation: a memory node of the capture when ``hStream`` is
        captured (after ``usable()`` said OK), else ``eager()``'s answer."""
        made = []

        def make(stream):
            err = usable()
            if err or nbytes == 0:
                return err, None
            err, work = self._graph_alloc(self._captures[stream].graph, stream.ctx, nbytes)
            made.append(work)
            return err, work

        result = self._capture_node(hStream, make, eager)
        if len(result) == 2:
            return result  # not capturing: the eager allocation's answer
        if result[0]:
            return (result[0], None)
        return (OK, CUdeviceptr(made[0].block.base if made and made[0] else 0))

    def cuMemFreeAsync(self, dptr, hStream):
        return self._capture_node(
            hStream,
            lambda s: self._graph_free(self._captures[s].graph, dptr),
            lambda: super(CaptureOps, self).cuMemFreeAsync(dptr, hStream),
        )

    # -- events -----------------------------------------------------------------------------

    def cuEventRecord(self, hEvent, hStream):
        if not self._captures and not self._captured_events:
            return super().cuEventRecord(hEvent, hStream)
        with self._lock:
            err, event = self._event(hEvent)
            if err:
                return (err,)
            err, stream, capture = self._capture_of(hStream)
            if err:
                return (err,)
            if capture is None:
                self._captured_events.pop(event, None)
                return super().cuEventRecord(hEvent, hStream)
            if stream.ctx is not event.ctx:
                return (INVALID_HANDLE,)
            self._captured_events[event] = (capture, list(capture.frontier[stream]))
        return (OK,)

    def cuStreamWaitEvent(self, hStream, hEvent, Flags):
        if not self._captures:
            return super().cuStreamWaitEvent(hStream, hEvent, Flags)
        if int(Flags) not in (0, EVENT_WAIT_EXTERNAL):
            return (INVALID_VALUE,)
        with self._lock:
            err, event = self._event(hEvent)
            if err:
                return (err,)
            err, stream, capture = self._capture_of(hStream)
            if err:
                return (err,)
            found = self._captured_events.get(event)
            if found is None:
                if capture is None:
                    return super().cuStreamWaitEvent(hStream, hEvent, Flags)
                if event.marker is None or int(Flags) == EVENT_WAIT_EXTERNAL:
                    return (OK,)  # nothing to wait for / an external wait: stream order only
                capture.invalid = True
                return (CAPTURE_ISOLATION,)
            source, nodes = found
            if capture is None:  # the stream joins the capture (a fork)
                self._captures[stream] = source
                source.frontier[stream] = list(nodes)
            elif capture is not source:
                capture.invalid = source.invalid = True
                return (CAPTURE_MERGE,)
            else:
                known = {id(n) for n in source.frontier[stream]}
                source.frontier[stream] += [n for n in nodes if id(n) not in known]
        return (OK,)
