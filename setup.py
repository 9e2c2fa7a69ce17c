"""The one thing pyproject.toml cannot say: the optional C extension cuctx._native (the
compiled fast path, src/cuctx/_native.c). It needs a C compiler and Python's headers, no CUDA
toolkit. Where it cannot be built, the install goes on without it (``optional=True``) and
cuctx runs its pure-Python paths; ``python -m cuctx info`` says which is in use."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("cuctx._native", ["src/cuctx/_native.c"], optional=True)])
