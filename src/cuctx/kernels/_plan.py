"""Launch plans: what a launch does with arguments of one type signature, as data.

A `Packer` (one per kernel) holds the parameter layout (offsets and sizes from the driver,
types from the PTX when known, the dtypes pointer parameters take from the source:
`cuctx.kernels._dtypes`) and makes one `Plan` per signature of argument types. A plan is
immutable data: the exact types it was made for (the guard), and per parameter its offset,
size, struct code, kind, conversion (`cuctx.kernels._args.slot`) and, for a DeviceArray, the
dtypes the fast paths let through (a dtype is not a type: they compare the array's dtype
with these by identity; any other takes the checked path, whose conversion raises or
accepts it), with the one `struct.Struct` that packs them all. Everything that launches
reads the same plan: the checked path packs from it with `Plan.pack`;
`cuctx.kernels._codegen` turns it into the source of a launcher's fast path; the compiled
fast path (csrc/launch.c) reads the same fields.
"""

from __future__ import annotations

import ctypes
import struct
import threading
from dataclasses import dataclass
from math import prod
from typing import TYPE_CHECKING, NamedTuple

from . import _dtypes
from .. import _trace
from ._args import (
    ARRAY,
    INT_CODES,
    PACK_ERRORS,
    POINTER,
    Convert,
    KernelArgumentError,
    slot,
    traced_array,
)
from ..devcode._ptx import ParamType
from ..memory._array import DeviceArray

if TYPE_CHECKING:
    import numpy as np

    from ._dtypes import Expect
    from ._kernel import Kernel
    from ..stream import Stream


_new = tuple.__new__  # an Access from all its fields, without its Python-level __new__


class Param(NamedTuple):
    """One parameter of a plan: where it goes, how it packs, how its argument becomes the
    value to pack (``convert(arg, stream)``; None: the argument itself)."""

    offset: int
    size: int
    code: str  # struct code: "i", "f", "Q", "8s", ...
    kind: str  # cuctx.kernels._args: VALUE, ARRAY, POINTER or CONVERT
    convert: Convert | None
    dtypes: tuple[np.dtype, ...] | None  # an ARRAY's, which fast paths let through; None: any


@dataclass(frozen=True, slots=True, eq=False)
class Plan:
    """How arguments of one type signature become the kernel's parameter bytes. One per
    (kernel, signature), so a plan is its own identity (hashed and compared as an object)."""

    kernel: str  # the kernel's name, for names and messages
    types: tuple[type, ...]  # the guard: exactly these argument types
    params: tuple[Param, ...]
    layout: struct.Struct  # every parameter with its padding, packed in one call
    conversions: tuple[tuple[int, Convert], ...]  # (index, convert) of the params that have one
    pointers: tuple[int, ...]  # the indices of the pointer parameters (ARRAY, POINTER)

    def pack(self, buffer: bytearray, stream: Stream, args: tuple) -> None:
        """Convert and pack ``args`` (of this plan's types) into ``buffer``; raises
        PACK_ERRORS for a value its code cannot hold (`pack_slowly` says which)."""
        if self.conversions:
            args = list(args)
            for index, convert in self.conversions:
                args[index] = convert(args[index], stream)
        self.layout.pack_into(buffer, 0, *args)

    def accesses(
        self, args: tuple, stream: Stream, modes: tuple[str, ...]
    ) -> tuple[_trace.Access, ...]:
        """The device memory the launch may touch, for the trace: every array argument in
        its parameter's mode (`cuctx.kernels._access.modes`). Plain ints are addresses the caller
        vouches for, with no known extent: none."""
        out = []
        for i in self.pointers:
            arg = args[i]
            if type(arg) is DeviceArray and arg._c:  # (most launches: device_access inline)
                out.append(
                    _new(
                        _trace.Access,
                        (arg.ptr, prod(arg.shape) * arg.dtype.itemsize, modes[i], arg, False),
                    )
                )
            else:
                out.append(_trace.device_access(traced_array(arg, stream), modes[i]))
        return tuple(out)


class Packer:
    """A kernel's parameter layout (offsets and sizes from the driver, types from its PTX
    when known) and its plans, one per argument type signature, made on first use and
    shared by its launchers."""

    __slots__ = ("kernel", "params", "types", "expects", "size", "plans", "lock")

    def __init__(self, kernel: Kernel, params: tuple, types: tuple[ParamType, ...] | None):
        self.kernel = kernel
        self.params = params  # ((offset, size), ...)
        self.types = types  # one ParamType per parameter, or None: sizes only
        self.expects: tuple[Expect | None, ...] | None = None  # see `expected`
        self.size = max((o + s for o, s in params), default=0)
        self.plans: dict[tuple[type, ...], Plan] = {}
        self.lock = threading.Lock()

    def expected(self) -> tuple[Expect | None, ...]:
        """Per parameter, the arrays it takes (None: any argument). Read on first use: a
        library's twin checks make its kernels' packers before it has its source."""
        if self.expects is None:
            self.expects = _dtypes.expects(self.kernel)
        return self.expects

    def retype(self) -> None:
        """The kernel's dtypes changed (`Kernel.set_dtypes`): read anew, plans start over."""
        with self.lock:
            self.expects = None
            self.plans = {}

    def plan(self, args: tuple) -> Plan:
        """The plan for the types of ``args``; checks their count, types and sizes."""
        key = tuple(map(type, args))
        plan = self.plans.get(key)
        if plan is None:
            with self.lock:
                plan = self.plans.get(key) or self._make(key, args)
                self.plans[key] = plan
        return plan

    def _make(self, types: tuple[type, ...], args: tuple) -> Plan:
        if len(args) != len(self.params):
            raise KernelArgumentError(
                f"kernel {self.kernel.name!r} takes {len(self.params)} argument(s) "
                f"(parameter sizes {[s for _, s in self.params]} bytes), got {len(args)}"
            )
        self.expected()
        fmt, pos, params = ["<"], 0, []
        for index, ((offset, size), arg) in enumerate(zip(self.params, args)):
            code, kind, convert, dtypes = slot(self, index, arg)
            fmt.append("x" * (offset - pos) + code)
            pos = offset + size
            params.append(Param(offset, size, code, kind, convert, dtypes))
        conversions = tuple((i, p.convert) for i, p in enumerate(params) if p.convert)
        pointers = tuple(i for i, p in enumerate(params) if p.kind in (ARRAY, POINTER))
        return Plan(
            self.kernel.name,
            types,
            tuple(params),
            struct.Struct("".join(fmt)),
            conversions,
            pointers,
        )

    def buffers(self) -> tuple[bytearray, ctypes.Array | None]:
        """A parameter buffer and a ``void*`` array pointing into it (None without
        parameters), which the driver reads at each launch."""
        buffer = bytearray(max(self.size, 1))
        if not self.params:
            return buffer, None
        base = ctypes.addressof((ctypes.c_char * len(buffer)).from_buffer(buffer))
        pointers = (ctypes.c_void_p * len(self.params))(
            *[base + offset for offset, _ in self.params]
        )
        return buffer, pointers

    def describe(self, index: int) -> str:
        offset, size = self.params[index]
        typed = f"{self.types[index].describe()}; " if self.types else ""
        return (
            f"parameter {index} of kernel {self.kernel.name!r} ({typed}offset {offset}, "
            f"{size} bytes)"
        )

    def type_of(self, index: int) -> ParamType | None:
        """The parameter's type where it decides the conversion; None: by size only."""
        if self.types is None or self.types[index].kind == "other":
            return None
        return self.types[index]


def pack_slowly(packer: Packer, plan: Plan, args: tuple, stream: Stream, buffer: bytearray) -> None:
    """Pack ``args`` one by one into ``buffer``, with clear errors: the path for values the
    plan's codes rejected (unsigned values for a signed code, values out of range)."""
    for index, (p, arg) in enumerate(zip(plan.params, args)):
        value = arg if p.convert is None else p.convert(arg, stream)
        try:
            try:
                data = struct.pack("<" + p.code, value)
            except PACK_ERRORS:
                if p.code not in INT_CODES.values():
                    raise
                # C's conversion: values up to the unsigned maximum fit as well.
                data = int(value).to_bytes(p.size, "little", signed=int(value) < 0)
        except PACK_ERRORS as exc:
            raise KernelArgumentError(
                f"{packer.describe(index)} cannot hold {arg!r}: {exc}"
            ) from None
        buffer[p.offset : p.offset + p.size] = data
