"""The operation trace: sinks see what is announced, with the user's call site; extents of
strided views; registration errors are clear."""

import pytest

import cuctx
from cuctx import _trace


def test_a_sink_sees_operations_with_the_users_line_and_only_while_registered():
    seen = []
    with cuctx.racecheck("off"), _trace.sink(seen.append):  # (the sim's checker is a sink)
        assert _trace.sinks
        _trace.emit("record", None, None, event="e")  # this line is the call site
        line = (
            test_a_sink_sees_operations_with_the_users_line_and_only_while_registered.__code__.co_firstlineno
            + 4
        )
    with cuctx.racecheck("off"):
        _trace.emit("record", None, None) if _trace.sinks else None
        assert not _trace.sinks
    [op] = seen
    assert (op.kind, op.event) == ("record", "e")
    assert op.site[0] == __file__ and op.site[1] == line
    assert op.time_ns > 0 and op.thread


def test_extents_cover_strided_and_reversed_layouts():
    assert _trace.extent(1000, (3, 4), (32, 8), 8) == (1000, 96)
    assert _trace.extent(1000, (3,), (-8,), 8) == (984, 24)  # a reversed view starts lower
    assert _trace.extent(1000, (0, 4), (32, 8), 8) == (1000, 0)


def test_sinks_must_be_callable_and_registered_to_be_removed():
    with pytest.raises(TypeError, match="callable"):
        _trace.add_sink(42)
    with pytest.raises(ValueError, match="not a registered"):
        _trace.remove_sink(print)


def test_the_examples_lines_are_the_users(backend, capsys):
    """The examples ship inside the package, yet they are user code: the operations they
    make are placed at their own lines, not at whatever ran them."""
    from cuctx.examples import stream_overlap

    seen = []
    with _trace.sink(seen.append):
        stream_overlap.main()
    sites = {op.site[0] for op in seen if op.site}
    assert sites == {stream_overlap.__file__}, sites
