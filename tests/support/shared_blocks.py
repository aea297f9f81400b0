"""Named shared memory blocks for the tests of what worker processes share: each is
opened again by name, as another process would open it (the supervisor's own blocks have
no name: ``gateway.shared_load.SharedBlock``). The test closes and unlinks them."""

from __future__ import annotations

from multiprocessing import shared_memory
from typing import Any

from gateway.box_feed import BLOCK_BYTES, BoxFeed, FeedBlock
from gateway.fleet import Fleet
from gateway.shared_load import SharedLoad


def new_load_block(workers: int, slots: int) -> shared_memory.SharedMemory:
    """A new load block for ``workers`` x ``slots``, prepared as the supervisor does."""
    size = SharedLoad.size(workers, slots)
    return SharedLoad.prepare(shared_memory.SharedMemory(create=True, size=size))


def new_feed_block() -> shared_memory.SharedMemory:
    """A new feed block holding no snapshot yet."""
    return FeedBlock.prepare(shared_memory.SharedMemory(create=True, size=BLOCK_BYTES))


def open_box_feed(block: shared_memory.SharedMemory, fleet: Fleet, leader: bool,
             **options: Any) -> BoxFeed:
    """A leader's or follower's ``BoxFeed`` of ``fleet`` over feed ``block``, opened again
    by name as another worker process opens it."""
    return BoxFeed(FeedBlock(shared_memory.SharedMemory(block.name)), fleet, leader,
                   **options)


def box_feed_pair(block: shared_memory.SharedMemory, leader_fleet: Fleet,
                  follower_fleet: Fleet, failures_to_eject: int) -> tuple[BoxFeed, BoxFeed]:
    """A leader's ``BoxFeed`` of ``leader_fleet`` and a follower's of ``follower_fleet``
    over feed ``block``, ejecting after ``failures_to_eject`` failed checks and
    readmitting after one success."""
    return (open_box_feed(block, leader_fleet, True, failures_to_eject=failures_to_eject,
                          successes_to_readmit=1),
            open_box_feed(block, follower_fleet, False, failures_to_eject=failures_to_eject,
                          successes_to_readmit=1))
