"""Every ```python block in README.md and docs/*.md runs as written.

The rule, for whoever writes docs:
- A page is one program. Its ```python blocks run top to bottom in one namespace, in a fresh
  Python process of their own, so a block may use what an earlier block *of the same page*
  imported or defined (as a reader who types the page into one session would), never what
  another page did.
- Each page runs on every backend: the sim everywhere, the cuda backend where there is a GPU.
- A block that needs a real GPU (e.g. interop with PyTorch) is marked ```python gpu: it runs on
  the cuda backend only. Use it sparingly: everything else must run on the sim.
- A block that shows what only the sim does (its deterministic ordering, say) is marked
  ```python sim: it runs on the sim only.
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
    ``only`` the backend a ``gpu`` or ``sim`` block is for (None: every backend)."""
    blocks, lines, i = [], page.read_text().splitlines(), 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        i += 1
        if not fence:
            continue
        info = fence["info"].split()
        start, indent = i, fence["indent"]
        while i < len(lines) and lines[i].strip() != "```":  # the closing fence
            i += 1
        if info[:1] == ["python"]:
            # A block inside a list item is indented like its fence; the code is not.
            code = "\n".join(line.removeprefix(indent) for line in lines[start:i])
            only = "cuda" if "gpu" in info[1:] else "sim" if "sim" in info[1:] else None
            blocks.append({"line": start + 1, "code": code, "only": only})
        i += 1
    return blocks


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


def run_page(page: pathlib.Path, backend: str, tmp_path) -> subprocess.CompletedProcess:
    blocks = [b for b in python_blocks(page) if b["only"] in (None, backend)]
    return run_python("-c", _RUNNER, input=json.dumps([str(page.relative_to(ROOT)), blocks]),
                      cwd=tmp_path, timeout=300, CUCTX_BACKEND=backend,
                      CUCTX_CACHE_DIR=str(tmp_path / "cache"))


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("page", [p for p in PAGES if python_blocks(p)],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_every_python_block_runs(page, name, tmp_path):
    proc = run_page(page, name, tmp_path)
    assert proc.returncode == 0, proc.stderr


def test_the_readme_kernel_example_prints_what_it_says(tmp_path):
    proc = run_page(ROOT / "README.md", "sim", tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "[0. 2. 4. 6.]" in proc.stdout.splitlines()


def test_blocks_are_found_as_the_rule_says(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("text\n```python\na = 1\n```\n```sh\nls\n```\n- item\n\n  ```python gpu\n"
                    "  if a:\n      b = 2\n  ```\n```\nnot python\n```\n"
                    "```python sim\nc = 3\n```\n")
    assert python_blocks(page) == [{"line": 3, "code": "a = 1", "only": None},
                                   {"line": 11, "code": "if a:\n    b = 2", "only": "cuda"},
                                   {"line": 18, "code": "c = 3", "only": "sim"}]


# Examples are named by what they show; where they came from means nothing to a reader.
_ORIGIN = re.compile(r"\bseeds?\s+\d|\bseeds?'s?(?=\s)|\bthe seeds?\b", re.IGNORECASE)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_docs_do_not_name_where_examples_came_from(page):
    found = [f"{page.name}:{n}: {line.strip()}"
             for n, line in enumerate(page.read_text().splitlines(), 1) if _ORIGIN.search(line)]
    assert not found, "\n".join(found)
