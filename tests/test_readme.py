"""The README's streams/memory/kernels example runs as written and prints what it says."""

import contextlib
import io
import pathlib

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"


def test_readme_kernel_example_runs(backend):
    text = README.read_text()
    code = text.split("```python\nimport numpy as np\n", 1)[1].split("```", 1)[0]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile("import cuctx\nimport numpy as np\n" + code, "README.md", "exec"), {})  # noqa: S102
    assert out.getvalue().strip() == "[0. 2. 4. 6.]"
