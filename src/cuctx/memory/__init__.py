"""Device memory and what moves it: arrays (`DeviceArray`) allocated stream-ordered from
memory pools (`MemoryPool`, shareable with other processes), managed memory, page-locked
host memory, layouts (indexing, views, copy planning), copies and fills of any layout, and
interop with other libraries (CUDA Array Interface, DLPack). See docs/memory.md."""

from __future__ import annotations

from ._array import DeviceArray, copy, defer_cleanup, empty, pinned_empty, register_host
from ._construct import asarray, full, to_device, zeros
from ._managed import managed_empty
from ._pool import MemoryPool

__all__ = [
    "DeviceArray",
    "MemoryPool",
    "asarray",
    "copy",
    "defer_cleanup",
    "empty",
    "full",
    "managed_empty",
    "pinned_empty",
    "register_host",
    "to_device",
    "zeros",
]
