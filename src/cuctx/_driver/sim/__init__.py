"""A virtual GPU with the driver's interface.

`SimDriver` implements the ``cuda.bindings.driver`` functions cuctx uses, with the same
signatures, result tuples, handle types and error codes as the real driver, so everything
above the seam runs unchanged on a machine without a GPU. Each concept lives in its own
mixin module; `SimDriver` composes them.

Controls that only a simulated GPU has (fault injection, busy streams, kernel twins, the
virtual clock) are not driver functions: `SimControls` offers them, as ``backend.sim``.
"""

from ._controls import SimControls
from ._timing import Activity
from .driver import SimDriver, from_env

__all__ = ["Activity", "SimControls", "SimDriver", "from_env"]
