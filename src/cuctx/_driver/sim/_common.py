"""What every part of the sim shares: result codes, the spec of the modelled GPU."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

from cuda.bindings.driver import CUresult

OK = CUresult.CUDA_SUCCESS
INVALID_VALUE = CUresult.CUDA_ERROR_INVALID_VALUE
NOT_INITIALIZED = CUresult.CUDA_ERROR_NOT_INITIALIZED
INVALID_DEVICE = CUresult.CUDA_ERROR_INVALID_DEVICE
INVALID_CONTEXT = CUresult.CUDA_ERROR_INVALID_CONTEXT
CONTEXT_IS_DESTROYED = CUresult.CUDA_ERROR_CONTEXT_IS_DESTROYED
PRIMARY_CONTEXT_ACTIVE = CUresult.CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE
NOT_SUPPORTED = CUresult.CUDA_ERROR_NOT_SUPPORTED
NOT_PERMITTED = CUresult.CUDA_ERROR_NOT_PERMITTED


@cache
def h100_spec() -> dict:
    """Attributes and error strings recorded from a real H100 (scripts/probe_driver.py)."""
    return json.loads((Path(__file__).with_name("h100.json")).read_text())
