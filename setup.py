"""The one thing pyproject.toml cannot say: the optional C extension cuctx._native (the
compiled fast path: the C sources in src/cuctx/csrc/, module init in native.c, all sharing
native.h). It needs a C compiler and Python's headers, no CUDA toolkit. Where it cannot be
built, the install goes on without it (``optional=True``) and cuctx runs its pure-Python
paths; ``python -m cuctx info`` says which is in use."""

from setuptools import Extension, setup

PARTS = ("native", "driver", "launch", "launch_plan", "streams", "contexts", "methods", "copies",
         "autograph", "autograph_call", "autograph_serve", "autograph_build", "arrays", "announce")

setup(ext_modules=[Extension("cuctx._native", [f"src/cuctx/csrc/{part}.c" for part in PARTS],
                             depends=["src/cuctx/csrc/native.h"], optional=True)])
