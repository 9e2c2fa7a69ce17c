"""Kernels compiled by someone else, loaded and launched through `cuctx.Library` on a GPU:
a Triton cubin and Numba PTX. Their parameter layouts come from the driver, so cuctx packs
arguments for code it never saw the source of."""

from __future__ import annotations

import numpy as np
import pytest

import cuctx

pytestmark = pytest.mark.gpu


def test_triton_cubin(gpu):
    triton = pytest.importorskip("triton", reason="needs triton")
    tl = pytest.importorskip("triton.language")
    torch = pytest.importorskip("torch", reason="Triton compiles through a torch tensor")

    @triton.jit
    def add_one(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) + 1.0, mask=mask)

    n, block = 1000, 256
    x = torch.arange(n, dtype=torch.float32, device="cuda")
    y = torch.empty_like(x)
    compiled = add_one[(triton.cdiv(n, block),)](x, y, n, BLOCK=block)
    torch.cuda.synchronize()

    library = cuctx.Library.from_bytes(compiled.asm["cubin"])
    kernel = library.kernel(compiled.name)
    layout = kernel.param_layout
    assert layout[:3] == ((0, 8), (8, 8), (16, 4)), layout  # two pointers, then n
    with cuctx.Device(0):
        src = cuctx.to_device(np.arange(n, dtype=np.float32))
        out = cuctx.zeros(n, np.float32)
        hidden = [None] * (len(layout) - 3)  # Triton's scratch pointers: unused here
        threads = compiled.metadata.num_warps * 32
        kernel[triton.cdiv(n, block), threads, compiled.metadata.shared](src, out, n, *hidden)
        assert np.array_equal(out.to_host(), np.arange(n, dtype=np.float32) + 1)


def test_numba_ptx(gpu, monkeypatch):
    numba_cuda = pytest.importorskip("numba.cuda", reason="needs numba-cuda")
    from numba import types

    if not hasattr(np, "row_stack"):
        # numba-cuda 0.30 registers np.row_stack, which NumPy 2.5 removed; it is vstack.
        monkeypatch.setattr(np, "row_stack", np.vstack, raising=False)

    def scale(data, factor, n):
        i = numba_cuda.grid(1)
        if i < n:
            data[i] = data[i] * factor

    signature = types.void(types.CPointer(types.float32), types.float32, types.int32)
    ptx, _ = numba_cuda.compile_ptx(scale, signature)
    library = cuctx.Library.from_bytes(ptx.encode())
    (name,) = library.kernel_names
    kernel = library.kernel(name)
    assert kernel.param_layout == ((0, 8), (8, 4), (12, 4))
    with cuctx.Device(0):
        data = cuctx.to_device(np.arange(100, dtype=np.float32))
        kernel[1, 128](data, 3.0, 100)
        assert np.array_equal(data.to_host(), np.arange(100, dtype=np.float32) * 3)
