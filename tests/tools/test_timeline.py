"""cuctx.timeline(): every operation's submission and execution, per device, context and
stream; its Chrome trace, picture and summary. On the sim from its activity feed (exact), on
a GPU from CUPTI where cupti-python is installed, and from event pairs (approximate) on both."""

import importlib.util
import json
import re
import sys

import numpy as np
import pytest

import cuctx

# Floats: 8 MiB, a copy long enough to see on either clock (on a GPU a 1 MiB copy took about
# 25 us, too narrow a bar beside the host's gaps in the picture's span).
N = 1 << 21
WORK_KINDS = {"copy", "memset", "launch"}


def program():
    """Two streams of one context: copy in on s1, fill on s2, an event recorded on s1 that s2
    waits for, a copy out on s2. Returns the streams, the event and the host result."""
    host = cuctx.pinned_empty(N, np.float32)
    host[:] = 3.0
    out = cuctx.pinned_empty(N, np.float32)
    s1, s2 = cuctx.Stream(), cuctx.Stream()
    a = cuctx.empty(N, np.float32, stream=s1)
    b = cuctx.empty(N, np.float32, stream=s2)
    return host, out, s1, s2, a, b


def run(host, out, s1, s2, a, b):
    cuctx.copy(a, host, stream=s1)
    b.fill(1.0, stream=s2)
    ready = s1.record()
    s2.wait(ready)
    cuctx.copy(out, a, stream=s2)
    return ready


def recorded(backend, source="auto"):
    with cuctx.Device(0):
        args = program()
        with cuctx.timeline(source=source) as tl:
            run(*args)
        assert np.all(args[1] == 3.0)  # the block ended after the work: the result is there
    return tl, args


def test_records_match_operations_one_to_one(backend):
    tl, (host, out, s1, s2, a, b) = recorded(backend)
    work = [r for r in tl.records if r.kind in WORK_KINDS]
    assert [(r.kind, r.stream) for r in sorted(work, key=lambda r: r.correlation)] == [
        ("copy", s1.handle),
        ("memset", s2.handle),
        ("copy", s2.handle),
    ]
    assert len({r.correlation for r in work}) == 3  # one execution per operation
    for r in work:
        assert r.operation is not None and r.operation.stream in (s1, s2)
        assert r.start_ns <= r.end_ns and r.device == 0
        assert r.site is not None and r.site[0] == __file__  # the user's line, not cuctx's
    assert {r.kind for r in tl.records if r.lane == "marker"} == {"record", "wait_event"}
    if backend.sim is not None:
        assert not tl.approximate and "activity feed" in tl.source
        assert all(r.operation is not None for r in tl.records)  # nothing foreign
        for r in work:
            assert r.submit_ns <= r.start_ns  # nothing runs before it was submitted
        copy_out = work[-1] if work[-1].correlation > work[0].correlation else work[0]
        wait = next(r for r in tl.records if r.kind == "wait_event")
        assert copy_out.start_ns >= wait.start_ns  # the copy out waited for the copy in


def test_the_chrome_trace_has_a_track_per_stream_and_the_arrows(backend, tmp_path):
    tl, (host, out, s1, s2, a, b) = recorded(backend)
    path = tl.save(tmp_path / "trace.json")
    trace = json.loads(open(path).read())
    events = trace["traceEvents"]
    names = {
        (e["name"], e["args"]["name"])
        for e in events
        if e["ph"] == "M" and e["name"] in ("process_name", "thread_name")
    }
    assert ("process_name", "host") in names
    ctx = s1.context
    assert ("process_name", f"ctx 1: device 0 / context {ctx.handle:#x} ({ctx.kind})") in names
    for name, s in (("s1", s1), ("s2", s2)):  # the short label, then the full handle
        assert ("thread_name", f"{name}: stream {s.handle:#x} (created)") in names
    slices = [e for e in events if e["ph"] == "X"]
    assert all(e["dur"] >= 0 and "pid" in e and "tid" in e for e in slices)
    on_device = [e for e in slices if e["cat"] != "submission"]
    assert {e["args"]["stream"] for e in on_device} == {f"{s1.handle:#x}", f"{s2.handle:#x}"}
    assert {e["args"]["context"] for e in on_device} == {f"{ctx.handle:#x}"}
    flows = {}
    for e in events:
        if e["ph"] in "sf":
            flows.setdefault(e["id"], {})[e["ph"]] = e
    assert all(set(f) == {"s", "f"} for f in flows.values())
    kinds = [f["s"]["name"] for f in flows.values()]
    executed = [r for r in tl.records if r.start_ns is not None and r.submit_ns is not None]
    assert kinds.count("submission") == len(executed)
    assert kinds.count("event record -> wait") == 1
    record = next(f for f in flows.values() if f["s"]["name"] == "event record -> wait")
    assert record["s"]["tid"] != record["f"]["tid"]  # from s1's track to s2's


def test_summary_numbers_are_consistent(backend):
    tl, _ = recorded(backend)
    summary = tl.summary()
    assert summary["span_ns"] > 0
    assert len(summary["streams"]) == 2
    for s in summary["streams"].values():
        assert 0 < s["busy_fraction"] <= 1 and s["busy_ns"] <= summary["span_ns"]
        assert s["gap_ns"] >= s["longest_gap_ns"] >= 0
    assert sum(s["operations"] for s in summary["streams"].values()) == 3
    device = summary["devices"][0]
    assert device["copy_compute_overlap_ns"] <= min(device["copy_ns"], device["kernel_ns"])
    assert device["contexts_overlap_ns"] == 0  # one context
    text = str(summary)
    assert "busy" in text and "copy/compute overlap" in text
    for name in summary["streams"]:
        assert name in text


def test_event_pairs_work_on_either_backend(backend):
    """The fallback where CUPTI is missing or taken: forced here, so it is tested on the sim."""
    tl, (host, out, s1, s2, a, b) = recorded(backend, source="events")
    assert tl.approximate and "event pairs" in tl.source
    work = sorted((r for r in tl.records if r.kind in WORK_KINDS), key=lambda r: r.correlation)
    assert [(r.kind, r.stream) for r in work] == [
        ("copy", s1.handle),
        ("memset", s2.handle),
        ("copy", s2.handle),
    ]
    assert all(r.approximate and r.start_ns <= r.end_ns for r in work)
    assert work[2].start_ns >= work[0].end_ns  # the copy out after the copy in it waited for


def test_other_sinks_see_only_the_users_operations(backend):
    """Leaving the block waits for the work through the driver: a race checker listening
    beside the timeline sees no synchronization the user did not write."""
    seen = []
    with cuctx.Device(0):
        args = program()
        with cuctx._trace.sink(seen.append):
            with cuctx.timeline(source="events"):
                run(*args)
    assert [op.kind for op in seen] == ["copy", "memset", "record", "wait_event", "copy"]


@pytest.mark.parametrize("source", ["auto", "events"])
def test_allocations_and_synchronizes_between_the_work_leave_it_matched(backend, source):
    """Operations that run nothing on the device (an allocation, a synchronize) are
    recorded at their submission and take no correlation id: the work around them still
    gets its own execution."""
    with cuctx.Device(0):
        host, out, s1, s2, a, b = program()
        with cuctx.timeline(source) as tl:
            cuctx.copy(a, host, stream=s1)
            temp = cuctx.empty(N, np.float32, stream=s1)
            s1.synchronize()
            cuctx.copy(temp, a, stream=s1)
            cuctx.copy(out, a, stream=s2)
    host_only = [r for r in tl.records if r.kind in ("alloc", "sync_stream")]
    assert sorted(r.kind for r in host_only) == ["alloc", "sync_stream"]
    assert all(
        r.lane == "host-only" and r.start_ns is None and r.correlation is None for r in host_only
    )
    work = sorted((r for r in tl.records if r.kind == "copy"), key=lambda r: r.correlation)
    assert [r.stream for r in work] == [s1.handle, s1.handle, s2.handle]
    if not tl.approximate:  # the device's own records name the directions
        assert [r.name for r in work] == ["memcpy HtoD", "memcpy DtoD", "memcpy DtoH"]
    assert all(r.start_ns is not None and r.start_ns <= r.end_ns for r in work)
    np.testing.assert_array_equal(out, host)


def test_event_pairs_after_a_device_reset_use_events_of_the_new_context(backend):
    """Event pairs keep the timing events a timeline read for the next one, per context: a
    reset destroys them with the context, and the next timeline makes new ones (the new
    primary context has the old one's handle: events kept by handle would be dead ones)."""
    for _ in range(2):
        with cuctx.Device(0):
            args = program()
            with cuctx.timeline(source="events") as tl:
                run(*args)
            # before the arrays go (the timeline waited too, but that wait is not the
            # program's: the race checker does not count it)
            cuctx.synchronize()
        work = [r for r in tl.records if r.kind in WORK_KINDS]
        assert len(work) == 3 and all(r.start_ns is not None for r in work)
        del args
        cuctx.Device(0).reset()


def test_a_timeline_records_one_block(backend):
    with cuctx.Device(0):
        tl = cuctx.timeline()
        with pytest.raises(RuntimeError, match="after|once its"):
            _ = tl.records
        with tl:
            pass
        assert tl.records == []
        with pytest.raises(RuntimeError, match="one block"):
            with tl:
                pass
    with pytest.raises(ValueError, match="'auto', 'activity' or 'events'"):
        cuctx.timeline(source="nsys")


def test_saving_as_another_format_says_which_exist(backend, tmp_path):
    tl, _ = recorded(backend)
    with pytest.raises(ValueError, match=r"\.json.*\.png"):
        tl.save(tmp_path / "trace.svg")


class Pipeline:
    def __init__(self) -> None:
        self.copies = cuctx.Stream()

    def run(self, arrays: dict) -> None:
        arrays[self.copies].fill(0.0, stream=self.copies)


def test_lanes_are_named_as_the_users_code_names_their_streams(backend):
    """The summary's (and the picture's) lane labels: the variable holding the stream at the
    line that used it, an item of a list or dict, or an attribute of ``self``; a name several
    streams had (a loop's variable) goes to none of them; a stream no name held gets small
    ordinals of this timeline."""
    with cuctx.Device(0):
        main = cuctx.Stream()
        workers = [cuctx.Stream(), cuctx.Stream()]
        by_kind = {"fills": cuctx.Stream()}
        pipeline = Pipeline()
        _hidden = cuctx.Stream()  # a private name: not a name to show
        arrays = {
            s: cuctx.empty(16, np.float32, stream=s)
            for s in (main, *workers, by_kind["fills"], pipeline.copies, _hidden)
        }
        arrays[None] = cuctx.empty(16, np.float32)
        with cuctx.timeline() as tl:
            arrays[main].fill(1.0, stream=main)
            for s in workers:  # `s` names both workers: they go by their items
                arrays[s].fill(2.0, stream=s)
            arrays[by_kind["fills"]].fill(3.0, stream=by_kind["fills"])
            pipeline.run(arrays)
            arrays[_hidden].fill(4.0, stream=_hidden)
            arrays[None].fill(5.0)  # the legacy default stream
    labels = set(tl.summary()["streams"])
    named = {"main", "workers[0]", "workers[1]", "by_kind['fills']", "self.copies"}
    assert named < labels
    rest = sorted(labels - named)
    assert rest[0] == "ctx 1 / legacy stream"
    assert re.fullmatch(r"ctx 1 / stream [1-6]", rest[1]) and len(rest) == 2


def test_unnamed_streams_of_two_contexts_get_ordinals_per_context(backend, tmp_path):
    contexts = [cuctx.Context.create(0) for _ in range(2)]
    for _ in contexts:
        cuctx.Context.pop()
    work = []
    for ctx in contexts:
        with ctx:
            work.append((cuctx.Stream(), cuctx.zeros(16, np.float32)))
            ctx.synchronize()
    with cuctx.timeline() as tl:
        for ctx, (s, x) in zip(contexts, work):  # `s` names both streams: neither goes by it
            with ctx:
                x.fill(1.0, stream=s)
    assert set(tl.summary()["streams"]) == {"ctx 1 / stream 1", "ctx 2 / stream 1"}
    events = json.load(open(tl.save(tmp_path / "trace.json")))["traceEvents"]
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"].endswith("_name")}
    ordinals = []
    for ctx, (s, _) in zip(contexts, work):  # the JSON names the handles beside the ordinals
        (process,) = [n for n in names if n.endswith(f"context {ctx.handle:#x} (created)")]
        ordinals.append(process.split(":")[0])
        assert f"stream 1: stream {s.handle:#x} (created)" in names
    assert sorted(ordinals) == ["ctx 1", "ctx 2"]
    for ctx in contexts:
        ctx.destroy()


def test_handles_print_in_hex_in_records_and_summaries(backend):
    tl, (host, out, s1, s2, a, b) = recorded(backend)
    fill = next(r for r in tl.records if r.kind == "memset")
    ctx = s2.context
    assert f"ctx {ctx.handle:#x} stream {s2.handle:#x}:" in repr(fill)
    assert fill.site[0] in repr(fill) and "memset" in repr(fill)
    assert fill.stream == s2.handle and str(fill.stream) == f"{s2.handle:#x}"  # still an int
    summary = tl.summary()
    assert summary["streams"]["s2"]["stream"] == s2.handle
    for text in (repr(tl.records), repr(summary), str(summary)):
        assert str(int(ctx.handle)) not in text and str(int(s2.handle)) not in text
    assert f"'stream': {s2.handle:#x}" in repr(summary)
    assert json.loads(json.dumps(summary))["streams"]["s2"]["stream"] == s2.handle


def test_a_timeline_says_what_it_holds(backend):
    tl = cuctx.timeline(source="events")
    assert repr(tl) == "<Timeline source='events', not started>"
    with cuctx.Device(0):
        args = program()
        with tl:
            run(*args)
            assert repr(tl).startswith(
                "<Timeline recording: 5 operations so far, times from event pairs"
            )
    assert re.fullmatch(
        rf"<Timeline of {len(tl.records)} records: 2 streams in 1 context over "
        r"[\d.]+ us, times from event pairs \(approximate; .*\)>",
        repr(tl),
    )


def figures(monkeypatch) -> list:
    """The matplotlib Figures `Timeline.save` writes, from now on (it still writes them)."""
    from matplotlib.figure import Figure

    saved, savefig = [], Figure.savefig

    def spy(fig, *args, **kwargs):
        saved.append(fig)
        return savefig(fig, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", spy)
    return saved


def test_a_path_it_cannot_write_raises_the_oserror_open_raises(backend, tmp_path):
    # As Graph.to_dot does: cuctx's file outputs raise what Python's own file functions do.
    tl, _ = recorded(backend)
    missing = tmp_path / "missing"
    names = ["trace.json"] + ["timeline.png"] * (importlib.util.find_spec("matplotlib") is not None)
    for name in names:
        with pytest.raises(FileNotFoundError, match=re.escape(str(missing / name))):
            tl.save(missing / name)
    (tmp_path / "folder.json").mkdir()
    with pytest.raises(IsADirectoryError):
        tl.save(tmp_path / "folder.json")


@pytest.mark.host_timing
@pytest.mark.skipif(
    importlib.util.find_spec("matplotlib") is None,
    reason="matplotlib is not installed (pip install 'cuctx[timeline]')",
)
def test_the_picture_is_a_png_with_a_lane_per_stream_and_short_labels(
    backend, tmp_path, monkeypatch
):
    from matplotlib.colors import to_rgb
    from matplotlib.image import imread
    from cuctx.tools._timeline_export import COLOURS

    saved = figures(monkeypatch)
    tl, _ = recorded(backend)
    path = tl.save(tmp_path / "timeline.png")
    assert open(path, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    (ax,) = saved[0].axes
    assert sorted(t.get_text() for t in ax.get_yticklabels()) == ["s1", "s2"]
    assert ax.get_position().x0 < 0.15  # the lanes have the width (long labels took 0.45)
    pixels = imread(path)[..., :3]  # what was written: rows x columns x RGB in 0..1
    height, width, _ = pixels.shape
    assert width >= 800 and height >= 150  # readable on a screen
    # The two copies (s1's in, s2's out) are bars in the copy colour, each in its stream's
    # lane: two bands of rows where a wide run of pixels has that colour. (The legend's patch
    # in the same colour is far narrower than a bar.)
    copy = np.all(np.abs(pixels - to_rgb(COLOURS["copy"])) < 1.5 / 255, axis=-1)
    rows = np.flatnonzero(copy.sum(axis=1) > 0.05 * width)
    bands = np.split(rows, np.flatnonzero(np.diff(rows) > 1) + 1)
    assert len(bands) == 2, [(b[0], b[-1]) for b in bands]
    assert all(len(band) >= 10 for band in bands)  # lanes tall enough to see


def test_without_matplotlib_the_error_names_the_extra(backend, tmp_path, monkeypatch):
    tl, _ = recorded(backend)
    for name in [m for m in sys.modules if m.split(".")[0] == "matplotlib"] + ["matplotlib"]:
        monkeypatch.setitem(sys.modules, name, None)  # as if it were not installed
    with pytest.raises(ImportError, match=r"cuctx\[timeline\]"):
        tl.save(tmp_path / "timeline.png")
    assert not (tmp_path / "timeline.png").exists()
    tl.save(tmp_path / "trace.json")  # needs nothing


@pytest.mark.gpu
def test_on_a_gpu_the_source_is_cupti_or_says_why_not(backend):
    if backend.sim is not None:
        pytest.skip("the sim has its own feed")
    tl, _ = recorded(backend)
    if importlib.util.find_spec("cupti") is None:
        assert tl.approximate and "cupti-python is not installed" in tl.source
    else:  # CUPTI's records, matched by external correlation ids
        assert not tl.approximate and tl.source == "CUPTI activity records"
        assert all(r.operation is not None for r in tl.records if r.kind in WORK_KINDS)
