"""Every ```python block in README.md and docs/*.md runs as written.

The rule, for whoever writes docs:
- A page is one program. Its ```python blocks run top to bottom in one namespace, in a fresh
  Python process of their own, so a block may use what an earlier block *of the same page*
  imported or defined (as a reader who types the page into one session would), never what
  another page did.
- Each page runs on every backend: the sim everywhere (CI has no GPU), the cuda backend where
  there is a GPU. A block runs on both unless marked.
- A block the sim cannot run (interop with PyTorch's CUDA tensors, say) is marked
  ```python gpu-only: REASON, the reason in words: it runs on the cuda backend only, so CI never
  runs it. A test holds the marker to its word: a gpu-only block that runs on the sim fails it
  (drop the marker, and CI runs the block).
- A block that shows what only the sim does (its deterministic ordering, say) is marked
  ```python sim: it runs on the sim only.
- A block that needs an optional package (nvJitLink, for a link) is marked ```python needs
  NAME: REASON, NAME one of `NEEDS` below: it runs on every backend where the package loads;
  where it does not, the page runs without it and its test is skipped with the reason (CI's
  test extra installs the packages, so CI runs it). Later blocks must not use what it made.
- Nothing else may follow ```python: a misspelt marker would silently run the block everywhere.
- Other fences (```sh, ```text, no language) are not run: use them for shell commands, output
  and pseudo-code, never for Python a reader would paste.
- A race between streams fails the page, as it fails a test (the sim checks every run): a
  block that shows one collects it (``cuctx.racecheck("collect")``) or catches the warning.
"""

import json
import pathlib
import re
import subprocess

import pytest

from conftest import BACKENDS
from scenarios import run_python

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

_FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<info>.*)$")


def python_blocks(page: pathlib.Path) -> list[dict]:
    """The page's ```python blocks: {"line": first code line (1-based), "code", "only"},
    ``only`` the backend a ``gpu-only`` or ``sim`` block is for (None: every backend)."""
    blocks, lines, i = [], page.read_text().splitlines(), 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        i += 1
        if not fence:
            continue
        start, indent = i, fence["indent"]
        while i < len(lines) and lines[i].strip() != "```":  # the closing fence
            i += 1
        language, _, marker = fence["info"].strip().partition(" ")
        if language == "python":
            # A block inside a list item is indented like its fence; the code is not.
            code = "\n".join(line.removeprefix(indent) for line in lines[start:i])
            where = f"{page.name}:{start}"
            need = _need(marker.strip(), where)
            block = {
                "line": start + 1,
                "code": code,
                "only": None if need else _only(marker.strip(), where),
            }
            if need:
                block["needs"] = need
            blocks.append(block)
        i += 1
    return blocks


def _nvjitlink_missing() -> str | None:
    from cuctx.kernels._jitlink import _nvjitlink

    return _nvjitlink()[1]


# The optional packages a block may need: name -> why it cannot load (None: it loads).
NEEDS = {"nvjitlink": _nvjitlink_missing}


def _need(marker: str, where: str) -> str | None:
    """The package a ``needs NAME: REASON`` marker names (None for other markers)."""
    if not marker.startswith("needs "):
        return None
    name, _, reason = marker.removeprefix("needs ").partition(":")
    if name.strip() not in NEEDS or not reason.strip():
        raise ValueError(
            f"{where}: ```python {marker!r}: write `needs NAME: REASON` with NAME "
            f"one of {sorted(NEEDS)} (see tests/test_docs.py)"
        )
    return name.strip()


def _only(marker: str, where: str) -> str | None:
    """The backend a block's marker keeps it to (None: every backend)."""
    if marker == "":
        return None
    if marker == "sim":
        return "sim"
    if marker.startswith("gpu-only") and marker.removeprefix("gpu-only").strip(" :"):
        return "cuda"
    raise ValueError(
        f"{where}: ```python {marker!r} is no marker: a block runs on every "
        "backend; mark it `sim` (the sim only) or `gpu-only: why the sim cannot "
        "run it` (see tests/test_docs.py)"
    )


# Runs in the page's own process: each block compiled with the page's name and the block's
# line numbers, so a traceback points into the page.
_RUNNER = r"""
import json, sys, traceback, warnings
from cuctx.errors import RaceWarning
warnings.filterwarnings("error", category=RaceWarning)
page, blocks = json.load(sys.stdin)
namespace = {"__name__": "__main__"}
for block in blocks:
    code = "\n" * (block["line"] - 1) + block["code"]
    try:
        exec(compile(code, page, "exec"), namespace)
    except BaseException:
        traceback.print_exc()
        print(f"the block at {page}:{block['line']} failed", file=sys.stderr)
        sys.exit(1)
"""


def run_page(
    page: pathlib.Path, backend: str, tmp_path, blocks: list[dict] | None = None
) -> subprocess.CompletedProcess:
    """The page's blocks for ``backend`` in one process (or the ``blocks`` given)."""
    if blocks is None:
        blocks = [
            b
            for b in python_blocks(page)
            if b["only"] in (None, backend) and not (b.get("needs") and NEEDS[b["needs"]]())
        ]
    name = str(page.relative_to(ROOT) if page.is_relative_to(ROOT) else page)
    return run_python(
        "-c",
        _RUNNER,
        input=json.dumps([name, blocks]),
        cwd=tmp_path,
        timeout=300,
        CUCTX_BACKEND=backend,
        CUCTX_CACHE_DIR=str(tmp_path / "cache"),
    )


def gpu_only_blocks_the_sim_runs(page: pathlib.Path, tmp_path) -> list[int]:
    """The lines of the page's gpu-only blocks that run on the sim after the blocks the sim
    runs before them (a reader's session up to that block)."""
    blocks, wrong = python_blocks(page), []
    for k, block in enumerate(blocks):
        if block["only"] == "cuda":
            before = [b for b in blocks[:k] if b["only"] in (None, "sim")]
            if run_page(page, "sim", tmp_path, [*before, block]).returncode == 0:
                wrong.append(block["line"])
    return wrong


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize(
    "page", [p for p in PAGES if python_blocks(p)], ids=lambda p: str(p.relative_to(ROOT))
)
def test_every_python_block_runs(page, name, tmp_path):
    proc = run_page(page, name, tmp_path)
    assert proc.returncode == 0, proc.stderr
    missing = {
        b["needs"]: why
        for b in python_blocks(page)
        if b.get("needs") and (why := NEEDS[b["needs"]]())
    }
    if missing:
        pytest.skip(
            f"the page ran without its blocks that need {', '.join(missing)}: "
            f"{'; '.join(missing.values())}"
        )


def test_the_readme_kernel_example_prints_what_it_says(tmp_path):
    proc = run_page(ROOT / "README.md", "sim", tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "[0. 2. 4. 6.]" in proc.stdout.splitlines()


def _text_after(page: pathlib.Path, words: str) -> list[str]:
    """The lines of the first ```text block after ``words`` on the page."""
    text = page.read_text()
    at = text.index("```text", text.index(words)) + len("```text\n")
    return text[at : text.index("```", at)].splitlines()


def _same_report(shown: list[str], printed: str) -> None:
    """What a page shows of a report is what the sim printed: its lines joined (the page
    wraps them), "..." standing for what the page leaves out, any handle for a handle."""
    pattern = ""
    for part in re.split(r"(\.\.\.|0x[0-9a-f]+|\s+)", " ".join(shown).strip()):
        pattern += {"...": ".*?", "": ""}.get(part) or (
            r"0x[0-9a-f]+"
            if part.startswith("0x")
            else r"\s+"
            if part.isspace()
            else re.escape(part)
        )
    assert re.search(pattern, printed, re.DOTALL), (
        f"the page shows:\n{chr(10).join(shown)}\nthe sim printed:\n{printed}"
    )


def test_the_readme_race_warning_is_what_the_sim_says(tmp_path):
    """README's warning text: its example with the stream left out of `to_device`."""
    readme = ROOT / "README.md"
    blocks = [b for b in python_blocks(readme) if b["only"] in (None, "sim")]
    line = "x = cuctx.to_device(np.arange(1024, dtype=np.float32), stream=stream)"
    (block,) = [b for b in blocks if line in b["code"]]
    block["code"] = block["code"].replace(line, line.replace(", stream=stream", ""))
    proc = run_page(readme, "sim", tmp_path, blocks[: blocks.index(block) + 1])
    assert proc.returncode == 1  # the race, a RaceWarning the runner makes an error
    printed = proc.stderr[proc.stderr.index("RaceWarning: ") :]
    shown = _text_after(readme, "naming the wait that is missing and the fix")
    # (raised by the runner, the warning's "README.md:124: RaceWarning: " prefix is not there)
    _same_report([shown[0].split("RaceWarning: ")[1], *shown[1:]], printed)


def test_the_checkers_first_report_is_what_the_sim_prints(tmp_path):
    page = ROOT / "docs" / "checks.md"
    first = python_blocks(page)[0]
    proc = run_page(page, "sim", tmp_path, [first])
    assert proc.returncode == 0, proc.stderr
    shown = _text_after(page, "prints (paths shortened)")
    _same_report(shown, proc.stdout.replace("docs/checks.md", "checks.md"))


def test_blocks_are_found_as_the_rule_says(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "text\n```python\na = 1\n```\n```sh\nls\n```\n- item\n\n"
        "  ```python gpu-only: PyTorch\n  if a:\n      b = 2\n  ```\n"
        "```\nnot python\n```\n```python sim\nc = 3\n```\n"
    )
    assert python_blocks(page) == [
        {"line": 3, "code": "a = 1", "only": None},
        {"line": 11, "code": "if a:\n    b = 2", "only": "cuda"},
        {"line": 18, "code": "c = 3", "only": "sim"},
    ]


@pytest.mark.parametrize("marker", ["gpu", "gpu-only", "gpu-only:", "simulator"])
def test_a_marker_the_rule_does_not_know_is_refused(tmp_path, marker):
    page = tmp_path / "page.md"
    page.write_text(f"```python {marker}\na = 1\n```\n")
    with pytest.raises(ValueError, match=r"page.md:1: .*gpu-only: why the sim cannot run it"):
        python_blocks(page)


def test_a_gpu_only_block_the_sim_runs_is_found(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "```python\nimport cuctx\n```\n"
        "```python gpu-only: the sim has no such device\ncuctx.Device(0)\n```\n"
        "```python gpu-only: the sim has no such device\ncuctx.Device(99)\n```\n"
    )
    assert gpu_only_blocks_the_sim_runs(page, tmp_path) == [5]  # Device(0) exists on the sim


def test_gpu_only_blocks_are_those_the_sim_cannot_run(tmp_path):
    wrong = [
        f"{page.relative_to(ROOT)}:{line}"
        for page in PAGES
        for line in gpu_only_blocks_the_sim_runs(page, tmp_path)
    ]
    assert not wrong, f"these gpu-only blocks run on the sim: drop the marker ({wrong})"


# Examples are named by what they show; where they came from means nothing to a reader.
_ORIGIN = re.compile(r"\bseeds?\s+\d|\bseeds?'s?(?=\s)|\bthe seeds?\b", re.IGNORECASE)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_docs_do_not_name_where_examples_came_from(page):
    found = [
        f"{page.name}:{n}: {line.strip()}"
        for n, line in enumerate(page.read_text().splitlines(), 1)
        if _ORIGIN.search(line)
    ]
    assert not found, "\n".join(found)


def test_a_block_that_needs_a_missing_package_is_left_out(tmp_path, monkeypatch):
    page = tmp_path / "page.md"
    page.write_text(
        "```python\na = 1\n```\n```python needs nvjitlink: it links\nb = a\n```\n"
        "```python\nprint(a)\n```\n"
    )
    blocks = python_blocks(page)
    assert blocks[1] == {"line": 5, "code": "b = a", "only": None, "needs": "nvjitlink"}
    monkeypatch.setitem(NEEDS, "nvjitlink", lambda: "not installed")
    proc = run_page(page, "sim", tmp_path)
    assert proc.returncode == 0 and proc.stdout.strip() == "1"
    with pytest.raises(ValueError, match="needs NAME: REASON"):
        page.write_text("```python needs numba: it jits\na = 1\n```\n")
        python_blocks(page)
