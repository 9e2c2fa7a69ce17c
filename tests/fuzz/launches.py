"""Kernel launches with random configurations and argument lists (valid and not), on top of
`ArrayMachine`: the model decides from the device's limits whether the configuration is
valid and from the parameter kinds whether the arguments are, and computes the result."""

from __future__ import annotations

from math import prod

import numpy as np
from hypothesis import strategies as st
from hypothesis.stateful import rule

import cuctx
from cuctx import KernelArgumentError, LaunchConfigError

from . import strategies as S
from .arrays import ArrayMachine
from .expect import combine, fail, usable
from .machine import ContextMachine, ok
from .model import Arr, StreamRec

POINTER_MISUSE = st.sampled_from(["host array", "string", "list", "none"])


def dims(value) -> tuple[int, int, int] | None:
    """(x, y, z) of a grid, block or cluster as `cuctx.launch` reads it; None if malformed."""

    def is_int(v):
        return isinstance(v, (int, np.integer)) and not isinstance(v, bool)

    if is_int(value):
        d = (int(value),)
    elif isinstance(value, (tuple, list)) and 1 <= len(value) <= 3 and all(map(is_int, value)):
        d = tuple(int(v) for v in value)
    else:
        return None
    d += (1,) * (3 - len(d))
    return d if min(d) >= 1 else None


class LaunchMachine(ArrayMachine):
    def config_ok(self, kernel: str, grid, block, shared, cluster, cooperative) -> bool:
        """Whether the device runs this configuration (issue: the checks name the limit)."""
        lim = self.env.limits
        g, b = dims(grid), dims(block)
        if g is None or b is None:
            return False
        if any(n > m for n, m in zip(g, lim["grid"])) or any(
            n > m for n, m in zip(b, lim["block"])
        ):
            return False
        if prod(b) > min(lim["threads"], lim["kernel_threads"][kernel]):
            return False
        if (
            isinstance(shared, bool)
            or not isinstance(shared, int)
            or shared < 0
            or shared > lim["shared_optin"] - lim["static_shared"][kernel]
        ):
            return False
        if cluster is not None:
            c = dims(cluster)
            if c is None or not lim["clusters"] or any(x % y for x, y in zip(g, c)) or prod(c) > 8:
                return False
        if cooperative:  # the grid must be resident at once
            per_sm = self.env.library[kernel].occupancy(prod(b), shared)
            if prod(g) > per_sm * lim["sms"]:
                return False
        return True

    def launch(
        self,
        kernel: str,
        args: list,
        arg_conds: list,
        pointers: list[Arr],
        writes,
        grid,
        block,
        shared,
        cluster,
        cooperative,
        s: StreamRec | None,
        form: bool,
    ):
        """Launch with the model's expectation; on success apply ``writes()`` to the model."""
        if any(a.dev.ptr % a.dev.dtype.itemsize for a in pointers):
            return  # a misaligned pointer (a view as another dtype): a fault, sticky on a GPU
        conds = list(arg_conds)
        if not self.config_ok(kernel, grid, block, shared, cluster, cooperative):
            conds.append(fail(LaunchConfigError))
        rec = s.ctx if s is not None else (self.top() or self.primary())
        conds.append(usable(rec))
        conds.extend(usable(a.ctx) for a in pointers)
        expect = combine(*conds)
        if expect is None:
            self.order(s or self.legacy(rec), pointers)
        fn = self.env.library[kernel]
        stream = None if s is None else s.stream
        if form and cluster is None and not cooperative:
            call = lambda: fn[grid, block, shared, stream](*args)
        else:
            call = lambda: cuctx.launch(
                fn,
                grid,
                block,
                *args,
                shared_mem=shared,
                stream=stream,
                cluster=cluster,
                cooperative=cooperative,
            )
        what = (
            f"{kernel}[{grid!r}, {block!r}, {shared!r}, {s}](cluster={cluster!r}, "
            f"cooperative={cooperative}) with {args!r}"
        )
        if ok(self.call(what, expect, call)) and expect is None:
            writes()

    def pointer_arg(self, arr: Arr, dtype: str, misuse: str | None):
        """(argument, condition, the Arr it points into or None) for a pointer parameter."""
        if misuse == "host array":
            return np.zeros(3, dtype), fail(KernelArgumentError), None
        if misuse == "string":
            return "ptr", fail(KernelArgumentError), None
        if misuse == "list":
            return [0.0], fail(KernelArgumentError), None
        if misuse == "none":
            return None, None, None  # a null pointer: valid while nothing is touched
        return arr.dev, None, arr

    def room(self, arr: Arr | None, itemsize: int) -> int:
        return 0 if arr is None else self.pointer_room(arr, itemsize)

    def flat(self, arr: Arr, dtype, n: int):
        """The model's view of ``n`` elements from the array's address (what a kernel sees)."""
        offset = arr.dev.ptr - arr.base.dev.ptr
        size = np.dtype(dtype).itemsize
        values = arr.base.bytes[offset : offset + size * n].view(dtype)
        known = arr.base.known[offset : offset + size * n].reshape(n, size)
        return values, known

    @rule(
        y=ArrayMachine.arrays,
        x=ArrayMachine.arrays,
        a=S.scalar_args("f32"),
        n=st.one_of(st.sampled_from(["room", "room", "zero", "negative"]), S.scalar_args("i32")),
        misuse=st.none() | POINTER_MISUSE,
        grid=S.configs_dims,
        block=S.configs_dims,
        shared=S.shared_mems,
        s=st.none() | ContextMachine.streams,
        form=st.booleans(),
        count_change=st.sampled_from([0, 0, 0, -1, 1]),
    )
    def launch_axpy(self, y, x, a, n, misuse, grid, block, shared, s, form, count_change):
        self.count("launch_axpy")
        if y.dev.dtype != np.float32 or x.dev.dtype != np.float32:
            return
        yarg, ycond, yarr = self.pointer_arg(y, "float32", misuse)
        room = min(self.room(yarr, 4) if misuse is None else 0, self.room(x, 4))
        if isinstance(n, str):
            nval = {"room": room, "zero": 0, "negative": -3}[n]
            narg, ncond = nval, None
        else:
            narg, nval = n
            ncond = None if nval is not None else fail(KernelArgumentError)
            if nval is not None and nval > room:
                return  # out of bounds: a fault on the sim, silent corruption on a GPU
        aarg, aval = a
        acond = None if aval is not None else fail(KernelArgumentError)
        if nval is not None and nval > 0 and yarr is not None and x.base is y.base:
            ybytes = (yarr.dev.ptr, yarr.dev.ptr + 4 * nval)
            xbytes = (x.dev.ptr, x.dev.ptr + 4 * nval)
            if ybytes != xbytes and xbytes[0] < ybytes[1] and ybytes[0] < xbytes[1]:
                return  # overlapping in and out ranges: undefined in CUDA
        args = [yarg, x.dev, aarg, narg]
        args, ccond = self.change_count(args, count_change)

        def writes():
            if nval is None or nval <= 0:
                return
            yv, yk = self.flat(yarr, np.float32, nval)
            xv, xk = self.flat(x, np.float32, nval)
            yv[:] = yv + np.float32(aval) * xv.copy()
            yk[:] &= xk.copy()

        pointers = [p for p in (yarr, x) if p is not None]
        self.launch(
            "axpy",
            args,
            [ycond, ncond, acond, ccond],
            pointers,
            writes,
            grid,
            block,
            shared,
            None,
            False,
            s,
            form,
        )

    @rule(
        out=ArrayMachine.arrays,
        start=st.one_of(
            S.scalar_args("i64"), st.sampled_from([(2**63 - 1, 2**63 - 1), (-(2**63), -(2**63))])
        ),
        n=st.sampled_from(["room", "room", "zero", "negative"]),
        misuse=st.none() | POINTER_MISUSE,
        grid=S.configs_dims,
        block=S.configs_dims,
        shared=S.shared_mems,
        s=st.none() | ContextMachine.streams,
        form=st.booleans(),
        count_change=st.sampled_from([0, 0, 0, -1, 1]),
    )
    def launch_iota(self, out, start, n, misuse, grid, block, shared, s, form, count_change):
        self.count("launch_iota")
        if out.dev.dtype != np.int64:
            return
        oarg, ocond, oarr = self.pointer_arg(out, "int64", misuse)
        nval = {"room": self.room(oarr, 8), "zero": 0, "negative": -3}[n]
        sarg, sval = start
        scond = None if sval is not None else fail(KernelArgumentError)
        args, ccond = self.change_count([oarg, sarg, nval], count_change)

        def writes():
            if nval > 0:
                v, k = self.flat(oarr, np.int64, nval)
                v[:] = np.int64(sval) + np.arange(nval, dtype=np.int64)
                k[:] = True

        self.launch(
            "iota",
            args,
            [ocond, scond, ccond],
            [oarr] if oarr is not None else [],
            writes,
            grid,
            block,
            shared,
            None,
            False,
            s,
            form,
        )

    @rule(
        counter=ArrayMachine.arrays,
        grid=S.configs_dims,
        block=S.configs_dims,
        shared=S.shared_mems,
        cluster=S.clusters,
        cooperative=st.booleans(),
        s=st.none() | ContextMachine.streams,
        form=st.booleans(),
        count_change=st.sampled_from([0, 0, 0, -1, 1]),
    )
    def launch_count(
        self, counter, grid, block, shared, cluster, cooperative, s, form, count_change
    ):
        """Every thread of the configuration adds one: checks the grid and block launched."""
        self.count("launch_count")
        if counter.dev.dtype != np.uint32 or self.pointer_room(counter, 4) < 1:
            return
        args, ccond = self.change_count([counter.dev], count_change)
        g, b = dims(grid), dims(block)
        if cluster is not None and (b is None or prod(b) > 256 or shared not in (0, 16, 1024)):
            cluster = None  # clusters of big blocks may not fit a GPU's processor clusters

        def writes():
            v, _ = self.flat(counter, np.uint32, 1)
            v[0] = np.uint32((int(v[0]) + prod(g) * prod(b)) & 0xFFFFFFFF)

        self.launch(
            "count",
            args,
            [ccond],
            [counter],
            writes,
            grid,
            block,
            shared,
            cluster,
            cooperative,
            s,
            form,
        )

    @staticmethod
    def change_count(args: list, change: int):
        """Drop or add an argument: a count the kernel does not take."""
        if change < 0:
            return args[:-1], fail(KernelArgumentError)
        if change > 0:
            return args + [0], fail(KernelArgumentError)
        return args, None


__all__ = ["LaunchMachine", "dims"]
