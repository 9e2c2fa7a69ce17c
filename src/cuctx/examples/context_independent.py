"""One library, any context: context-independent loading, written with cuctx.

One library, loaded once with no context in sight (cuLibraryLoadData), one kernel handle
(CUkernel), launched in several contexts: the primary context of every device, and a context
created *after* the load. The driver loads the code into each context on first use; nothing
here keeps a per-context module map, which is the point of CUDA 12.0's cuLibrary* API.
On the sim, the kernel's Python twin (below) does what the CUDA code does.
"""

import numpy as np

import cuctx

SOURCE = r"""
__managed__ int launches = 0;

extern "C" __global__ void scale(float* data, float factor, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) data[i] *= factor;
    if (i == 0) atomicAdd(&launches, 1);
}
"""


def main() -> None:
    managed = {}

    def scale_twin(grid, block, data, factor: float, n):
        """The sim's stand-in for `scale`: the same effect on the same memory."""
        data.view(np.float32, n)[:] *= np.float32(factor)
        managed["launches"][0] += 1

    # Load once, before any context exists in this program.
    library = cuctx.Library.from_source(SOURCE, sim_kernels={"scale": scale_twin})
    managed["launches"] = library.get_managed("launches", np.int32)
    scale = library.kernel("scale")  # one handle for every context and device
    print(f"loaded {library}; kernel handle {scale.handle:#x}")

    targets = [device.primary_context for device in cuctx.devices()]
    created = cuctx.Context.create(cuctx.Device(0))  # made after the load
    cuctx.Context.pop()  # Context.create pushed it; `with` makes it current below
    targets.append(created)

    for ctx in targets:
        with ctx:
            data = cuctx.to_device(np.arange(4, dtype=np.float32))
            scale[1, 32](data, 2.0, 4)  # the same Kernel object in every context
            print(
                f"{ctx.kind:>8} context on device {ctx.device.ordinal}: {data.to_host().tolist()}"
            )

    for ctx in targets:
        ctx.synchronize()
    # A __managed__ variable has one copy for all contexts and devices (cuLibraryGetManaged).
    print(f"launches counted in managed memory: {int(managed['launches'][0])}")
    created.destroy()
    library.unload()  # one call, whatever contexts came and went


if __name__ == "__main__":
    main()
