"""The one thing pyproject.toml cannot say: the optional C extension cuctx._native (the
compiled fast path: src/cuctx/_native.c, module init, and the _native_*.c beside it, all
sharing src/cuctx/_native.h). It needs a C compiler and Python's headers, no CUDA toolkit.
Where it cannot be built, the install goes on without it (``optional=True``) and cuctx runs
its pure-Python paths; ``python -m cuctx info`` says which is in use."""

from setuptools import Extension, setup

PARTS = ("", "_driver", "_launch", "_streams", "_contexts", "_methods")

setup(ext_modules=[Extension("cuctx._native", [f"src/cuctx/_native{part}.c" for part in PARTS],
                             depends=["src/cuctx/_native.h"], optional=True)])
