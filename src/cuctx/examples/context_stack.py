"""The context stack walk, written with cuctx.

Two created contexts on one device, the per-thread stack they live on, push and pop, and the
primary context the runtime API uses. Each step prints what the driver reports.
"""

import cuctx
from cuctx import Context


def main() -> None:
    device = cuctx.Device(0)
    ctx_a = Context.create(device)  # cuCtxCreate pushes: stack = [A]
    ctx_b = Context.create(device)  # stack = [A, B]
    print(f"ctx_a = {ctx_a}\nctx_b = {ctx_b}")
    print(f"current = {cuctx.current_context()}  (B, the top of the stack)")

    ctx_a.push()  # stack = [A, B, A]
    print(f"after push(A), current = {cuctx.current_context()}")
    popped = Context.pop()  # stack = [A, B]
    print(f"popped {popped}; current = {cuctx.current_context()}")

    # `with` pushes on entry and restores the exact stack on exit, even on an exception.
    with ctx_a:
        print(f"inside `with ctx_a`, current = {cuctx.current_context()}")
    print(f"after the block, current = {cuctx.current_context()}")

    # Destroy in creation order. A is not current but sits under B: the driver alone would
    # leave it there, and once B is gone the destroyed A would be current (later CUDA calls
    # on this thread, PyTorch's too, then fail with "invalid device context"). cuctx takes a
    # destroyed context out of the thread's stack wherever it sits.
    ctx_a.destroy()  # stack = [B]
    print(f"after destroying A, current = {cuctx.current_context()}  (B)")
    ctx_b.destroy()  # stack = []
    print(f"after destroying B, current = {cuctx.current_context()}  (no destroyed context)")
    try:
        ctx_a.synchronize()
    except cuctx.ContextDestroyedError as exc:  # never a crash, never a raw handle error
        print(f"using a destroyed context: {type(exc).__name__}: {exc.name}")

    # The primary context: one per device, shared with the runtime API (and PyTorch, CuPy),
    # retained while referenced. `with device:` makes it current for a block.
    with device as primary:
        print(f"with device: current = {primary} (kind={primary.kind})")
    print(f"stack empty again: current = {cuctx.current_context()}")


if __name__ == "__main__":
    main()
