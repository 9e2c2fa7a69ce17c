"""Arrays, copies, fills, indexing, interop and frees, on top of `ContextMachine`.

Stream order is modelled conservatively: before a call queues work on stream S touching an
allocation, S waits for every other stream with work pending on it (and the allocation is
told about S with record_stream, as its docs ask), so the model never depends on the
relative speed of streams. Launches whose input and output ranges overlap are skipped: CUDA
leaves their result undefined (copies between overlapping ranges are defined: cuctx stages
them).
"""

from __future__ import annotations

import gc
import warnings

import numpy as np
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, consumes, initialize, multiple, rule

import cuctx

from . import strategies as S
from .expect import combine, fail, maybe, usable
from .machine import ContextMachine, ok
from .model import Arr, Base, CtxRec, StreamRec, same_values
from .streams import StreamMachine

BAD_SHAPES = st.sampled_from([-1, (2, -1), 2.5, "3", (1.0,), None])
BAD_DTYPES = st.sampled_from(
    [np.dtype(">i4"), np.dtype(object), np.dtype("U3"), np.dtype("datetime64[s]"), "not a dtype"]
)


def convert(value, dtype: np.dtype):
    """(the element a fill with ``value`` stores, the condition on the call). A fill stores
    one number, and only when the dtype represents it (docs of DeviceArray.fill)."""
    kind = np.asarray(value).dtype.kind
    if dtype.kind in "biu" and kind in "fc":
        return None, fail(TypeError)
    if kind in "iu" and dtype.kind in "iu":
        info = np.iinfo(dtype)
        if not info.min <= int(value) <= info.max:
            return None, fail(TypeError, ValueError)
    if kind in "iu" and dtype.kind == "b" and int(value) not in (0, 1):
        return np.array(bool(value)), maybe(TypeError, ValueError)
    if kind == "c" and dtype.kind != "c":
        return None, fail(TypeError)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return np.array(value, dtype=dtype), None


class ArrayMachine(StreamMachine):
    arrays = Bundle("arrays")
    contexts = ContextMachine.contexts
    streams = ContextMachine.streams

    # -- helpers --------------------------------------------------------------------------

    def stream_for(self, rec: CtxRec, s: StreamRec | None) -> StreamRec | None:
        """The stream a call in ``rec`` runs on: ``s``, or the context's legacy stream."""
        return s if s is not None else self.legacy(rec)

    def order(self, s: StreamRec, arrs) -> None:
        """Make ``s`` wait for the other streams' pending work on these arrays' memory
        (arrays without memory need nothing: calls with them queue no work)."""
        for arr in arrs:
            base = arr.base
            if not arr.dev.nbytes:
                continue
            for p in list(base.pending):
                if p is not s and p.ctx.alive:
                    self.call(f"{s}.wait({p})", None, s.stream.wait, p.stream)
            base.pending = {s}
            if s is not base.alloc:  # (on an empty array: a no-op)
                self.call("record_stream", None, base.dev.record_stream, s.stream)

    def new_base(self, dev, rec: CtxRec, s: StreamRec) -> Arr:
        assert dev.context is rec.ctx, (dev.context, rec.ctx)
        base = Base(dev, rec, s)
        self.bases.append(base)
        return self.track(Arr(base, dev, 0))

    def track(self, arr: Arr) -> Arr:
        self.check_view(arr)
        self.all_arrs.append(arr)
        return arr

    def check_view(self, arr: Arr) -> None:
        """The device view describes what NumPy's view of the mirror does."""
        dev, mirror = arr.dev, arr.mirror
        assert dev.shape == mirror.shape and dev.dtype == mirror.dtype, (dev, mirror.shape)
        assert dev.size == mirror.size and dev.nbytes == mirror.nbytes and dev.ndim == mirror.ndim
        flags = mirror.flags
        assert dev.is_contiguous == (flags.c_contiguous or flags.f_contiguous), (
            dev,
            dev.strides,
            mirror.strides,
        )
        if dev.size:
            assert dev.strides == mirror.strides, (dev.strides, mirror.strides)
            assert dev.ptr - arr.base.dev.ptr == arr.offset, (dev.ptr, arr.offset)

    def pointer_room(self, arr: Arr, itemsize: int) -> int:
        """Elements a kernel may touch from the array's address to the allocation's end."""
        offset = arr.dev.ptr - arr.base.dev.ptr if arr.base.dev.ptr else 0
        return (arr.base.dev.nbytes - offset) // itemsize

    # -- making arrays --------------------------------------------------------------------

    def allocate(self, kind, shape, dtype, value, seed, where, s):
        self.count(f"allocate_{kind}")
        if where == "stream":
            rec, stream, kwargs = s.ctx, s, {"stream": s.stream}
        else:
            rec = self.implicit()
            stream, kwargs = None, ({"device": 0} if where == "device" else {})
        host = S.host_data(shape, dtype, seed) if kind == "to_device" else None
        conds = [usable(rec)]
        element = None
        if kind == "full":
            element, cond = convert(value, dtype)
            conds.append(cond)
        make = {
            "empty": lambda: cuctx.empty(shape, dtype, **kwargs),
            "zeros": lambda: cuctx.zeros(shape, dtype, **kwargs),
            "full": lambda: cuctx.full(shape, value, dtype, **kwargs),
            "to_device": lambda: cuctx.to_device(host, **kwargs),
        }[kind]
        dev = self.call(f"{kind}({shape!r}, {dtype}, {where}) in {rec}", combine(*conds), make)
        if where == "current" and ok(dev):
            self.lazy_init()  # issue 7 item 5: lazy initialisation leaves the primary current
        if not ok(dev):
            return multiple()
        stream = stream or self.legacy(rec)
        arr = self.new_base(dev, rec, stream)
        if kind == "zeros":
            arr.mirror[...] = 0
        elif kind == "full":
            arr.mirror[...] = element
        elif kind == "to_device":
            arr.mirror[...] = host
        arr.mask[...] = kind != "empty"
        return arr

    # Hypothesis picks among the valid rules uniformly: arrays are what most rules need, so
    # allocation is two rules (the second always on a given stream).
    allocate_current = rule(
        target=arrays,
        kind=st.sampled_from(["empty", "zeros", "full", "to_device"]),
        shape=S.shapes,
        dtype=S.array_dtypes,
        value=S.fill_values,
        seed=S.seeds,
        where=st.sampled_from(["current", "stream", "device"]),
        s=ContextMachine.streams,
    )(allocate)
    allocate_on_stream = rule(
        target=arrays,
        kind=st.sampled_from(["empty", "zeros", "full", "to_device"]),
        shape=S.shapes,
        dtype=S.array_dtypes,
        value=S.fill_values,
        seed=S.seeds,
        where=st.just("stream"),
        s=ContextMachine.streams,
    )(allocate)

    # Every program starts with arrays of the kernels' types, so views, copies and launches
    # have something to work on from the first step.
    @initialize(
        target=arrays,
        shape=st.integers(1, 64),
        dtype=st.sampled_from(["float32", "int64", "uint32"]),
        seed=S.seeds,
    )
    def initial_array(self, shape, dtype, seed):
        self.count("initial_array")
        return self.allocate("to_device", shape, np.dtype(dtype), 0, seed, "device", None)

    @initialize(target=arrays, shape=S.shapes, seed=S.seeds)
    def initial_float_array(self, shape, seed):
        self.count("initial_array")
        return self.allocate("to_device", shape, np.dtype(np.float32), 0, seed, "device", None)

    @rule(
        bad_shape=BAD_SHAPES,
        bad_dtype=BAD_DTYPES,
        shape=S.shapes,
        dtype=S.dtypes,
        which=st.sampled_from(["shape", "dtype", "both"]),
    )
    def allocate_bad(self, bad_shape, bad_dtype, shape, dtype, which):
        """A bad shape or dtype (or both) is a TypeError or ValueError."""
        self.count("allocate_bad")
        shape = bad_shape if which != "dtype" else shape
        dtype = bad_dtype if which != "shape" else dtype
        self.call(
            f"empty({shape!r}, {dtype!r})", (TypeError, ValueError), cuctx.empty, shape, dtype
        )

    # -- views ----------------------------------------------------------------------------

    @rule(target=arrays, arr=arrays, key=S.basic_keys)
    def index(self, arr, key):
        self.count("index")
        tup = key if isinstance(key, tuple) else (key,)
        if not any(k is Ellipsis for k in tup):
            tup += (Ellipsis,)  # an int index gives a 0-d view, not an element
        try:
            mirror = arr.mirror[tup]
            cond = None
        except IndexError:
            mirror, cond = None, fail(IndexError)
        except ValueError:  # NumPy's answer to a slice step of 0
            mirror, cond = None, fail(IndexError, ValueError)
        dead = maybe(cuctx.ContextDestroyedError) if arr.ctx.state == "destroyed" else None
        view = self.call(f"arr[{key!r}]", combine(cond, dead), arr.dev.__getitem__, key)
        if not ok(view):
            return multiple()
        offset = (
            mirror.__array_interface__["data"][0] - arr.base.bytes.ctypes.data
            if mirror.size
            else view.ptr - arr.base.dev.ptr
        )
        return self.track(Arr(arr.base, view, offset, mirror))

    def derived(self, arr: Arr, what: str, mirror_fn, dev_fn):
        """A view made by ``dev_fn`` that NumPy's ``mirror_fn`` describes (or refuses)."""
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                mirror = mirror_fn(arr.mirror)
            cond = None
        except (ValueError, TypeError) as exc:
            mirror, cond = None, fail(type(exc), ValueError)
        view = self.call(
            what,
            combine(
                cond, maybe(cuctx.ContextDestroyedError) if arr.ctx.state == "destroyed" else None
            ),
            dev_fn,
        )
        if not ok(view):
            return multiple()
        offset = (
            mirror.__array_interface__["data"][0] - arr.base.bytes.ctypes.data
            if mirror.size
            else view.ptr - arr.base.dev.ptr
        )
        return self.track(Arr(arr.base, view, offset, mirror))

    @rule(
        target=arrays,
        arr=arrays,
        shape=st.one_of(S.shapes, st.just(-1), st.tuples(st.just(-1), st.integers(1, 3))),
        order=st.sampled_from(["C", "F", "A"]),
    )
    def reshape(self, arr, shape, order):
        """A view only where NumPy makes one; where NumPy would copy, a ValueError."""
        self.count("reshape")
        return self.derived(
            arr,
            f"arr.reshape({shape!r}, order={order!r})",
            lambda m: np.reshape(m, shape, order=order, copy=False),
            lambda: arr.dev.reshape(shape, order=order),
        )

    @rule(target=arrays, arr=arrays, dtype=S.dtypes)
    def view_as(self, arr, dtype):
        self.count("view_as")
        return self.derived(
            arr, f"arr.view({dtype})", lambda m: m.view(dtype), lambda: arr.dev.view(dtype)
        )

    @rule(target=arrays, arr=arrays, axes=st.none() | st.permutations(range(3)))
    def transpose(self, arr, axes):
        self.count("transpose")
        axes = None if axes is None else tuple(a for a in axes if a < arr.dev.ndim)
        if axes is None:
            return self.derived(arr, "arr.T", lambda m: m.T, lambda: arr.dev.T)
        return self.derived(
            arr,
            f"arr.transpose{axes}",
            lambda m: m.transpose(axes),
            lambda: arr.dev.transpose(*axes),
        )

    @rule(target=arrays, arr=arrays, s=st.none() | ContextMachine.streams)
    def copy_array(self, arr, s):
        """arr.copy(): a new C-contiguous array in the array's context."""
        self.count("copy_array")
        conds = [usable(arr.ctx)]
        if s is not None and s.ctx is not arr.ctx:
            conds.append(fail(ValueError))
        expect = combine(*conds)
        stream = self.stream_for(arr.ctx, s) if expect is None else None
        if expect is None:
            self.order(stream, [arr])
        dev = self.call(f"arr.copy({s})", expect, arr.dev.copy, None if s is None else s.stream)
        if not ok(dev) or expect is not None:
            return multiple()
        new = self.new_base(dev, arr.ctx, stream)
        assert dev.is_contiguous, dev
        new.mirror[...] = arr.mirror
        new.mask[...] = arr.mask
        return new

    @rule(arr=arrays, key=S.bad_keys)
    def bad_index(self, arr, key):
        self.count("bad_index")
        self.call(f"arr[{key!r}]", (IndexError,), arr.dev.__getitem__, key)

    # -- fills and copies -----------------------------------------------------------------

    @rule(arr=arrays, value=S.fill_values, s=st.none() | ContextMachine.streams)
    def fill(self, arr, value, s):
        self.count("fill")
        dev, rec = arr.dev, arr.ctx
        element, cond = convert(value, dev.dtype)
        conds = [usable(rec), cond]
        if dev.size and s is not None and s.ctx is not rec:
            conds.append(fail(ValueError))
        expect = combine(*conds)
        stream = self.stream_for(rec, s) if expect is None else None
        if expect is None:
            self.order(stream, [arr])
        result = self.call(
            f"arr.fill({value!r}) on {s}", expect, dev.fill, value, None if s is None else s.stream
        )
        if ok(result) and dev.size:
            arr.mirror[...] = element
            arr.mask[...] = True

    def copy_conds(self, arr: Arr, host: np.ndarray, s: StreamRec | None):
        conds = [usable(arr.ctx)]
        if host.shape != arr.dev.shape:
            conds.append(fail(ValueError))
        elif host.dtype != arr.dev.dtype:
            conds.append(fail(TypeError))
        if arr.dev.nbytes and s is not None and s.ctx is not arr.ctx:
            conds.append(fail(ValueError))
        return conds

    @rule(
        arr=arrays,
        seed=S.seeds,
        variant=st.sampled_from(["same", "same", "F", "strided", "shape", "dtype"]),
        s=st.none() | ContextMachine.streams,
        form=st.booleans(),
    )
    def copy_to_device(self, arr, seed, variant, s, form):
        self.count("copy_to_device")
        shape, dtype = arr.dev.shape, arr.dev.dtype
        if variant == "shape":
            shape = shape + (2,)
        elif variant == "dtype":
            dtype = np.dtype(np.int16 if dtype != np.int16 else np.float32)
        host = S.host_data(shape, dtype, seed)
        if variant == "F":
            host = np.asfortranarray(host)
        elif variant == "strided" and shape:
            host = S.host_data(shape[:-1] + (2 * shape[-1],), dtype, seed)[..., ::2]
        expect = combine(*self.copy_conds(arr, host, s))
        if expect is None:
            self.order(self.stream_for(arr.ctx, s), [arr])
        stream = None if s is None else s.stream
        fn = (
            (lambda: cuctx.copy(arr.dev, host, stream))
            if form
            else (lambda: arr.dev.copy_from(host, stream))
        )
        if ok(self.call(f"copy {variant} host -> arr on {s}", expect, fn)) and arr.dev.size:
            arr.mirror[...] = host
            arr.mask[...] = True

    @rule(
        arr=arrays,
        variant=st.sampled_from(["plain", "plain", "C", "F", "readonly"]),
        s=st.none() | ContextMachine.streams,
    )
    def copy_to_host(self, arr, variant, s):
        self.count("copy_to_host")
        dev = arr.dev
        if variant == "plain":
            out, s = None, None
            conds = [usable(arr.ctx)]
        else:
            out = np.empty(dev.shape, dev.dtype, order="F" if variant == "F" else "C")
            out.flags.writeable = variant != "readonly"
            conds = self.copy_conds(arr, out, s)
            if variant == "readonly":
                conds.append(fail(ValueError))
        expect = combine(*conds)
        if expect is None:
            self.order(self.stream_for(arr.ctx, s), [arr])
        got = self.call(
            f"arr.to_host({variant}) on {s}",
            expect,
            dev.to_host,
            out,
            None if s is None else s.stream,
        )
        if ok(got) and arr.base.trusted and not isinstance(expect, tuple):
            if out is not None:
                assert got is out
            assert same_values(got, arr.mirror, arr.mask), (
                f"to_host returned {got!r}; the model has {arr.mirror!r} "
                f"(known {arr.mask.all(axis=-1)!r})"
            )

    @rule(dst=arrays, src=arrays, s=st.none() | ContextMachine.streams)
    def copy_device(self, dst, src, s):
        """Overlapping ranges included: cuctx stages those (CUDA leaves them undefined)."""
        self.count("copy_device")
        self.copy_between(dst, src, s)

    @rule(
        target=arrays, src=arrays, rec=ContextMachine.contexts, s=st.none() | ContextMachine.streams
    )
    def clone(self, src, rec, s):
        """A new array in ``rec`` like ``src``, copied from it (between contexts: a peer copy)."""
        self.count("clone")
        stream = self.legacy(rec) if rec.alive else None
        if stream is None:
            return multiple()
        dev = self.call(
            f"empty like src in {rec}",
            None,
            cuctx.empty,
            src.dev.shape,
            src.dev.dtype,
            stream=stream.stream,
        )
        dst = self.new_base(dev, rec, stream)
        self.copy_between(dst, src, s)
        return dst

    def copy_between(self, dst: Arr, src: Arr, s: StreamRec | None) -> None:
        conds = [usable(dst.ctx, src.ctx)]
        if dst.dev.shape != src.dev.shape:
            conds.append(fail(ValueError))
        elif dst.dev.dtype != src.dev.dtype:
            conds.append(fail(TypeError))
        if dst.ctx is src.ctx:
            stream = s or (self.legacy(dst.ctx) if dst.ctx.alive else None)
            bad_stream = s is not None and s.ctx is not dst.ctx
        else:  # a peer copy: on a stream of either side
            stream = (
                s
                if s is not None and s.ctx in (src.ctx, dst.ctx)
                else (s or (self.legacy(dst.ctx) if dst.ctx.alive else None))
            )
            bad_stream = s is not None and s.ctx not in (src.ctx, dst.ctx)
        if bad_stream and dst.dev.nbytes:
            conds.append(fail(ValueError))
        expect = combine(*conds)
        if expect is None:
            self.order(stream, [dst, src])
        values, known = src.mirror.copy(), src.mask.copy()
        if (
            ok(
                self.call(
                    f"copy arr -> arr on {s}",
                    expect,
                    cuctx.copy,
                    dst.dev,
                    src.dev,
                    None if s is None else s.stream,
                )
            )
            and dst.dev.size
        ):
            dst.mirror[...] = values
            dst.mask[...] = known

    # -- interop --------------------------------------------------------------------------

    @rule(arr=arrays)
    def numpy_from_dlpack(self, arr):
        """NumPy refuses device memory: its own error reaches the caller, nothing leaks."""
        self.count("numpy_from_dlpack")
        try:
            np.from_dlpack(arr.dev)
        except Exception as exc:  # noqa: BLE001 - judged here
            assert isinstance(exc, (BufferError, RuntimeError, TypeError, ValueError)), (
                f"np.from_dlpack(device array) raised {exc!r}"
            )
            assert str(exc).strip(), repr(exc)
        else:
            raise AssertionError("NumPy imported device memory")

    @rule(target=arrays, arr=arrays, protocol=st.sampled_from(["cai", "dlpack"]))
    def import_view(self, arr, protocol):
        """Zero-copy import of a primary context's array through CAI or DLPack."""
        self.count(f"import_{protocol}")
        if arr.ctx.kind != "primary" or not arr.ctx.alive or arr.dev.size == 0:
            return multiple()
        dev = arr.dev

        class Producer:
            if protocol == "cai":
                __cuda_array_interface__ = dev.__cuda_array_interface__
            else:

                def __dlpack__(self, **kwargs):
                    return dev.__dlpack__(**kwargs)

                def __dlpack_device__(self):
                    return dev.__dlpack_device__()

        # The current stream waits for the producer's: a faulted current context may refuse.
        view = self.call(
            f"asarray({protocol})", combine(usable(self.top())), cuctx.asarray, Producer()
        )
        if not ok(view):
            return multiple()
        assert view.context is arr.ctx.ctx, (view.context, arr.ctx)
        return self.track(Arr(arr.base, view, arr.offset))

    @rule(arr=arrays, key=st.sampled_from(["shape", "typestr", "data"]))
    def malformed_cai(self, arr, key):
        """A CUDA Array Interface without a required key is a TypeError naming it (item 11)."""
        self.count("malformed_cai")
        if not arr.ctx.alive:
            return
        cai = dict(arr.dev.__cuda_array_interface__)
        del cai[key]

        class Producer:
            __cuda_array_interface__ = cai

        result = self.call(f"asarray(CAI without {key!r})", (TypeError,), cuctx.asarray, Producer())
        assert key in str(result.exc), result.exc

    # -- frees and checks -----------------------------------------------------------------

    @rule(arr=consumes(arrays), collect=st.booleans(), deferred=st.booleans())
    def free(self, arr, collect, deferred):
        self.count("free")
        base = arr.base
        arr.dev = None
        base.refs -= 1
        if base.refs == 0 and base in self.bases:
            self.bases.remove(base)
            if deferred:
                with cuctx.defer_cleanup():
                    base.dev = None
            else:
                base.dev = None
        if collect:
            gc.collect()

    @rule(arr=arrays)
    def compare(self, arr):
        self.count("compare")
        if arr.base in self.bases:
            self.check_base(arr.base)

    def release(self):
        for arr in self.all_arrs:
            arr.dev = None
        self.all_arrs.clear()
        super().release()


__all__ = ["ArrayMachine", "convert"]
