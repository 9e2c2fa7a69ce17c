"""The timeline's source on a GPU: CUPTI activity records through NVIDIA's cupti-python
(``pip install 'cuctx[timeline]'``; the module is ``cupti.cupti``).

What is used (CUPTI's Activity API, 1:1 bindings): ``activity_register_callbacks`` (buffer
requested: returns (size, max records); buffer completed: a list of records), ``activity_enable``
for CONCURRENT_KERNEL, MEMCPY, MEMSET, DRIVER and EXTERNAL_CORRELATION, ``activity_flush_all``,
``activity_push/pop_external_correlation_id`` (per thread), ``get_timestamp``, and
``subscribe``/``unsubscribe`` only to find out whether another tool holds CUPTI (a second
subscriber is refused: then the timeline falls back to event pairs).

An EXTERNAL_CORRELATION record links CUPTI's correlation id of a driver call to the external
id pushed while it ran; kernel, memcpy and memset records carry CUPTI's correlation id (graph
nodes: the id of their cuGraphLaunch). Record times are CUPTI timestamps, moved onto the
host's ``perf_counter_ns`` by the offset between the two clocks read when collection starts.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from ._timeline_sources import Execution, Source, stream_key

if TYPE_CHECKING:
    from .. import _trace

BUFFER_BYTES = 8 << 20
_FLUSH_FORCED = 1  # CUPTI_ACTIVITY_FLAG_FLUSH_FORCED: deliver records of unfinished buffers

# The buffer callbacks are registered once per process (CUPTI keeps one pair); they hand
# records to the timeline collecting now, if any.
_registered = False
_collector: list[Any] | None = None


class CuptiUnavailable(Exception):
    """Why CUPTI cannot give this timeline its records (the message says what to do)."""


def _requested() -> tuple[int, int]:
    return BUFFER_BYTES, 0  # 0: as many records as fit


def _completed(activities: list[Any]) -> None:
    collector = _collector
    if collector is not None:
        collector.extend(activities)


def _no_callbacks(*args: Any) -> None:
    """The subscriber enables no callback domain: it only claims CUPTI."""


class CuptiSource(Source):
    describe = "CUPTI activity records"
    clock = "the host's perf_counter_ns"

    def __init__(self) -> None:
        try:
            from cupti import cupti
        except ImportError as exc:
            raise CuptiUnavailable(
                f"cupti-python is not installed ({exc}); pip install 'cuctx[timeline]' for "
                "exact device times"
            ) from None
        except Exception as exc:  # the package is there but libcupti could not be loaded
            raise CuptiUnavailable(f"CUPTI could not be loaded: {exc}") from None
        self._cupti = cupti
        # bound once: the timeline moves the id on after every operation
        self._pop = cupti.activity_pop_external_correlation_id
        self._push = cupti.activity_push_external_correlation_id
        try:
            self._subscriber = cupti.subscribe(_no_callbacks, None)
        except Exception as exc:  # cupti.cuptiError: MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED, ...
            raise CuptiUnavailable(
                f"CUPTI is in use by another tool (Nsight Systems, a profiler: {exc}); run "
                "without it for exact device times"
            ) from None
        self._kinds = [
            cupti.ActivityKind.CONCURRENT_KERNEL,
            cupti.ActivityKind.MEMCPY,
            cupti.ActivityKind.MEMSET,
            cupti.ActivityKind.DRIVER,
            cupti.ActivityKind.EXTERNAL_CORRELATION,
        ]
        self._ext = cupti.ExternalCorrelationKind.CUSTOM2
        self._records: list[Any] = []
        self._streams: dict[tuple[int, int], tuple[int, int]] = {}  # CUPTI ids -> handles
        self._learned: set[tuple[int, int]] = set()
        self._seen: set[Any] = set()  # the Stream objects of the operations so far
        self._offset = 0

    def start(self, first_id: int) -> None:
        global _registered, _collector
        cupti = self._cupti
        try:
            if not _registered:
                cupti.activity_register_callbacks(_requested, _completed)
                _registered = True
            _collector = self._records
            for kind in self._kinds:
                cupti.activity_enable(kind)
        except Exception:
            _collector = None
            cupti.unsubscribe(self._subscriber)
            raise
        before = time.perf_counter_ns()
        stamp = cupti.get_timestamp()
        self._offset = stamp - (before + time.perf_counter_ns()) // 2
        cupti.activity_push_external_correlation_id(self._ext, first_id)

    def advance(self, next_id: int) -> None:
        self._pop(self._ext)
        self._push(self._ext, next_id)

    def submitted(self, op: _trace.Operation, correlation: int | None) -> None:
        """Learn CUPTI's ids of each stream once, to place work cuctx did not submit."""
        stream = op.stream
        if stream is None or stream in self._seen:  # (one hash: the common case)
            return
        self._seen.add(stream)
        key = stream_key(op.context, stream)
        if key in self._learned:  # another object for a stream already learned
            return
        self._learned.add(key)
        try:
            ctx_id = self._cupti.get_context_id(key[0])
            stream = 0 if key[1] in (1, 2) else key[1]  # the default streams: NULL
            stream_id = self._cupti.get_stream_id_ex(key[0], stream, int(key[1] == 2))
        except Exception:  # no id for it: its foreign work gets a track of its own
            return
        self._streams[(ctx_id, stream_id)] = key

    def stop(self) -> list[Execution]:
        global _collector
        cupti = self._cupti
        try:
            cupti.activity_pop_external_correlation_id(self._ext)
            cupti.activity_flush_all(_FLUSH_FORCED)
            for kind in self._kinds:
                cupti.activity_disable(kind)
        finally:
            _collector = None
            cupti.unsubscribe(self._subscriber)
        return self._executions()

    def _executions(self) -> list[Execution]:
        kinds = self._cupti.ActivityKind
        external = {
            r.correlation_id: r.external_id
            for r in self._records
            if r.kind == kinds.EXTERNAL_CORRELATION and r.external_kind == self._ext
        }
        lanes = {kinds.CONCURRENT_KERNEL: "kernel", kinds.MEMCPY: "copy", kinds.MEMSET: "memset"}
        out = []
        for r in self._records:
            lane = lanes.get(r.kind)
            if lane is None:
                continue
            if lane == "kernel":
                name = r.name
            elif lane == "copy":
                name = f"memcpy {_COPY_KINDS.get(int(r.copy_kind), 'copy')}"
            else:
                name = "memset"
            ctx, stream = self._streams.get(
                (r.context_id, r.stream_id), (r.context_id, r.stream_id)
            )
            out.append(
                Execution(
                    external.get(r.correlation_id),
                    lane,
                    name,
                    r.device_id,
                    ctx,
                    stream,
                    r.start - self._offset,
                    r.end - self._offset,
                )
            )
        self._records.clear()
        return out


# CUpti_ActivityMemcpyKind: HTOD 1, DTOH 2, HTOA 3, ATOH 4, ATOA 5, ATOD 6, DTOA 7, DTOD 8,
# HTOH 9, PTOP 10.
_COPY_KINDS = {
    1: "HtoD",
    2: "DtoH",
    3: "HtoA",
    4: "AtoH",
    5: "AtoA",
    6: "AtoD",
    7: "DtoA",
    8: "DtoD",
    9: "HtoH",
    10: "PtoP",
}
