"""Random programs against the whole API on one thread, checked against a NumPy model
(tests/fuzz): no crash or hang, only cuctx errors and TypeError/ValueError/IndexError (with
a message), device memory back to its baseline after each program, results as the model's.
``CUCTX_FUZZ=long`` runs the long profile (scripts/gpu-check does on the GPU)."""

import pytest

from conftest import requires_nvrtc
from fuzz import run as fuzz
from fuzz.launches import LaunchMachine


@pytest.mark.device_memory
@requires_nvrtc
def test_random_programs_on_one_thread(backend, tmp_path_factory, request):
    env = fuzz.make_env(backend, str(tmp_path_factory.getbasetemp() / "nvrtc-cache"))
    with fuzz.counted(request, f"single-thread-{backend.name}"):
        fuzz.run(LaunchMachine, env, weight=0.5)
