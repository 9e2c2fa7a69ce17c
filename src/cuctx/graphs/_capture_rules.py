"""What an active stream capture forbids, and what happens to a capture a call breaks.

Kept apart from `_capture.py` (a capture itself: its block, the sink that maps operations to
nodes): these rules are consulted where no `Capture` is at hand, by the lower layers (through
the hooks `_capture.py` installs in `_lifetimes`), by executables (`_exec.py`) and by
AutoGraph's calls (`_autograph.py`), which sit below or beside the capture.

How breaking calls are handled: the streams of active captures are filed in
`_lifetimes.capturing`; the lower layers test that dict (one truth test, off the hot paths)
before a synchronize, a query or a pageable copy, and call `refuse_in_capture`. Where the
driver itself answers a capture code, `_calls.fail` calls `capture_failed`. Either way the
calling thread's broken captures are ended (cuStreamEndCapture, the graph destroyed), so the
streams are usable again, and GraphCaptureError names the call and the user's line. A capture
of another thread is never ended from here (its block would go on running its work eagerly):
cuctx's own refusals leave it running; one the driver invalidated is marked broken, and its
own block raises when it ends.

Graphs have rules of their own: a graph launch or upload on a capturing stream is refused
(`_refuse_captured`), so is instantiating while a capture forbids it
(`forbidding_instantiation`), and an AutoGraph call whose streams are captured runs eagerly,
into the capture (`_captured`).
"""

from __future__ import annotations

import sys
import threading
from typing import TYPE_CHECKING, Any, Callable

from cuda.bindings.driver import CUstreamCaptureStatus

from .. import _lifetimes, _trace
from ..errors import CAPTURE_UNSUPPORTED, GraphCaptureError
from ..stream import Stream

if TYPE_CHECKING:
    from ._autograph_record import Recording
    from ._capture import Capture

_ACTIVE = CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_ACTIVE


# -- what the lower layers call (installed in _lifetimes by _capture.py) ---------------------


def refuse_in_capture(
    operation: str,
    *,
    stream: Stream | None = None,
    event: Any = None,
    ctx: Any = None,
    legacy: Stream | None = None,
    captures: list[Capture] | None = None,
    why: str = "",
) -> None:
    """Raise GraphCaptureError when the call would break an active capture (see
    `_lifetimes`); the calling thread's captures it breaks are ended first."""
    active = set(_lifetimes.capturing.values())
    if captures is not None:  # the caller found the captures the call breaks, and says why
        hit = captures
    elif stream is not None:
        hit = [c for c in (_lifetimes.capturing.get((stream._ctx._key, stream._key)),) if c]
        why = why or (
            f"{stream!r} is being captured: its work runs only when the graph is "
            "launched, so there is nothing to wait for or ask about yet (synchronize "
            "after the `with` block instead)"
        )
    elif legacy is not None:
        hit = [c for c in active if c.mode == "global" and c.ctx is legacy._ctx]
        why = (
            "the legacy default stream was used while a global-mode capture is active in "
            "its context: its work would run now, outside the graph. Queue it on the "
            'capturing stream, or capture in "thread_local" or "relaxed" mode'
        )
    elif event is not None:
        hit = [c for c in active if event._key in c.events]
        why = (
            f"{event!r} was recorded in the capture: it marks a place in the graph, not "
            "work that runs"
        )
    else:
        hit = [c for c in active if c.ctx is ctx]
        why = (
            f"{ctx!r} has a stream being captured, and CUDA refuses to synchronize a "
            "context (or device) while one of its streams captures"
        )
    if not hit:
        return
    call, where = _user_call(operation)
    mine = [c for c in hit if c.thread == threading.get_ident()]
    if mine:
        ended = "; ".join(f"the capture of {c.stream!r} begun at {_where(c.site)}" for c in mine)
        after = f"T{ended[1:]} was ended and its graph discarded; the stream is usable again"
    else:
        after = (
            f"The capture (of another thread, begun at {_where(hit[0].site)}) goes on: "
            "cuctx refused the call before the driver saw it"
        )
    error = GraphCaptureError(
        CAPTURE_UNSUPPORTED,
        call,
        "operation not permitted when stream is capturing",
        f"at {where}: {why}. {after}",
    )
    for c in mine:
        c._end_early(error)
    raise error


def capture_failed(operation: str, code: int) -> str:
    """For `_calls.fail`: ``operation`` answered a capture code (``code``)."""
    broken = []
    for c in set(_lifetimes.capturing.values()):
        s = c.stream
        err, status = s._call(c.ctx._backend.driver.cuStreamIsCapturing, s._handle)
        if err or status != _ACTIVE:
            broken.append(c)
    call, where = _user_call(operation)
    where = f"called by {call} at {where}"
    if not broken:
        return where
    error = GraphCaptureError(code, operation, "", where)
    mine = [c for c in broken if c.thread == threading.get_ident()]
    for c in broken:
        if c in mine:
            c._end_early(error)
        else:
            c.broken = error  # its own block ends it, and raises
    words = "; ".join(f"the capture of {c.stream!r} begun at {_where(c.site)}" for c in broken)
    return f"{where}, which invalidated {words}, " + (
        "which was ended and its graph discarded; the stream is usable again"
        if mine
        else "whose `with` block will raise when it ends"
    )


def held_by_capture(stream: Stream, ptr: int, free: Callable[[], None]) -> bool:
    """Whether a free on ``stream`` waits for its capture to end (see `_lifetimes`)."""
    c = _lifetimes.capturing.get((stream._ctx._key, stream._key))
    if c is None:  # a free on another stream: after the last capture ends, as destroys
        _lifetimes._held.append((free, ()))
        return True
    if ptr in c.allocations:
        return False  # a free node of the capture's own memory
    c.held.append(free)
    return True


# -- graphs in captures: launches, instantiation, AutoGraph's calls ---------------------------


def _refuse_captured(stream: Stream, operation: str) -> None:
    """A graph launched (or uploaded) on a capturing stream: CUDA does not capture graph
    launches and invalidates the capture (an H100 answers cuGraphLaunch with
    CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED), so cuctx refuses it first, as it refuses other
    calls that would break a capture."""
    refuse_in_capture(
        operation,
        stream=stream,
        why=f"{stream!r} is being captured, and CUDA cannot capture a graph launch: launch the "
        "executable after the `with` block, or on a stream that is not captured",
    )


def forbidding_instantiation() -> list:
    """The active captures that a graph instantiated by the calling thread now would break.
    CUDA counts cuGraphInstantiate among the "potentially unsafe" calls a capture forbids:
    a thread may not make them while it captures in "thread_local" or "global" mode, nor
    while another thread captures in "global" mode (cuctx leaves threads in CUDA's default
    mode, which heeds those); a "relaxed" capture allows them. The driver answers
    CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and invalidates the capture (an H100, in a
    thread-local capture; the rest is the CUDA programming guide's rule for such calls)."""
    me = threading.get_ident()
    return [
        c
        for c in dict.fromkeys(_lifetimes.capturing.values())
        if c.broken is None
        and (c.mode == "global" or (c.mode == "thread_local" and c.thread == me))
    ]


def _refuse_instantiation(operation: str) -> None:
    """Refuse to instantiate a graph while a capture forbids it (`forbidding_instantiation`),
    before the driver would invalidate that capture."""
    captures = forbidding_instantiation()
    if not captures:
        return
    capture = captures[0]
    if capture.thread == threading.get_ident():
        whose, what = "this thread captures", 'capture in "relaxed" mode'
    else:
        whose = "another thread captures"
        what = 'have that thread capture in "thread_local" or "relaxed" mode'
    refuse_in_capture(
        operation,
        captures=captures,
        why=(
            f"{whose} {capture.stream!r} in {capture.mode!r} mode, which forbids instantiating a "
            "graph (CUDA counts it among the unsafe calls: the driver would refuse it and "
            "invalidate the capture). Instantiate the graph before the capture begins or after "
            f"its block, or {what}"
        ),
    )


def _captured(recording: Recording) -> Any:
    """A stream of the call (or one it waited for) that is being captured, if any: a
    graph's launch has no place in a capture, the call's operations do."""
    capturing = _lifetimes.capturing
    others = [payload[0] for stream, payload in recording.external_waits()]
    for stream in (*recording.streams, *others):
        if isinstance(stream, Stream) and (stream._ctx._key, stream._key) in capturing:
            return stream
    return None


# -- the user's call, in words -----------------------------------------------------------------


def _user_frame(also: tuple[str, ...] = ()):
    """(the user's frame, the code of the outermost cuctx frame below it or None): the first
    frame outside cuctx, generated code and the files ``also`` names."""
    frame, code = sys._getframe(2), None
    while frame is not None:
        filename = frame.f_code.co_filename
        if not filename.startswith((_trace._PACKAGE, _trace.GENERATED) + also):
            break
        if filename.startswith(_trace._PACKAGE):
            code = frame.f_code
        frame = frame.f_back
    return frame, code


def _user_call(operation: str) -> tuple[str, str]:
    """(the cuctx call the user made, "file:line" of the user's line); ``operation`` when no
    cuctx frame is found."""
    frame, code = _user_frame()
    where = f"{frame.f_code.co_filename}:{frame.f_lineno}" if frame is not None else "?"
    if code is None:
        return operation, where
    name = getattr(code, "co_qualname", code.co_name)
    if name.endswith(".__call__"):  # a launcher: kernel[grid, block](...)
        return f"{name.removesuffix('.__call__')}(...)", where
    return (name if "." in name else f"cuctx.{name}"), where


def _where(site: tuple[str, int, str] | None) -> str:
    return f"{site[0]}:{site[1]}" if site else "?"
