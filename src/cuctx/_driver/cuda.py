"""The real driver: the cuda.bindings.driver module itself, once it has proven usable."""

from __future__ import annotations


def probe():
    """(driver module, reason) when libcuda loads, cuInit succeeds and a device exists;
    (None, why not) otherwise."""
    try:
        from cuda.bindings import driver
    except ImportError as exc:  # cuda-bindings is a dependency, but say so if it is broken
        return None, f"cuda-bindings cannot be imported ({exc})"
    try:
        (err,) = driver.cuInit(0)
    except Exception as exc:  # cuda-pathfinder raises when libcuda.so is absent
        return None, f"no NVIDIA driver found ({type(exc).__name__}: libcuda could not be loaded)"
    if err:
        return None, f"cuInit failed with {err.name}"
    err, count = driver.cuDeviceGetCount()
    if err or count == 0:
        return None, "the NVIDIA driver reports no CUDA device"
    _, version = driver.cuDriverGetVersion()
    return driver, f"NVIDIA driver {version // 1000}.{version % 1000 // 10}, {count} device(s)"
