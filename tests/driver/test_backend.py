"""Backend selection: CUCTX_BACKEND, the reason cuctx gives, and clear errors."""

import subprocess

import pytest

import cuctx
from cuctx import _driver

from conftest import HAVE_GPU
import scenarios


def run_python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    """The code in a child that inherits none of this process's CUCTX_ settings."""
    return scenarios.run_python("-c", code, clean=True, **env)


def test_auto_says_which_backend_and_why():
    proc = run_python("import cuctx; b = cuctx.backend(); print(b.name); print(b)")
    assert proc.returncode == 0, proc.stderr
    name, text = proc.stdout.splitlines()
    assert name == ("cuda" if HAVE_GPU else "sim")
    if HAVE_GPU:
        assert text.startswith("cuda: NVIDIA driver ")
    else:
        assert text.startswith("sim: no NVIDIA driver found")


def test_unknown_backend_name_is_a_clear_error():
    proc = run_python("import cuctx; cuctx.Device(0)", CUCTX_BACKEND="opencl")
    assert proc.returncode != 0
    assert "unknown cuctx backend 'opencl'" in proc.stderr and "auto, cuda, sim" in proc.stderr
    with pytest.raises(ValueError, match="choose one of"):
        cuctx.set_backend("gpu")


@pytest.mark.skipif(HAVE_GPU, reason="this machine has a GPU, so the cuda backend is available")
def test_asking_for_cuda_without_a_driver_is_a_clear_error():
    with pytest.raises(cuctx.BackendUnavailableError, match="CUCTX_BACKEND=sim"):
        _driver.select("cuda")


def test_sim_device_count_comes_from_the_environment():
    code = "import cuctx; print(len(cuctx.devices()))"
    assert run_python(code, CUCTX_BACKEND="sim").stdout.strip() == "2"
    assert run_python(code, CUCTX_BACKEND="sim", CUCTX_SIM_DEVICES="3").stdout.strip() == "3"
    bad = run_python(code, CUCTX_BACKEND="sim", CUCTX_SIM_DEVICES="two")
    assert bad.returncode != 0 and "CUCTX_SIM_DEVICES must be a whole number" in bad.stderr


def test_objects_keep_the_backend_they_were_made_on(sim):
    device = cuctx.Device(0)
    assert device._backend is sim
    assert cuctx.backend() is sim


@pytest.mark.parametrize("value", ["", "  ", "AUTO", " Sim ", "SIM"])
def test_backend_names_ignore_case_and_blanks_and_empty_means_auto(value):
    proc = run_python("import cuctx; print(cuctx.backend().name)", CUCTX_BACKEND=value)
    assert proc.returncode == 0, proc.stderr
    expected = "sim" if "sim" in value.lower() or not HAVE_GPU else "cuda"
    assert proc.stdout.strip() == expected


def test_set_backend_ignores_case():
    before = cuctx.backend()
    try:
        assert cuctx.set_backend(" SIM ").name == "sim"
    finally:
        _driver._active = before


@pytest.mark.parametrize("value", ["-1", "two", "1.5"])
def test_a_bad_sim_device_count_names_the_variable(value):
    proc = run_python("import cuctx; cuctx.devices()", CUCTX_BACKEND="sim", CUCTX_SIM_DEVICES=value)
    assert proc.returncode != 0
    assert (
        f"CUCTX_SIM_DEVICES must be a whole number of devices (0 or more), got {value!r}"
        in proc.stderr
    )


def test_an_empty_sim_device_count_means_the_default():
    proc = run_python(
        "import cuctx; print(len(cuctx.devices()))", CUCTX_BACKEND="sim", CUCTX_SIM_DEVICES=""
    )
    assert proc.stdout.strip() == "2", proc.stderr


# -- the slots: driver, sim, native -----------------------------------------------------


def test_the_slots_say_what_a_backend_can_do(backend):
    from cuctx._driver.sim import SimControls

    if backend.native is None:  # not built, or turned off (CUCTX_NATIVE=0, a test's path)
        assert backend.native_reason
    else:  # the driver's C functions on a GPU, the sim's Python functions on the sim
        assert backend.native.compiled is (backend.sim is None)
    if backend.name == "sim":
        assert isinstance(backend.sim, SimControls)
    else:
        from cuda.bindings import driver

        assert backend.driver is driver and backend.sim is None


def test_the_sim_driver_has_only_the_names_of_cuda_bindings_driver(sim):
    from cuda.bindings import driver

    public = [name for name in dir(sim.driver) if not name.startswith("_")]
    assert public and [name for name in public if not hasattr(driver, name)] == []


def test_no_code_above_the_seam_asks_for_the_sim_by_name():
    """Callers ask the slots (``backend.sim is not None``), never ``backend.name``."""
    import pathlib
    import re

    root = pathlib.Path(cuctx.__file__).parent
    asks = re.compile(r"""\.name\s*[!=]=\s*["'](sim|cuda)["']|driver\.sim[A-Z]""")
    found = [
        f"{path.relative_to(root)}:{number}"
        for path in root.rglob("*.py")
        if "_driver" not in path.parts
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if asks.search(line)
    ]
    assert found == []


def test_the_sim_controls_are_public_in_cuctx_sim(sim):
    import cuctx.sim

    stream = cuctx.Stream()
    before = cuctx.sim.clock()
    start, end = cuctx.Event(timing=True), cuctx.Event(timing=True)
    start.record(stream)
    cuctx.sim.stream_busy(stream, 3_000_000)
    end.record(stream)
    end.synchronize()
    assert end - start == pytest.approx(3.0)  # ms, read from the virtual clock
    assert cuctx.sim.clock() - before >= 3_000_000
    with pytest.raises(RuntimeError, match="stream_busy failed with CUDA_ERROR_INVALID_VALUE"):
        cuctx.sim.stream_busy(stream, -1)


@pytest.mark.skipif(not HAVE_GPU, reason="needs the cuda backend")
def test_the_sim_controls_refuse_a_real_gpu(gpu):
    import cuctx.sim

    with pytest.raises(RuntimeError, match="sim backend only"):
        cuctx.sim.inject_fault(cuctx.Device(0).primary_context)
    with pytest.raises(RuntimeError, match="sim backend only"):
        cuctx.sim.clock()
