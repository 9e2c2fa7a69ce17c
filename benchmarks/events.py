"""Event record, stream wait and context push+pop: cuctx against raw driver calls.

On the cuda backend the baseline is cuda.bindings itself (the goal is cuctx/raw <= 1.2).
On the sim the "raw" calls go to the SimDriver, so the ratios only show cuctx's own Python
overhead, not a GPU comparison.
"""

from __future__ import annotations

from cuda.bindings.driver import CUevent_flags, CUstream_flags

import cuctx
from _bench import best_time, compare, start

INNER = 20_000


def per_call_ns(fn, sync) -> float:
    """ns per call of fn; the queue is drained after each measurement so it stays short."""
    try:
        return best_time(fn, inner=INNER, rounds=3) * 1e9
    finally:
        sync()


def main() -> None:
    backend, raw = start("the baseline is the sim's driver; ratios show cuctx's Python "
                         "overhead only")
    drv = backend.driver
    with cuctx.Device(0) as ctx:
        a, b = cuctx.Stream(), cuctx.Stream()
        event = cuctx.Event()
        non_blocking = int(CUstream_flags.CU_STREAM_NON_BLOCKING)
        raw_a = drv.cuStreamCreate(non_blocking)[1]
        raw_b = drv.cuStreamCreate(non_blocking)[1]
        raw_event = drv.cuEventCreate(int(CUevent_flags.CU_EVENT_DISABLE_TIMING))[1]
        record, wait = drv.cuEventRecord, drv.cuStreamWaitEvent
        sync = ctx.synchronize

        def raw_wait_stream():
            record(raw_event, raw_a)
            wait(raw_b, raw_event, 0)

        a.record(event)  # waits need a recorded event
        compare("event record", {
            "cuctx": lambda: per_call_ns(lambda: a.record(event), sync),
            raw: lambda: per_call_ns(lambda: record(raw_event, raw_a), sync),
        }, unit="ns")
        compare("stream wait on an event", {
            "cuctx": lambda: per_call_ns(lambda: b.wait(event), sync),
            raw: lambda: per_call_ns(lambda: wait(raw_b, raw_event, 0), sync),
        }, unit="ns")
        compare("stream wait on a stream (record + wait)", {
            "cuctx": lambda: per_call_ns(lambda: b.wait(a), sync),
            raw: lambda: per_call_ns(raw_wait_stream, sync),
        }, unit="ns")

        handle, push, pop = ctx._handle, drv.cuCtxPushCurrent, drv.cuCtxPopCurrent

        def with_block():
            with ctx:
                pass

        def push_pop():
            ctx.push()
            cuctx.Context.pop()

        def raw_push_pop():
            push(handle)
            pop()

        compare("context push + pop: ctx.push(); Context.pop()", {
            "cuctx": lambda: per_call_ns(push_pop, sync),
            raw: lambda: per_call_ns(raw_push_pop, sync),
        }, unit="ns")
        compare("context push + pop: with ctx", {
            "cuctx": lambda: per_call_ns(with_block, sync),
            raw: lambda: per_call_ns(raw_push_pop, sync),
        }, unit="ns")
        drv.cuEventDestroy(raw_event)
        drv.cuStreamDestroy(raw_a)
        drv.cuStreamDestroy(raw_b)


if __name__ == "__main__":
    main()
