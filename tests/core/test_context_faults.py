"""Sticky faults are named as such and contained: the context is poisoned, every later use
raises ContextPoisonedError naming the original fault, and it can still be destroyed."""

import textwrap

import pytest

from cuctx import Context, ContextPoisonedError, StickyFaultError
from cuctx.sim import inject_fault

from scenarios import run_python


def test_injected_fault_poisons_only_its_context(sim):
    victim = Context.create(0)
    bystander = Context.create(0)
    Context.pop()  # stack: victim
    inject_fault(victim, "CUDA_ERROR_ILLEGAL_ADDRESS")
    with pytest.raises(StickyFaultError) as first:
        victim.synchronize()
    assert first.value.name == "CUDA_ERROR_ILLEGAL_ADDRESS" and first.value.sticky
    assert victim.state == "poisoned" and victim.fault is first.value
    for use in (victim.synchronize, victim.push, lambda: victim.flags):
        with pytest.raises(
            ContextPoisonedError, match="poisoned by an earlier CUDA_ERROR_ILLEGAL_ADDRESS"
        ) as later:
            use()
        assert later.value.fault is first.value
    bystander.synchronize()  # contained: other contexts work on
    Context.pop()
    victim.destroy()
    bystander.destroy()
    assert victim.state == "destroyed"


def test_injecting_a_non_sticky_error_is_refused(sim):
    ctx = Context.create(0)
    try:
        with pytest.raises(ValueError, match="not a sticky fault"):
            inject_fault(ctx, "CUDA_ERROR_INVALID_VALUE")
    finally:
        ctx.destroy()


# A kernel that stores to address 0, written in PTX so no compiler is needed.
FAULT_PTX = textwrap.dedent("""
    .version 8.0
    .target sm_70
    .address_size 64
    .visible .entry store_to_null()
    {
        .reg .b64 %rd<2>;
        .reg .b32 %r<2>;
        mov.u64 %rd1, 0;
        mov.u32 %r1, 1;
        st.global.u32 [%rd1], %r1;
        ret;
    }
""")

CHILD = textwrap.dedent("""
    import sys
    import cuctx
    from cuda.bindings import driver as d
    from cuctx import Context, ContextPoisonedError, StickyFaultError
    ptx = sys.stdin.read().encode() + b"\\0"
    victim = Context.create(0)
    err, module = d.cuModuleLoadData(ptx)
    assert not err, err
    err, kernel = d.cuModuleGetFunction(module, b"store_to_null")
    assert not err, err
    err, = d.cuLaunchKernel(kernel, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0)
    assert not err, err
    try:
        victim.synchronize()
    except StickyFaultError as exc:
        print("first:", exc.name, exc.sticky, victim.state)
    try:
        victim.synchronize()
    except ContextPoisonedError as exc:
        print("later:", type(exc).__name__, exc.fault.name)
    Context.pop()
    victim.destroy()
    print("destroyed:", victim.state)
""")


@pytest.mark.gpu
def test_a_real_illegal_address_poisons_the_context(gpu):
    # In a child process: a real sticky fault may leave the whole process unusable.
    proc = run_python("-c", CHILD, input=FAULT_PTX, CUCTX_BACKEND="cuda")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "first: CUDA_ERROR_ILLEGAL_ADDRESS True poisoned"
    assert lines[1] == "later: ContextPoisonedError CUDA_ERROR_ILLEGAL_ADDRESS"
    assert lines[2] == "destroyed: destroyed"
