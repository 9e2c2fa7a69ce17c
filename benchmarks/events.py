"""Event record, stream wait and context push+pop: cuctx on both of its paths against raw
driver calls.

cuctx runs on its compiled path ("native", `cuctx.backend().native`) and on its Python path
(as with CUCTX_NATIVE=0; measured in this process by emptying the backend's ``native`` slot,
so the compiled methods' hand-over to the Python ones, a few tens of ns, is included). On the
cuda backend the baseline is cuda.bindings itself (issue 11's target: native <= 1.0x raw).
On the sim the "raw" calls go to the SimDriver, so the ratios only show cuctx's own
overhead, not a GPU comparison.
"""

from __future__ import annotations

from cuda.bindings.driver import CUevent_flags, CUstream_flags

import cuctx
from _bench import best_time, compare, run, start

INNER = 20_000


def per_call_ns(fn, sync) -> float:
    """ns per call of fn; the queue is drained after each measurement so it stays short."""
    try:
        return best_time(fn, inner=INNER, rounds=3) * 1e9
    finally:
        sync()


def both_paths(backend, title: str, call, raw: str, raw_call, sync) -> None:
    """Compare ``call`` on cuctx's compiled path and on its Python path with ``raw_call``."""

    def on_python_path():
        native, backend.native = backend.native, None
        try:
            return per_call_ns(call, sync)
        finally:
            backend.native = native

    candidates = {}
    if backend.native is not None:
        candidates["cuctx (native)"] = lambda: per_call_ns(call, sync)
    candidates["cuctx (Python)"] = on_python_path
    candidates[raw] = lambda: per_call_ns(raw_call, sync)
    # ratios to the native path on its lines (native/Python, native/raw), then Python/raw
    best = compare(title, candidates, unit="ns", reference=next(iter(candidates)))
    if "cuctx (native)" in best:
        print(f"  cuctx (Python)/{raw} = {best['cuctx (Python)'] / best[raw]:.3f}")


def main() -> None:
    backend, raw = start(
        "the baseline is the sim's driver; ratios show cuctx's Python overhead only"
    )
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
        b.wait(a)  # the first wait on a stream makes its event
        both_paths(
            backend,
            "event record",
            lambda: a.record(event),
            raw,
            lambda: record(raw_event, raw_a),
            sync,
        )
        both_paths(
            backend,
            "Event.record(stream)",
            lambda: event.record(a),
            raw,
            lambda: record(raw_event, raw_a),
            sync,
        )
        both_paths(
            backend,
            "stream wait on an event",
            lambda: b.wait(event),
            raw,
            lambda: wait(raw_b, raw_event, 0),
            sync,
        )
        both_paths(
            backend,
            "stream wait on a stream (record + wait)",
            lambda: b.wait(a),
            raw,
            raw_wait_stream,
            sync,
        )

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

        def with_device():
            with device:
                pass

        device = cuctx.Device(0)
        both_paths(
            backend,
            "context push + pop: ctx.push(); Context.pop()",
            push_pop,
            raw,
            raw_push_pop,
            sync,
        )
        both_paths(backend, "context push + pop: with ctx", with_block, raw, raw_push_pop, sync)
        both_paths(backend, "context push + pop: with device", with_device, raw, raw_push_pop, sync)
        drv.cuEventDestroy(raw_event)
        drv.cuStreamDestroy(raw_a)
        drv.cuStreamDestroy(raw_b)


if __name__ == "__main__":
    run(main)
