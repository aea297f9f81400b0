"""KV cache sizing: how many blocks a budget of GiB holds, and whether a machine has it."""

from __future__ import annotations

import os

GIB = 1 << 30
# what the engine core keeps in host memory for each KV block, whichever executor holds the
# KV itself (the pool's reference count and free-list entry, the block's hash in two maps,
# its eviction-queue entry): a generous estimate, so that a cache whose records alone
# would not fit in memory is refused at start
RECORD_BYTES_PER_BLOCK = 512


def blocks_in_gib(gib: float, kv_bytes_per_token: int, block_size: int) -> int:
    """Whole blocks of ``block_size`` tokens that ``gib`` GiB of KV holds."""
    return int(gib * GIB) // (kv_bytes_per_token * block_size)


def window_blocks(blocks: int, window: int, block_size: int) -> int:
    """Of a cached prefix of ``blocks`` blocks of ``block_size`` tokens, those a layer
    attending within the last ``window`` tokens keeps, as vLLM's hybrid KV cache manager
    sizes it: the next token attends to the ``window - 1`` tokens before it, which span
    ``ceil((window - 1) / block_size)`` blocks, and one block more where the window does
    not start at a block's start; the blocks before are freed, and a longer prefix whose
    last window of blocks is cached is still a hit. At most all ``blocks``; with blocks
    of one token, ``min(blocks, window)``."""
    return min(blocks, -(-(window - 1) // block_size) + 1)


def host_memory_bytes() -> int | None:
    """This machine's physical memory (None where the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None
