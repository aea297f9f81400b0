"""KV cache sizing: how many blocks a budget of GiB holds."""

from __future__ import annotations

GIB = 1 << 30


def blocks_in_gib(gib: float, kv_bytes_per_token: int, block_size: int) -> int:
    """Whole blocks of ``block_size`` tokens that ``gib`` GiB of KV holds."""
    return int(gib * GIB) // (kv_bytes_per_token * block_size)
