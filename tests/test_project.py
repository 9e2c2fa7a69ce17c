"""What a newcomer sees of the project itself: the package's type hints, pytest's output,
and code that passes the one lint configuration."""

import importlib.resources
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_the_package_ships_its_type_hints():
    # PEP 561: a type checker reads cuctx's annotations only when py.typed is installed with
    # it. A non-editable install (pip install .) copies package-data, which lists it.
    assert importlib.resources.files("cuctx").joinpath("py.typed").is_file()
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "py.typed" in config["tool"]["setuptools"]["package-data"]["cuctx"]


SAMPLE = """
import pytest

@pytest.mark.skip(reason="reason one")
def test_a(): pass

@pytest.mark.skip(reason="reason one")
def test_b(): pass

def test_c(): pytest.skip("reason two")

def test_d(): assert False

@pytest.mark.xfail(reason="known")
def test_e(): assert False
"""


def run_pytest(tmp_path, *args):
    """pytest with this project's settings and tests/conftest.py, on a sample test file."""
    (tmp_path / "test_sample.py").write_text(textwrap.dedent(SAMPLE))
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]),
    )
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-c",
            str(ROOT / "pyproject.toml"),
            "-p",
            "conftest",
            "-p",
            "no:cacheprovider",
            "--rootdir",
            str(tmp_path),
            *args,
            "test_sample.py",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def test_skips_are_summarised_by_reason(tmp_path):
    out = run_pytest(tmp_path).stdout
    assert "3 skipped, by reason" in out
    assert "   2 in 1 file: reason one" in out.splitlines()
    assert "   1 in 1 file: reason two" in out.splitlines()
    assert "SKIPPED [" not in out  # no line per skipped test
    # failures and xfails are still listed by pytest itself
    assert "FAILED test_sample.py::test_d" in out and "XFAIL test_sample.py::test_e" in out


def test_asking_for_skip_lines_gets_pytests_own(tmp_path):
    out = run_pytest(tmp_path, "-rs").stdout
    assert "SKIPPED [1] test_sample.py:4: reason one" in out
    assert "by reason" not in out


CODE = ("src", "tests", "benchmarks", "scripts")


def ruff(*args: str) -> subprocess.CompletedProcess:
    pytest.importorskip("ruff", reason="ruff comes with the test extra: pip install -e '.[test]'")
    return subprocess.run(
        [sys.executable, "-m", "ruff", *args, *CODE], cwd=ROOT, capture_output=True, text=True
    )


def test_the_code_passes_the_one_lint_configuration():
    """pyproject.toml's [tool.ruff] is the one linter configuration (pyflakes, pycodestyle with
    the 100-column limit, bugbear); CI runs it through this test."""
    run = ruff("check")
    assert run.returncode == 0, run.stdout + run.stderr


def test_the_code_is_as_the_one_formatter_writes_it():
    """`ruff format` (the version the test extra pins, pyproject.toml's [tool.ruff]) is the one
    formatter; CI runs its check through this test. To mend: ruff format src tests benchmarks
    scripts."""
    run = ruff("format", "--check")
    assert run.returncode == 0, run.stdout + run.stderr


def test_families_live_in_their_subpackages_and_modules_stay_small():
    """docs/ARCHITECTURE.md's map is the folder tree: the package root keeps the core concepts
    (at most 16 source files), families are subpackages, and no module passes 500 lines (the
    examples are programs to read whole, not modules)."""
    package = ROOT / "src" / "cuctx"
    root_sources = [p.name for p in package.iterdir() if p.suffix in (".py", ".c", ".h")]
    assert len(root_sources) <= 16, sorted(root_sources)
    for family in ("kernels", "memory", "graphs", "tools", "csrc", "_driver"):
        assert (package / family).is_dir(), family
    too_long = {
        str(p.relative_to(package)): n
        for p in package.rglob("*.py")
        if "examples" not in p.parts and (n := len(p.read_text().splitlines())) > 500
    }
    assert not too_long, too_long
