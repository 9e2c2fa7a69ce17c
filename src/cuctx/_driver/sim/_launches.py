"""Kernel launches of the sim.

A launch makes the driver's own checks of the configuration, copies the parameter bytes (as
the driver does, at call time) and queues an operation on the stream (`_enqueue`) that
calls the kernel's twin, ``twin(grid, block, *args)``, when the stream runs (`_twins`:
decoding, `SimPointer`, faults). Twins reach memory only through `SimPointer`, which checks
every access against the live allocations: outside them is the sticky
CUDA_ERROR_ILLEGAL_ADDRESS, a misaligned typed view CUDA_ERROR_MISALIGNED_ADDRESS. A twin that
raises anything else fails the launch with the sticky CUDA_ERROR_LAUNCH_FAILED (as a trapped
kernel does) and a `SimTwinWarning` carrying its traceback; ``backend.sim.fault_cause`` gives
the exception and the twin's file and line.
"""

from __future__ import annotations

import ctypes

from cuda.bindings.driver import CUdevice_attribute, CUlaunchAttributeID, CUresult

from ._common import (
    COOPERATIVE_TOO_LARGE,
    INVALID_HANDLE,
    INVALID_VALUE,
    NOT_INITIALIZED,
    NOT_SUPPORTED,
    OK,
    OUT_OF_MEMORY,
    OUT_OF_RESOURCES,
)
from ._library import SimKernel, SimLibrary, SimModule
from ._occupancy import dynamic_limit, max_threads, occupancy
from ._timing import KERNEL, LAUNCH_NS
from ._twins import run_twin

A = CUdevice_attribute


class LaunchModel:
    """cuLaunchKernel, cuLaunchKernelEx (cluster dimensions, cooperative)."""

    def cuLaunchKernel(
        self,
        f,
        gridDimX,
        gridDimY,
        gridDimZ,
        blockDimX,
        blockDimY,
        blockDimZ,
        sharedMemBytes,
        hStream,
        kernelParams,
        extra,
    ):
        grid = (int(gridDimX), int(gridDimY), int(gridDimZ))
        block = (int(blockDimX), int(blockDimY), int(blockDimZ))
        return (
            self._launch(
                f, grid, block, int(sharedMemBytes), hStream, kernelParams, extra, None, False
            ),
        )

    def cuLaunchKernelEx(self, config, f, kernelParams, extra):
        cluster, cooperative = None, False
        for attr in list(config.attrs)[: int(config.numAttrs)]:
            if attr.id == CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION:
                dim = attr.value.clusterDim
                cluster = (int(dim.x), int(dim.y), int(dim.z))
            elif attr.id == CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_COOPERATIVE:
                cooperative = bool(attr.value.cooperative)
            else:
                return (NOT_SUPPORTED,)
        grid = (int(config.gridDimX), int(config.gridDimY), int(config.gridDimZ))
        block = (int(config.blockDimX), int(config.blockDimY), int(config.blockDimZ))
        return (
            self._launch(
                f,
                grid,
                block,
                int(config.sharedMemBytes),
                config.hStream,
                kernelParams,
                extra,
                cluster,
                cooperative,
            ),
        )

    def _launch(
        self, f, grid, block, shared, hStream, kernelParams, extra, cluster, cooperative
    ) -> CUresult:
        if not self._initialized:
            return NOT_INITIALIZED
        kernel = self._kernel(f)
        if kernel is None:
            return INVALID_HANDLE
        err, ctx = self._stream_context(hStream)
        if err:
            return err
        err, launch = self._prepared_launch(
            kernel, ctx, grid, block, shared, kernelParams, extra, cluster, cooperative
        )
        if err:
            return err
        return self._enqueue(
            hStream,
            launch.run(self),
            cost_ns=LAUNCH_NS,
            label=kernel.name,
            kind=KERNEL,
            width=self._width(ctx, grid),
        )

    def _width(self, ctx, grid) -> float:
        """The share of ``ctx``'s SMs a grid fills (one block per SM: `_timing`)."""
        sms = (
            len(ctx.sms)
            if ctx.sms is not None
            else self._devices[ctx.device].attributes[A.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT]
        )
        return min(1.0, grid[0] * grid[1] * grid[2] / sms)

    def _prepared_launch(
        self,
        kernel: SimKernel,
        ctx,
        grid,
        block,
        shared,
        kernelParams,
        extra,
        cluster=None,
        cooperative=False,
    ):
        """(CUresult, `Launch`): the driver's checks of a launch in ``ctx`` and its parameter
        bytes, copied now. Launches and kernel graph nodes share it."""
        if isinstance(kernel.owner, SimModule) and kernel.owner.ctx is not ctx:
            return INVALID_HANDLE, None  # a CUfunction works only in its module's context
        err = self._check_config(kernel, ctx.device, grid, block, shared, cluster, cooperative)
        if err:
            return err, None
        if extra not in (None, 0):
            return NOT_SUPPORTED, None  # cuctx passes parameters through kernelParams only
        err, raw = _read_params(kernel.image.info.params, kernelParams)
        if err:
            return err, None
        if kernel.twin is None:
            return NOT_SUPPORTED, None  # the sim has nothing to run (cuctx says so before this)
        if (
            isinstance(kernel.owner, SimLibrary)
            and ctx.handle not in kernel.owner.copies
            and kernel.owner.image.variables
        ):
            with self._lock:  # the library's variables come to this context with its first use
                copies = self._allocate_variables(ctx, kernel.owner.image.variables)
                if copies is None:
                    return OUT_OF_MEMORY, None
                kernel.owner.copies[ctx.handle] = copies
        return OK, Launch(kernel, ctx, grid, block, shared, raw)

    def _check_config(
        self, kernel: SimKernel, device: int, grid, block, shared, cluster, cooperative
    ) -> CUresult:
        """The driver's own checks of a launch (cuctx makes them first, with clear errors)."""
        spec = self._devices[device].attributes
        limits_grid = (
            spec[A.CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X],
            spec[A.CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y],
            spec[A.CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z],
        )
        limits_block = (
            spec[A.CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X],
            spec[A.CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y],
            spec[A.CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z],
        )
        if any(not 1 <= g <= m for g, m in zip(grid, limits_grid)) or any(
            not 1 <= b <= m for b, m in zip(block, limits_block)
        ):
            return INVALID_VALUE
        threads = block[0] * block[1] * block[2]
        if threads > spec[A.CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK]:
            return INVALID_VALUE
        if threads > max_threads(kernel.image, spec):
            return OUT_OF_RESOURCES
        if shared > dynamic_limit(kernel, device, spec):
            return INVALID_VALUE
        if cluster is not None:
            if (
                not spec.get(A.CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH)
                or any(c < 1 or g % c for c, g in zip(cluster, grid))
                or cluster[0] * cluster[1] * cluster[2] > 8
            ):
                return INVALID_VALUE
        if cooperative:
            per_sm = occupancy(kernel, threads, shared, spec)
            most = per_sm * spec[A.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT]
            if grid[0] * grid[1] * grid[2] > most:
                return COOPERATIVE_TOO_LARGE
        return OK


class Launch:
    """One checked launch: the kernel, its context, configuration and parameter bytes."""

    __slots__ = ("kernel", "ctx", "grid", "block", "shared", "raw")

    def __init__(self, kernel: SimKernel, ctx, grid, block, shared: int, raw: list[bytes]):
        self.kernel = kernel
        self.ctx = ctx
        self.grid = grid
        self.block = block
        self.shared = shared
        self.raw = raw

    def run(self, driver):
        """The operation that runs the twin registered now (a later registration does not
        change work already queued)."""
        ctx, name, grid, block, raw = self.ctx, self.kernel.name, self.grid, self.block, self.raw
        twin, kinds = self.kernel.twin, self.kernel.kinds

        def run():
            return run_twin(driver, ctx, name, twin, grid, block, kinds, raw)

        return run


def _read_params(params, kernelParams) -> tuple[CUresult, list[bytes] | None]:
    """Copy each parameter's bytes from the ``void**`` array at ``kernelParams`` (an int
    address, as cuctx passes it), as the driver does at launch time."""
    if not params:
        return OK, []
    if not isinstance(kernelParams, int) or kernelParams == 0:
        return INVALID_VALUE, None
    pointers = (ctypes.c_void_p * len(params)).from_address(kernelParams)
    if any(p is None for p in pointers):
        return INVALID_VALUE, None
    return OK, [ctypes.string_at(pointers[i], p.size) for i, p in enumerate(params)]
