"""Contexts on every backend: primary refcounts, created contexts, the per-thread stack,
lazy initialisation, and use after destroy."""

import gc
import re
import threading

import pytest

import cuctx
from cuctx import Context, ContextDestroyedError, InvalidContextError

pytestmark = pytest.mark.paths()


def primary_active(device) -> bool:
    err, flags, active = device._backend.driver.cuDevicePrimaryCtxGetState(device._handle)
    assert not err
    return bool(active)


def in_thread(fn):
    """Run fn in a new thread; return its result or raise its exception here."""
    box = {}

    def target():
        try:
            box["result"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed back to the test
            box["error"] = exc

    t = threading.Thread(target=target)
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    return box.get("result")


# -- primary contexts ---------------------------------------------------------------------


@pytest.mark.primary_unheld
def test_primary_context_is_retained_while_referenced(backend):
    device = cuctx.Device(0)
    ctx = device.primary_context
    assert ctx.kind == "primary" and ctx.device is device and ctx.state == "active"
    assert device.primary_context is ctx
    assert primary_active(device)
    del ctx
    gc.collect()
    assert not primary_active(device)  # the last reference released it
    again = device.primary_context
    assert primary_active(device) and again.state == "active"


def test_with_device_pushes_its_primary_context(backend):
    device = cuctx.devices()[-1]
    assert cuctx.current_context() is None
    with device as ctx:
        assert cuctx.current_context() is ctx is device.primary_context
        assert cuctx.current_device() is device
    assert cuctx.current_context() is None


def test_reset_invalidates_objects_of_the_primary_context(backend):
    device = cuctx.Device(0)
    old = device.primary_context
    device.reset()
    assert old.state == "destroyed"
    with pytest.raises(ContextDestroyedError, match=r"destroyed by device\.reset\(\)"):
        old.synchronize()
    new = device.primary_context
    assert new is not old and new.state == "active"
    new.synchronize()


# -- created contexts ---------------------------------------------------------------------


def test_create_pushes_and_destroy_pops(backend):
    ctx = Context.create(cuctx.Device(0))
    try:
        assert ctx.kind == "created" and cuctx.current_context() is ctx
        assert ctx.api_version >= 3020
        assert ctx.flags == cuctx.ContextFlags.SCHED_AUTO
        ctx.synchronize()
    finally:
        ctx.destroy()
    assert ctx.state == "destroyed" and cuctx.current_context() is None


def test_create_with_flags(backend):
    flags = cuctx.ContextFlags.SCHED_BLOCKING_SYNC | cuctx.ContextFlags.MAP_HOST
    ctx = Context.create(0, flags=flags)
    try:
        assert ctx.flags & cuctx.ContextFlags.SCHED_BLOCKING_SYNC
    finally:
        ctx.destroy()


def test_bad_flags_are_rejected_by_the_driver_rules(backend):
    with pytest.raises(cuctx.InvalidValueError, match="flags=0x10000"):
        Context.create(0, flags=0x10000)
    with pytest.raises(TypeError, match="flags must be ContextFlags or an int"):
        Context.create(0, flags="MAP_HOST")
    assert cuctx.current_context() is None


@pytest.mark.parametrize(
    "use",
    [
        lambda c: c.synchronize(),
        lambda c: c.push(),
        lambda c: c.set_current(),
        lambda c: c.api_version,
        lambda c: c.flags,
        lambda c: c.__enter__(),
        lambda c: c.destroy(),
    ],
)
def test_use_after_destroy_raises_context_destroyed(backend, use):
    ctx = Context.create(0)
    ctx.destroy()
    with pytest.raises(ContextDestroyedError) as info:
        use(ctx)
    assert info.value.code == 709 and "destroyed" in str(info.value)
    assert cuctx.current_context() is None


def test_destroy_of_a_primary_context_is_refused(backend):
    ctx = cuctx.Device(0).primary_context
    with pytest.raises(InvalidContextError, match="device.reset"):
        ctx.destroy()
    assert ctx.state == "active"


def test_a_dropped_created_context_is_destroyed(backend):
    ctx = Context.create(0)
    Context.pop()
    finalizer = ctx._finalizer
    del ctx
    gc.collect()
    assert not finalizer.alive


def test_context_destroyed_by_another_thread(backend):
    ctx = Context.create(0)  # current here
    in_thread(ctx.destroy)
    assert ctx.state == "destroyed"
    # The driver keeps it on this thread's stack; the next cuctx call here drops it.
    assert int(backend.driver.cuCtxGetCurrent()[1]) == ctx.handle
    with pytest.raises(ContextDestroyedError):
        ctx.synchronize()
    assert cuctx.current_context() is None
    assert int(backend.driver.cuCtxGetCurrent()[1]) == 0
    assert backend.tls.state.stack == []


# -- the stack ----------------------------------------------------------------------------


def test_pop_on_an_empty_stack(backend):
    with pytest.raises(InvalidContextError, match="stack of this thread is empty") as info:
        Context.pop()
    assert info.value.code == 201


def test_push_pop_order(backend):
    a = Context.create(0)
    b = Context.create(0)
    try:
        assert [Context.pop(), Context.pop()] == [b, a]
        a.push()
        b.push()
        a.push()
        assert cuctx.current_context() is a
        assert [Context.pop(), Context.pop(), Context.pop()] == [a, b, a]
        assert cuctx.current_context() is None
    finally:
        a.destroy()
        b.destroy()


def test_ctx_pop_pops_only_the_context_it_names(backend):
    a = Context.create(0)
    b = Context.create(0)  # stack: a, b
    try:
        with pytest.raises(
            ValueError,
            match=re.escape(
                f"Context.pop: {a!r} is not the current context of this thread; {b!r} is"
            ),
        ):
            a.pop()
        assert cuctx.current_context() is b  # nothing was popped
        assert b.pop() is b and a.pop() is a
        with pytest.raises(InvalidContextError, match="stack of this thread is empty"):
            a.pop()
        a.push()
        assert backend.driver.cuCtxPushCurrent(b._handle) == (0,)  # by other code than cuctx
        with pytest.raises(ValueError, match=re.escape(f"{b!r} is (the top")):
            a.pop()
        assert Context.pop() is b and a.pop() is a and cuctx.current_context() is None
    finally:
        a.destroy()
        b.destroy()


def test_set_current_replaces_the_top(backend):
    a, b = Context.create(0), Context.create(0)
    try:
        b.set_current()  # stack: a, b -> a, b(replaced top b by b)
        a.set_current()  # stack: a, a
        assert Context.pop() is a and Context.pop() is a
        b.set_current()  # empty stack: set_current pushes
        assert Context.pop() is b and cuctx.current_context() is None
    finally:
        a.destroy()
        b.destroy()


def test_with_restores_the_exact_stack_when_nested_and_on_exceptions(backend):
    a = Context.create(0)
    b = Context.create(0)
    c = Context.create(0)
    Context.pop()
    Context.pop()  # stack: a
    try:
        with b:
            with pytest.raises(KeyError):
                with c:
                    assert cuctx.current_context() is c
                    b.push()  # left pushed on purpose
                    raise KeyError
            assert cuctx.current_context() is b
            with cuctx.Device(0) as primary:
                assert cuctx.current_context() is primary
                c.set_current()
            assert cuctx.current_context() is b
        assert cuctx.current_context() is a
        assert Context.pop() is a
        assert cuctx.current_context() is None
    finally:
        for ctx in (a, b, c):
            ctx.destroy()


def test_contexts_on_a_stack_stay_alive(backend):
    Context.create(0)  # no reference kept: the stack holds it
    gc.collect()
    ctx = cuctx.current_context()
    assert ctx.state == "active"
    ctx.synchronize()
    Context.pop().destroy()


# -- lazy initialisation and the current device ---------------------------------------------


def test_lazy_init_uses_device_0s_primary_context(backend):
    def fresh_thread():
        assert cuctx.current_context() is None
        assert cuctx.current_device() is cuctx.Device(0)
        ctx = cuctx.ensure_context()
        assert ctx is cuctx.Device(0).primary_context is cuctx.current_context()
        Context.pop()
        return ctx

    assert in_thread(fresh_thread).kind == "primary"


def test_set_current_device_then_lazy_init_uses_it(backend):
    last = cuctx.devices()[-1]

    def fresh_thread():
        last.set_current()
        assert cuctx.current_device() is last
        assert cuctx.ensure_context() is last.primary_context
        Context.pop()

    in_thread(fresh_thread)


def test_foreign_context_is_adopted(backend):
    drv = backend.driver
    err, handle = drv.cuCtxCreate(None, 0, cuctx.Device(0)._handle)  # another library's
    assert not err
    try:
        ctx = cuctx.current_context()
        assert ctx.kind == "foreign" and ctx.device is cuctx.Device(0)
        assert cuctx.current_context() is ctx
    finally:
        drv.cuCtxPopCurrent()
        drv.cuCtxDestroy(handle)


def test_lazy_init_after_a_reset_gets_the_reset_primary_context(backend):
    device = cuctx.Device(0)

    def fresh_thread():
        old = device.set_current()
        device.reset()
        ctx = cuctx.ensure_context()
        assert ctx is not old and ctx.state == "active" and ctx.kind == "primary"
        assert cuctx.current_context() is ctx is device.primary_context
        ctx.synchronize()
        Context.pop()

    in_thread(fresh_thread)


# -- destroy takes a context out of this thread's stack --------------------------------------


def raw_current(backend) -> int:
    err, handle = backend.driver.cuCtxGetCurrent()
    assert not err
    return int(handle)


def test_the_driver_leaves_a_destroyed_context_current_after_the_stack_walk(backend):
    """What the driver itself does (raw calls), which the sim models: cuCtxDestroy pops the
    context only when it is on top; the walk below leaves the destroyed A current."""
    drv, dev = backend.driver, cuctx.Device(0)._handle
    err, a = drv.cuCtxCreate(None, 0, dev)
    err, b = drv.cuCtxCreate(None, 0, dev)
    assert drv.cuCtxPushCurrent(a)[0] == 0
    assert int(drv.cuCtxPopCurrent()[1]) == int(a)
    assert drv.cuCtxDestroy(a)[0] == 0  # not on top: it stays in the stack
    assert drv.cuCtxDestroy(b)[0] == 0  # on top: popped
    assert raw_current(backend) == int(a)
    assert int(drv.cuCtxPopCurrent()[1]) == int(a)  # popping a destroyed context is safe
    assert raw_current(backend) == 0


def test_the_stack_walk_leaves_no_destroyed_context_current(backend):
    a = Context.create(0)
    b = Context.create(0)
    a.push()
    assert Context.pop() is a
    a.destroy()  # under b: taken out of the stack, which is now [b]
    assert cuctx.current_context() is b and backend.tls.state.stack == [b]
    b.destroy()
    assert cuctx.current_context() is None
    assert raw_current(backend) == 0 and backend.tls.state.stack == []


def test_destroy_takes_every_entry_out_and_keeps_the_rest_in_order(backend):
    a, b, c = Context.create(0), Context.create(0), Context.create(0)  # stack [a, b, c]
    a.push()
    b.push()  # [a, b, c, a, b]
    a.destroy()
    assert backend.tls.state.stack == [b, c, b]
    assert [Context.pop(), Context.pop(), Context.pop()] == [b, c, b]
    assert raw_current(backend) == 0
    b.destroy()
    c.destroy()


def test_destroy_inside_with_blocks_keeps_their_exits_exact(backend):
    a, b = Context.create(0), Context.create(0)
    Context.pop()
    Context.pop()
    outer = cuctx.Device(0).primary_context
    with outer:
        with a:
            with b:
                a.destroy()  # below b's block: b's and a's blocks still exit correctly
                assert cuctx.current_context() is b
            assert cuctx.current_context() is outer
        assert cuctx.current_context() is outer
    assert cuctx.current_context() is None and raw_current(backend) == 0
    b.destroy()


# -- lazy initialisation leaves the primary context current -----------------------------------


@pytest.mark.parametrize(
    "first_call",
    [
        lambda: cuctx.zeros(3),
        lambda: cuctx.Stream(),
        lambda: cuctx.Event(),
        lambda: cuctx.current_stream(),
        lambda: cuctx.ensure_context(),
        lambda: cuctx.synchronize(),
    ],
    ids=["zeros", "Stream", "Event", "current_stream", "ensure_context", "synchronize"],
)
def test_lazy_init_leaves_device_0s_primary_context_current(backend, first_call):
    def fresh_thread():
        assert cuctx.current_context() is None
        first_call()
        ctx = cuctx.current_context()
        assert ctx is cuctx.Device(0).primary_context
        assert raw_current(backend) == ctx.handle  # the driver agrees, as the runtime API
        Context.pop()

    in_thread(fresh_thread)


def test_lazy_init_of_a_named_device_makes_its_primary_context_current(backend):
    last = cuctx.devices()[-1]

    def fresh_thread():
        stream = cuctx.Stream(last)
        assert stream.context is last.primary_context is cuctx.current_context()
        assert cuctx.current_device() is last
        Context.pop()

    in_thread(fresh_thread)


def test_a_named_device_does_not_replace_a_current_context(backend):
    last = cuctx.devices()[-1]
    with cuctx.Device(0) as ctx:
        stream = cuctx.Stream(last)
        assert stream.context is last.primary_context
        assert cuctx.current_context() is ctx


# -- synchronize ------------------------------------------------------------------------------


def test_device_synchronize_waits_for_every_context_of_the_device(backend):
    from conftest import busy

    device = cuctx.Device(0)
    created = Context.create(device)
    try:
        done = []
        with device:
            primary_stream = cuctx.Stream()
        created_stream = cuctx.Stream()
        for stream in (primary_stream, created_stream):
            busy(stream, 5)
            stream.launch_host_func(done.append, stream.context.kind)
        device.synchronize()
        assert sorted(done) == ["created", "primary"]
    finally:
        created.destroy()


def test_synchronize_raises_host_function_errors_of_the_current_device(backend):
    with cuctx.Device(0):
        stream = cuctx.Stream()
        stream.launch_host_func(int, "not a number")
        with pytest.raises(cuctx.HostFunctionError, match="int raised ValueError"):
            cuctx.synchronize()
        cuctx.synchronize()  # reported once


def test_cuctx_synchronize_is_the_current_devices(backend):
    last = cuctx.devices()[-1]
    with last:
        stream = cuctx.Stream()
        done = []
        stream.launch_host_func(done.append, 1)
        cuctx.synchronize()
        assert done == [1]
