"""A count of the event loop's turns while a test's work runs: work that hands the loop
back between its slices lets other coroutines run meanwhile (the count grows), work that
holds it does not."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator


class LoopTurns:
    """The turns a coroutine of its own has had so far (``count``)."""

    def __init__(self) -> None:
        self.count = 0

    async def _turn(self, every_s: float) -> None:
        while True:
            self.count += 1
            await asyncio.sleep(every_s)


@contextlib.asynccontextmanager
async def counted_turns(every_s: float = 0.0) -> AsyncIterator[LoopTurns]:
    """A ``LoopTurns`` counting, within the block, a turn every ``every_s`` seconds (0: at
    every pass of the loop); the counting task ends with the block."""
    turns = LoopTurns()
    task = asyncio.create_task(turns._turn(every_s))
    try:
        yield turns
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
