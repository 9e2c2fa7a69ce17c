"""A virtual GPU with the driver's interface.

`SimDriver` implements the ``cuda.bindings.driver`` functions cuctx uses, with the same
signatures, result tuples, handle types and error codes as the real driver, so everything
above the seam runs unchanged on a machine without a GPU. Each concept lives in its own
mixin module; `SimDriver` composes them.
"""

from .driver import SimDriver

__all__ = ["SimDriver"]
