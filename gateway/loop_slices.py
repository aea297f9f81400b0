"""Long work on the event loop, a slice at a time.

Work over thousands of items (decoding a Kubernetes list page, making replicas of its
objects, adding them to the fleet) held the loop for as long as it took: every request of
the gateway waited meanwhile. Done here, the loop is handed back whenever ``SLICE_S`` of
it has passed, so a stall is one slice and one item, whatever the count.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TypeVar

SLICE_S = 0.002  # work between two hand-backs to the loop
T = TypeVar("T")


class Slices:
    """Hands the loop back once ``SLICE_S`` has passed since it last did: ``await
    slices.after_item()`` after each item of the work."""

    __slots__ = ("_loop", "_until")

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._until = self._loop.time() + SLICE_S

    async def after_item(self) -> None:
        if self._loop.time() >= self._until:
            await asyncio.sleep(0)
            self._until = self._loop.time() + SLICE_S


async def each_handing_back(items: list[T]) -> AsyncIterator[T]:
    """The items of ``items``, in order, each taken out of the list as it is handed on
    (what the caller keeps of it is all that stays), the loop handed back between slices:
    a caller's work on thousands of them, and freeing them, is then a slice at a time
    too. ``items`` is left empty."""
    slices = Slices()
    items.reverse()  # taken from the end: each pop is O(1)
    while items:
        yield items.pop()
        await slices.after_item()
