"""Cluster occupancy on a GPU beside the sim's model of it (src/cuctx/_driver/sim/_occupancy.py,
fitted to scripts/probe_link.py's answers on an H100): per block size and dynamic shared
memory, the blocks resident per SM, cuOccupancyMaxPotentialClusterSize and
cuOccupancyMaxActiveClusters for clusters of 1 to 8 blocks; a row where the sim answers
otherwise is marked with the sim's answer. It checks what the fit left open: clusters of 3, 5,
6 and 7 blocks, and whether the ceiling of 8 blocks per SM holds for other block sizes and with
shared memory. Run it on a GPU:

    python scripts/probe_cluster_occupancy.py
"""

import cuctx

SOURCE = (
    r'extern "C" __global__ void k(float* y) { extern __shared__ float s[]; '
    r"s[threadIdx.x] = y[threadIdx.x]; y[threadIdx.x] = 2 * s[threadIdx.x]; }"
)
# (threads per block, bytes of dynamic shared memory)
CASES = [
    (32, 0),
    (64, 0),
    (128, 0),
    (256, 0),
    (512, 0),
    (1024, 0),
    (128, 4096),
    (128, 16384),
    (256, 32768),
    (1024, 49152),
]


def answers(backend: str) -> dict:
    cuctx.set_backend(backend)
    kernel = cuctx.Library.from_source(SOURCE)["k"]
    return {
        case: (
            kernel.occupancy(*case),
            kernel.max_cluster_size(*case),
            [kernel.max_active_clusters(size, *case) for size in range(1, 9)],
        )
        for case in CASES
    }


gpu, sim = answers("cuda"), answers("sim")
cuctx.set_backend("cuda")
print(
    f"{cuctx.Device(0).name}, {cuctx.Device(0).properties.multiprocessor_count} SMs: "
    "block, shared: per SM, max cluster size, active clusters of 1..8 blocks"
)
for case in CASES:
    mark = "" if gpu[case] == sim[case] else f"   sim: {sim[case]}"
    print(f"{case[0]:5} {case[1]:6}: {gpu[case]}{mark}")
