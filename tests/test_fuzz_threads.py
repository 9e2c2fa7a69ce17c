"""Random programs on several threads at once, sharing contexts and arrays with the main
thread's random program (tests/fuzz/threads.py); the invariants of tests/test_fuzz.py, and
no worker hangs. ``CUCTX_FUZZ=long`` runs the long profile."""

import pytest

from conftest import requires_nvrtc
from fuzz import run as fuzz
from fuzz.threads import ThreadMachine


@pytest.mark.device_memory
@requires_nvrtc
def test_random_programs_on_several_threads(backend, tmp_path_factory, request):
    env = fuzz.make_env(backend, str(tmp_path_factory.getbasetemp() / "nvrtc-cache"))
    with fuzz.counted(request, f"threads-{backend.name}"):
        fuzz.run(ThreadMachine, env, weight=0.5, examples=80)
