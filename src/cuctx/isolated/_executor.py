"""`IsolatedExecutor`: a `concurrent.futures.Executor` whose calls run in worker processes,
one device each, so that a fault, a hang or a crash costs one worker and not the program."""

from __future__ import annotations

import atexit
import sys
import weakref
from concurrent.futures import Executor, Future
from typing import Any, Callable, Iterable

from ..device import Device, devices as all_devices
from ..memory import DeviceArray
from . import _wire
from ._core import Call, CallFuture, Core, WorkerInfo
from ._unsendable import unsendable

_UNSET: Any = object()
ENGINES = ("process", "ray")


class IsolatedExecutor(Executor):
    """Runs calls in worker processes, each with one device's primary context current.

    ``devices``: ordinals or `Device` objects (default: every device); ``workers_per_device``
    workers each. ``engine``: ``"process"`` (workers on this machine) or ``"ray"`` (one Ray
    actor per worker; ``address`` joins an existing Ray cluster, default: a local one).
    ``standby``: keep one started worker per device ready to replace a lost one.
    ``timeout``: seconds a call may run in its worker (waiting for a free worker does not
    count); past it the worker is killed. `options` sets both per call.

    A call that faults raises `WorkerFaultError`, one past its timeout `WorkerTimeoutError`,
    one whose worker died otherwise `WorkerDiedError`: the worker is replaced, the call is
    not retried, everything else goes on. An exception ``fn`` raises is the call's exception
    (its traceback in the worker is the ``__cause__``) and costs no worker.
    docs/isolation.md explains the model.
    """

    def __init__(
        self,
        devices: Iterable[Device | int] | None = None,
        engine: str = "process",
        workers_per_device: int = 1,
        standby: bool = False,
        timeout: float | None = None,
        *,
        address: str | None = None,
    ) -> None:
        self._devices = _ordinals(devices)
        _check_settings(engine, workers_per_device, standby, address)
        self._timeout = _seconds(timeout)
        core = Core(self._devices, workers_per_device)
        if engine == "ray":
            from ._ray import RayEngine  # Ray is an optional extra

            self._engine = RayEngine(core, standby, address)
        else:
            from ._process import ProcessEngine

            self._engine = ProcessEngine(core, standby)
        self._core = core
        _live.add(self._engine)
        # Dropped without shutdown: the workers end once the calls already submitted are done.
        weakref.finalize(self, self._engine.shutdown, False, False).atexit = False

    def submit(self, fn: Callable, /, *args: Any, **kwargs: Any) -> Future:
        """Run ``fn(*args, **kwargs)`` in a worker; a Future of its result. ``fn`` and the
        arguments go by pickle (by value for what the worker cannot import); a `DeviceArray`
        from a ``MemoryPool(device, ipc=True)`` is the same memory in the worker."""
        return self._submit(fn, args, kwargs, None, self._timeout)

    def _submit(
        self, fn: Callable, args: tuple, kwargs: dict, device: int | None, timeout: float | None
    ) -> Future:
        if not callable(fn):
            raise TypeError(f"submit needs a callable, not {type(fn).__name__}")
        name = getattr(fn, "__qualname__", type(fn).__qualname__)
        arrays: list[DeviceArray] = []
        try:
            fn_bytes = _wire.function_bytes(fn)
            args_bytes = _wire.arguments(args, kwargs, lambda: self._engine.reductions(arrays))
        except Exception as exc:  # noqa: BLE001 - a pickling error may be of any type
            raise unsendable(fn, name, args, kwargs, self._engine.reductions([]), exc) from exc
        if arrays:  # the worker sees shared arrays as the caller left them: queued work first
            for ctx in {id(a.context): a.context for a, _ in arrays}.values():
                ctx.synchronize()
        call = Call(CallFuture(), name, fn_bytes, args_bytes, arrays, device, timeout)
        slot = self._core.submit(call)
        if slot is not None:
            self._engine.dispatch(slot, call)
        return call.future

    def options(
        self, *, device: Device | int | None = _UNSET, timeout: float | None = _UNSET
    ) -> _Options:
        """A view of this executor whose `submit` and `map` run calls on ``device`` (one of
        the executor's; None: any) with ``timeout`` (seconds; None: none)."""
        return _Options(self, None, self._timeout).options(device=device, timeout=timeout)

    @property
    def devices(self) -> list[int]:
        """The ordinals of the devices this executor runs calls on."""
        return list(self._devices)

    @property
    def workers(self) -> list[WorkerInfo]:
        """Each worker: its device, its process id (None while a replacement starts) and how
        many times it was replaced."""
        return self._core.workers()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Take no more calls. ``cancel_futures``: cancel the calls still waiting for a
        worker. ``wait``: return when every call is done and every worker has exited;
        otherwise the workers exit by themselves once their calls are done."""
        self._engine.shutdown(wait, cancel_futures)

    def __exit__(self, exc_type, exc_val, exc_tb) -> bool:
        # Ctrl-C in the block: its calls are not waited for (one may hang); the workers are
        # killed, calls and all. Anything else: `shutdown`, as concurrent.futures does.
        if exc_type is not None and issubclass(exc_type, KeyboardInterrupt):
            self._engine.abort(True)
        else:
            self.shutdown(wait=True)
        return False

    def __repr__(self) -> str:
        state = " shut down" if self._core.shutting_down else ""
        return (
            f"<IsolatedExecutor {type(self._engine).__name__.removesuffix('Engine').lower()}"
            f" devices={self._devices} workers={len(self._core.slots)}{state}>"
        )


class _Options:
    """`IsolatedExecutor.options`: submit and map with a device and a timeout of their own."""

    def __init__(
        self, executor: IsolatedExecutor, device: int | None, timeout: float | None
    ) -> None:
        self._executor = executor
        self._device = device
        self._timeout = timeout

    def options(
        self, *, device: Device | int | None = _UNSET, timeout: float | None = _UNSET
    ) -> _Options:
        """These settings, with the ones given replaced."""
        if device is not _UNSET and device is not None:
            device = _ordinal(device)
            if device not in self._executor._devices:
                raise ValueError(
                    f"device {device} is not one of this executor's devices "
                    f"{self._executor._devices}"
                )
        return _Options(
            self._executor,
            self._device if device is _UNSET else device,
            self._timeout if timeout is _UNSET else _seconds(timeout),
        )

    def submit(self, fn: Callable, /, *args: Any, **kwargs: Any) -> Future:
        """`IsolatedExecutor.submit` with these settings."""
        return self._executor._submit(fn, args, kwargs, self._device, self._timeout)

    map = Executor.map  # the standard map, over this view's submit

    def __repr__(self) -> str:
        return f"<{self._executor!r} options device={self._device} timeout={self._timeout}>"


def _given(value: Any) -> str:
    return f"{type(value).__name__} {value!r}"


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_settings(engine: Any, workers_per_device: Any, standby: Any, address: Any) -> None:
    """Each setting of `IsolatedExecutor` but devices and timeout: TypeError for the wrong
    kind of value, ValueError for a wrong value; each says what it accepts."""
    accepted = " or ".join(map(repr, ENGINES))
    if not isinstance(engine, str):
        raise TypeError(f"engine is {accepted}, not the {_given(engine)}")
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {accepted}, not {engine!r}")
    if not _whole(workers_per_device):
        raise TypeError(
            f"workers_per_device is a whole number >= 1, not the {_given(workers_per_device)}"
        )
    if workers_per_device < 1:
        raise ValueError(
            f"workers_per_device must be a whole number >= 1, not {workers_per_device}"
        )
    if not isinstance(standby, bool):
        raise TypeError(f"standby is True or False, not the {_given(standby)}")
    if address is not None and not isinstance(address, str):
        raise TypeError(
            f"address is a Ray cluster's address, a str such as "
            f"'10.0.0.5:6379', or None; not the {_given(address)}"
        )
    if address is not None and engine != "ray":
        raise ValueError("address= names a Ray cluster: it needs engine='ray'")


def _seconds(timeout: float | None) -> float | None:
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"timeout is a number of seconds > 0, or None; not the {_given(timeout)}")
    if not timeout > 0:  # (NaN too)
        raise ValueError(f"timeout must be a number of seconds > 0, or None, not {timeout!r}")
    return float(timeout)


def _ordinal(device: Device | int) -> int:
    if isinstance(device, Device):
        return device.ordinal
    if not _whole(device):
        raise TypeError(f"a device is a cuctx.Device or an ordinal (int), not the {_given(device)}")
    return device


def _ordinals(devices: Iterable[Device | int] | None) -> list[int]:
    if devices is not None and (
        isinstance(devices, (str, bytes, Device)) or not hasattr(devices, "__iter__")
    ):
        raise TypeError(
            f"devices is a list of ordinals or cuctx.Device objects (devices=[0] "
            f"for device 0 alone), or None for every device; not the "
            f"{_given(devices)}"
        )
    count = len(all_devices())
    if devices is None:
        ordinals = list(range(count))
    else:
        ordinals = [_ordinal(d) for d in devices]
    if not ordinals:
        raise ValueError(
            "an IsolatedExecutor needs at least one device, and "
            + ("none was given" if devices is not None else "there is none")
        )
    for ordinal in ordinals:
        if not 0 <= ordinal < count:
            raise ValueError(f"there is no device {ordinal}: valid ordinals are 0 to {count - 1}")
    if len(set(ordinals)) != len(ordinals):
        raise ValueError(
            f"devices lists a device twice ({ordinals}): use "
            "workers_per_device for more workers on one device"
        )
    return ordinals


_live: weakref.WeakSet = weakref.WeakSet()


@atexit.register
def _shutdown_at_exit() -> None:
    # As for concurrent.futures' executors, the program ends once submitted calls are done;
    # unless Ctrl-C ends it (Python has then set sys.last_value, or last_exc, to the
    # KeyboardInterrupt by the time atexit runs): the workers are killed, even in the
    # middle of a call that hangs.
    ended_by = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
    for engine in list(_live):
        if isinstance(ended_by, KeyboardInterrupt):
            engine.abort(False)
        else:
            engine.shutdown(True, False)
