"""`SimDriver`: the virtual driver, composed from one mixin per concept.

Mixins cooperate through a few hooks that `ContextModel` defines and later models override
(always calling ``super()``): ``_synchronize_context`` (run queued work),
``_release_context_resources`` (free what a destroyed/reset context owned),
``_device_bytes_in_use`` (for cuMemGetInfo), ``_device_synchronized`` (a synchronize
returned: pools release memory) and ``_block_dropped`` (a block left the address space).
"""

from __future__ import annotations

import os
import threading

from ._common import h100_spec
from ._capture import CaptureModel
from ._capture_ops import CaptureOps
from ._contexts import ContextModel
from ._devices import DeviceQueries, SimDevice
from ._graph_conditional import ConditionalModel
from ._graph_dot import GraphDotModel
from ._graph_exec import GraphExecModel
from ._graph_memory import GraphMemoryModel
from ._graph_update import GraphUpdateModel
from ._graphs import GraphModel
from ._green import GreenModel
from ._ipc import IpcModel
from ._launches import LaunchModel
from ._library import LibraryModel
from ._managed import ManagedModel
from ._memory import MemoryModel
from ._occupancy import OccupancyModel
from ._peers import PeerModel
from ._pools import PoolModel
from ._streams import StreamModel


class _ThreadLocal(threading.local):
    """The sim driver's per-thread state, with its defaults as class attributes: the checks
    made at every call (`_in_host_function`, the context stack) read them without the
    AttributeError a missing attribute of a threading.local costs."""

    stack: list | None = None  # the context stack (ContextModel)
    host_functions = 0  # host functions running on this thread now (StreamModel)
    correlation: list | None = None  # external correlation ids pushed (sim controls)


class SimDriver(
    CaptureOps,
    CaptureModel,
    DeviceQueries,
    ConditionalModel,
    GraphDotModel,
    GraphMemoryModel,
    GraphUpdateModel,
    GraphExecModel,
    GraphModel,
    GreenModel,
    StreamModel,
    LaunchModel,
    OccupancyModel,
    LibraryModel,
    IpcModel,
    ManagedModel,
    MemoryModel,
    PoolModel,
    PeerModel,
    ContextModel,
):
    def __init__(self, devices: int = 2):
        if devices < 0:
            raise ValueError(f"the sim needs a device count >= 0, got {devices}")
        self._spec = h100_spec()
        self._initialized = False
        self._lock = threading.RLock()
        self._tls = _ThreadLocal()
        self._devices = [SimDevice(i, self._spec) for i in range(devices)]
        self._init_contexts()
        self._init_streams()
        self._init_memory()
        self._init_pools()
        self._init_ipc()
        self._init_managed()
        self._init_libraries()
        self._init_peers()
        self._init_graphs()
        self._init_graph_execs()
        self._init_capture()
        self._init_conditionals()
        self._init_green()


def from_env() -> SimDriver:
    """A sim with CUCTX_SIM_DEVICES devices (default 2; empty means the default). A module
    function, not a method: SimDriver's public names are cuda.bindings.driver's only."""
    text = os.environ.get("CUCTX_SIM_DEVICES", "").strip() or "2"
    try:
        count = int(text)
    except ValueError:
        count = -1
    if count < 0:
        raise ValueError(
            f"CUCTX_SIM_DEVICES must be a whole number of devices (0 or more), got {text!r}"
        )
    return SimDriver(count)
