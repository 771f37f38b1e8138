"""Integer arithmetic that block bookkeeping needs everywhere: ceiling division. Pure Python."""

from __future__ import annotations


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for integers, without floats: the blocks ``a`` tokens take at ``b`` per block."""
    return -(-a // b)
