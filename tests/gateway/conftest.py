"""Fixtures the gateway's tests share."""

from __future__ import annotations

from collections.abc import Iterator
from multiprocessing import shared_memory

import pytest

from tests.support.shared_blocks import new_feed_block


@pytest.fixture
def feed_block() -> Iterator[shared_memory.SharedMemory]:
    """A new worker feed block, closed and unlinked after the test."""
    block = new_feed_block()
    yield block
    block.close()
    block.unlink()
