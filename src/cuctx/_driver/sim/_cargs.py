"""C argument conversion as cuda.bindings does it, so a call the bindings would refuse
(OverflowError) is refused by the sim the same way, before it queues anything."""

from __future__ import annotations


def unsigned(value, bits: int, name: str) -> int:
    """``value`` converted as cuda.bindings converts an unsigned C argument of type ``name``."""
    number = int(value)
    if number < 0:
        raise OverflowError(f"can't convert negative value to {name}")
    if number >> bits:
        raise OverflowError(f"value too large to convert to {name}")
    return number


def size_t(value) -> int:
    return unsigned(value, 64, "size_t")
