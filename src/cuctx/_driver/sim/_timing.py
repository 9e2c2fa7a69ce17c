"""The sim's timing model: every constant with its source, the engines work books, and the
activity records the timeline reads.

What an operation costs on the virtual clock (``duration``):

- host<->device copies: ``COPY_LATENCY_NS`` + bytes at ``PINNED_BYTES_PER_NS`` (page-locked
  host memory) or ``PAGEABLE_BYTES_PER_NS`` (pageable, which is also synchronous);
- kernels: ``LAUNCH_NS`` + the bytes their twin touched (every ``SimPointer.view``) at
  ``HBM_BYTES_PER_NS`` times the share of the SMs their grid fills (one block per SM: a grid
  of 66 blocks on 132 SMs reaches half the bandwidth); a twin may declare its own time
  instead: ``twin.cost_ns``, an int or ``cost_ns(grid, block, *args) -> int``;
- device-to-device copies and memsets: ``LAUNCH_NS`` + bytes read and written at HBM
  bandwidth (they run as kernels on a GPU, on all SMs);
- copies between devices ("memcpy PtoP"): ``COPY_LATENCY_NS`` + bytes at
  ``PEER_BYTES_PER_NS`` where one device has access to the other's memory (peer access: a
  copy engine moves them over the link), else at ``PEER_STAGED_BYTES_PER_NS`` (the driver
  stages them through host memory; cuMemcpyPeerAsync only, a device-to-device copy of two
  devices' pointers needs the access);
- a stream waiting for an event of another device: ``CROSS_DEVICE_WAIT_NS`` after the event;
- host functions, ``sim.stream_busy``, event records and other waits: their fixed cost only.

Where an operation runs (``Engines.place``): each device has one copy engine per direction
(HtoD, DtoH; the H100 has more engines, but one direction's copies share the PCIe link, so
two HtoD copies never go faster than one), one for copies between devices that its streams
issue (they share its links, staged or not), and the SMs. Copies of one engine never
overlap. On the SMs, kernels (and DtoD copies, memsets) of one context run side by side as
long as their shares add up to at most the whole; kernels of *different* contexts never
overlap: the GPU runs one context at a time and switches between them (time slicing);
green contexts on disjoint SM partitions run side by side. An operation starts at the
earliest time, at or after it is ready, when its engine has room for all of it (a later
booking may fill an earlier gap).

Not modelled: preemption of a kernel longer than the time slice by another context's work
(the sim runs the kernel to its end, then switches), compute-bound kernels (only bytes
count), caches, PCIe contention between the two directions.
"""

from __future__ import annotations

from typing import NamedTuple

# -- constants (one place; each with where it comes from) ---------------------------------

# Page-locked copies over PCIe Gen5 x16 on the H100 80GB HBM3 the project measures on:
# about 55 GB/s each direction (issue 10, measured with benchmarks/bandwidth.py).
PINNED_BYTES_PER_NS = 55.0
# Pageable copies are staged by the driver through its own pinned buffers: an estimate of
# half the pinned rate (not measured; they are synchronous, so overlap never depends on it).
PAGEABLE_BYTES_PER_NS = 27.0
# The H100 SXM5 80GB's HBM3 bandwidth from NVIDIA's datasheet: 3.35 TB/s. A kernel reads
# and writes; the bytes its twin views count once each.
HBM_BYTES_PER_NS = 3350.0
# What a kernel costs beyond its bytes: launch and drain on the GPU, about 2 us back to back
# (the sim's earlier flat kernel cost; cuctx's launch benchmark measures the host side).
LAUNCH_NS = 2000
# What a copy costs beyond its bytes: the copy engine's setup, about 2 us for a small pinned
# copy on an H100.
COPY_LATENCY_NS = 2000
# Copies between two H200s joined by NVLink, 256 MiB each way on a stream of the destination
# device, measured with benchmarks/peer.py (issue 21): 390 GB/s with peer access enabled
# both ways, 37 GB/s without it (the driver stages the bytes through host memory).
PEER_BYTES_PER_NS = 390.0
PEER_STAGED_BYTES_PER_NS = 37.0
# A stream of one device waiting for an event recorded on another: benchmarks/peer.py's host
# round trip (record on device 0, wait on device 1, record there, synchronize that record)
# took 6 us on those H200s. The sim books it all on the wait, as the time from the event to
# the waiting stream's next work (its records and the host's calls cost nothing here).
CROSS_DEVICE_WAIT_NS = 6000
# The time slice between contexts: `nvidia-smi compute-policy --set-timeslice` names
# default/short/medium/long; SHORT is 2 ms. Documented here because the model does not
# preempt (see above); the timeline example uses kernels shorter than it.
TIMESLICE_NS = 2_000_000
# How many bookings each engine keeps to find gaps in (older ones are over for good).
_KEEP = 64

# -- host costs: what AutoGraph decides from on the sim -------------------------------------
# What the host side of cuctx costs on an H100 80GB HBM3 (driver 580), per operation: the one
# place AutoGraph's host-cost model is calibrated. The sim's clock models the GPU's work, not
# the host's, so `@cuctx.autograph`'s cost policy (graphs/_autograph_policy.py) reads these
# instead of timing the sim's own Python: the same calls are graphed on the sim as on that GPU,
# from run to run. On a GPU they are the policy's first estimates, replaced by what it
# measures; benchmarks/autograph.py prints the measured values beside these, and the sim's
# decisions beside the GPU's for its loops.
#
# Calibrated on an H100 (driver 580), benchmarks/autograph.py on the compiled paths, one run
# (its "host-cost model" lines print these beside what it measures), once AutoGraph built its
# graphs in C: the earlier figures (a build 55.7 us and 10.4 us a node) had the sim build
# where the GPU still ran eagerly (9 eager calls of the 64-call loop against the GPU's 22).
#
# An eager call of an autograph function: a fixed part (the function run with a recorder,
# the call's bookkeeping), 7.3 us measured (the 64-call loop's calls of 4 operations took
# 21.9 us: without it the sim built its first structure never, where the GPU did at call 8),
# plus each recorded operation enqueued eagerly (a launch through the compiled launcher from
# its packed bytes): 3.64 us measured.
HOST_EAGER_CALL_NS = 7_300
HOST_EAGER_OP_NS = 3_640
# A graph call's launch, its patches aside: 2.88 us measured.
HOST_GRAPH_LAUNCH_NS = 2_880
# Each node of a launch, on the host: an estimate (not measured): the driver launches a
# straight-line graph in about constant host time, whatever its length.
HOST_REPLAY_NODE_NS = 50
# A kernel node patched from its packed bytes by the compiled path: 0.45 us measured.
HOST_PATCH_NODE_NS = 450
# A build: the graph made from the recorded bytes (kernel nodes added from C) and
# instantiated, a fixed part and a part per node, fitted from the builds of the run: 5.63 us
# a node (the C program's capture + instantiate: 2.53 us a node), and a fixed part that moves
# with the host: 197.1, 167.8 and 114.5 us in three H100 runs, of which the mean is taken.
# (At 197.1 the sim never built the 64-call loop's second structure, which the GPU built at
# its second call in the run that measured 114.5.)
HOST_BUILD_FIXED_NS = 159_800
HOST_BUILD_NODE_NS = 5_630
# Each node of a whole update: the graph made again as for a build, then cuGraphExecUpdate
# (about as much again as an instantiation): an estimate, not measured.
HOST_WHOLE_NODE_NS = 5_000

KERNEL, HTOD, DTOH, DTOD, HTOH = (
    "kernel",
    "memcpy HtoD",
    "memcpy DtoH",
    "memcpy DtoD",
    "memcpy HtoH",
)
PTOP = "memcpy PtoP"  # between devices (CUPTI's name)
MEMSET, HOST, BUSY = "memset", "host", "busy"
ON_SMS = (KERNEL, DTOD, MEMSET)  # kinds that run on the SMs
_ENGINE = {HTOD: "HtoD", DTOH: "DtoH", PTOP: "peer", **{kind: "sms" for kind in ON_SMS}}


class Activity(NamedTuple):
    """One executed operation, as the sim's activity feed hands it to subscribers
    (``backend.sim.subscribe_activity``); times are on the virtual clock, in ns."""

    kind: str
    name: str
    device: int
    context: int
    stream: int
    queued_ns: int
    start_ns: int
    end_ns: int
    correlation: int | None
    bytes: int


def duration(kind: str | None, nbytes: int, width: float, pageable: bool = False) -> int:
    """What the timing model gives an operation of ``kind`` moving ``nbytes`` (see the
    module docstring); ``width``: the share of the SMs a kernel's grid fills."""
    if kind in (HTOD, DTOH):
        rate = PAGEABLE_BYTES_PER_NS if pageable else PINNED_BYTES_PER_NS
        return COPY_LATENCY_NS + int(-(-nbytes // rate))
    if kind == HTOH:
        return COPY_LATENCY_NS + int(-(-nbytes // PAGEABLE_BYTES_PER_NS))
    if kind == PTOP:
        return peer_copy_time(nbytes, direct=True)
    if kind == KERNEL:
        return LAUNCH_NS + kernel_time(nbytes, width)
    if kind in (DTOD, MEMSET):
        return LAUNCH_NS + int(-(-(2 * nbytes if kind == DTOD else nbytes) // HBM_BYTES_PER_NS))
    return 0


def copy_kind(source_host: bool, target_host: bool, between_devices: bool = False) -> str:
    """The activity kind of a copy between host (True) or device memory (of two devices:
    ``between_devices``)."""
    if between_devices and not (source_host or target_host):
        return PTOP
    return ((HTOH, DTOH), (HTOD, DTOD))[not source_host][not target_host]


def peer_copy_time(nbytes: int, direct: bool) -> int:
    """A copy of ``nbytes`` between devices: over the link where one has access to the
    other's memory (``direct``), else staged through host memory."""
    rate = PEER_BYTES_PER_NS if direct else PEER_STAGED_BYTES_PER_NS
    return COPY_LATENCY_NS + int(-(-nbytes // rate))


def kernel_time(nbytes: int, width: float) -> int:
    """A kernel's time on the SMs beyond its launch: ``nbytes`` at the HBM bandwidth its
    share ``width`` of the SMs reaches."""
    return int(-(-nbytes // (HBM_BYTES_PER_NS * max(width, 1e-3))))


class _Booking:
    __slots__ = ("start", "end", "owner", "sms", "width")

    def __init__(self, start: int, end: int, owner: int, sms: frozenset | None, width: float):
        self.start, self.end, self.owner, self.sms, self.width = start, end, owner, sms, width


class Engines:
    """The engines of one device and what is booked on them."""

    def __init__(self) -> None:
        self._booked: dict[str, list[_Booking]] = {"HtoD": [], "DtoH": [], "peer": [], "sms": []}

    def place(
        self, kind: str, ready: int, length: int, owner: int, sms: frozenset | None, width: float
    ) -> int:
        """Book ``length`` ns for an operation of ``kind`` ready at ``ready`` and return its
        start. ``owner``: its context's handle; ``sms``: its green context's SM partition
        (None: all SMs); ``width``: its share of them."""
        engine = _ENGINE.get(kind)
        if engine is None or length <= 0:
            return ready
        booked = self._booked[engine]
        start = ready
        for candidate in sorted({ready, *(b.end for b in booked if b.end > ready)}):
            if self._fits(engine, booked, candidate, candidate + length, owner, sms, width):
                start = candidate
                break
        booked.append(_Booking(start, start + length, owner, sms, width))
        if len(booked) > _KEEP:
            booked.sort(key=lambda b: b.end)
            del booked[: len(booked) - _KEEP]
        return start

    @staticmethod
    def _fits(engine, booked, start, end, owner, sms, width) -> bool:
        used = width
        for b in booked:
            if b.start >= end or b.end <= start:
                continue
            if engine != "sms":
                return False  # a copy engine does one copy at a time
            if sms is not None and b.sms is not None and not sms & b.sms:
                continue  # green contexts on disjoint SMs
            if b.owner != owner:
                return False  # another context: they take turns
            used += b.width
            if used > 1.0 + 1e-9:
                return False
        return True
