"""The internal protocol: the fields every cuctx resource (Context, Stream, Event,
DeviceArray; Library, Module, Kernel) exposes to the others, on one base. It is also the
surface a compiled fast path reads, so it is plain slots: no properties on hot paths.

- ``_backend``: the `_driver.Backend` the object was made on (``_backend.driver`` is called).
- ``_ctx``: the Context it belongs to (a Context is its own). None for what is bound to no
  context: a Library (loaded for every context) and the kernels of one.
- ``_handle``: what the driver takes (CUcontext, CUstream, CUevent; a DeviceArray's address;
  CUlibrary, CUmodule; a Kernel's CUkernel or CUfunction).
- ``_key``: ``int(_handle)``, for dictionaries and identity tests.
- state: ``_ctx._state`` is ACTIVE, DESTROYED or POISONED; test it with one ``is`` comparison.
- pickling refuses with a TypeError that says what to do instead (``_instead``), except
  where a class shares itself with other processes (ipc arrays and events).
- ``_check(operation)``: raise the context's error (ContextDestroyedError or
  ContextPoisonedError naming ``operation``) unless it is active. Library and Module
  override it to refuse first what was unloaded (RuntimeError naming ``operation``; a
  Library has no context to test, a Module then tests its context); a Kernel's is its
  owner's.

The layers sit in one order (see docs/ARCHITECTURE.md): a lower layer never imports an upper
one. Where a lower layer must *make* an object of an upper one (Context.create(0) needs the
Device of ordinal 0; Event.record(None) needs a Stream), the upper module installs its
constructor in `upper` when it is imported, and the lower one calls it from there.
"""

from __future__ import annotations

from typing import Any, Callable

ACTIVE, DESTROYED, POISONED = "active", "destroyed", "poisoned"


class Handle(int):
    """A driver handle as an int that prints as every cuctx repr prints a handle, in hex
    (``0x5a5a00001000``): what cuctx hands out inside data (a timeline's records and summary)
    prints as its objects do. It is still an int: it compares, hashes and serializes (JSON)
    as one."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"{int(self):#x}"

    __str__ = __repr__


class Resource:
    __slots__ = ("_backend", "_ctx", "_handle", "_key")

    def __reduce__(self):
        """A driver object is valid only in the process that made it: pickling one refuses,
        naming the object and what to do instead (`_INSTEAD`). Arrays of an ipc pool and
        ipc events share themselves with other processes (their own ``__reduce__``)."""
        advice = next(
            (_INSTEAD[c.__name__] for c in type(self).__mro__ if c.__name__ in _INSTEAD),
            "it belongs to the process that made it",
        )
        raise TypeError(f"cannot pickle {self!r}: {advice}")

    def _check(self, operation: str) -> None:
        ctx = self._ctx
        if ctx._state is not ACTIVE:
            raise ctx._unusable(operation)


_LOADED = (
    "loaded code belongs to the process that loaded it: load the library in the other "
    "process (in an IsolatedExecutor call, in the function the worker runs: "
    "cuctx.Library.from_source or from_bytes there)"
)
_GRAPH = (
    "a graph holds this process's driver objects: build it in the other process (a "
    "function that builds it pickles)"
)
# What to send another process instead of each kind of resource (`Resource.__reduce__`).
_INSTEAD = {
    "Context": "a context belongs to the process that made it: in another process use that "
    "process's own (cuctx.Device(n).primary_context, or with cuctx.Device(n):)",
    "Stream": "a stream belongs to its process's context: make one in the other process "
    "(cuctx.Stream()) and order its work with this one's through an event of "
    "cuctx.Event(ipc=True), which pickles",
    "Library": _LOADED,
    "Module": _LOADED,
    "Kernel": _LOADED,
    "Graph": _GRAPH,
    "GraphExec": _GRAPH,
}


class _Upper:
    """Constructors of the upper layers, installed by their modules at import."""

    __slots__ = ("device", "stream", "resolve_stream", "capture", "memory_pool")

    device: type  # device.py: Device (Device(ordinal), Device._for_backend(backend, ordinal))
    stream: type  # stream.py: Stream
    resolve_stream: Callable[..., Any]  # stream.py: the one stream rule
    capture: Callable[..., Any]  # graphs/_capture.py: Stream.capture
    memory_pool: type  # memory/_pool.py: MemoryPool (MemoryPool._default_of(device))


upper = _Upper()
