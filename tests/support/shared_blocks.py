"""Named shared memory blocks for the tests of what worker processes share: each is
opened again by name, as another process would open it (the supervisor's own blocks have
no name: ``gateway.shared_load.SharedBlock``). The test closes and unlinks them."""

from __future__ import annotations

from multiprocessing import shared_memory

from gateway.box_feed import BLOCK_BYTES, FeedBlock
from gateway.shared_load import SharedLoad


def new_load_block(workers: int, slots: int) -> shared_memory.SharedMemory:
    """A new load block for ``workers`` x ``slots``, prepared as the supervisor does."""
    size = SharedLoad.size(workers, slots)
    return SharedLoad.prepare(shared_memory.SharedMemory(create=True, size=size))


def new_feed_block() -> shared_memory.SharedMemory:
    """A new feed block holding no snapshot yet."""
    return FeedBlock.prepare(shared_memory.SharedMemory(create=True, size=BLOCK_BYTES))
