"""Isolated devices: calls run in worker processes, so that a faulting kernel, a hang or a
crash costs one worker and not the program (`IsolatedExecutor`; docs/isolation.md).

Nothing below this package imports it.
"""

from ._core import WorkerInfo
from ._executor import IsolatedExecutor

__all__ = ["IsolatedExecutor", "WorkerInfo"]
