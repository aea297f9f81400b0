"""The contract between a discovery source and the runner that owns it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

from gateway.discovery.stats import SourceStats
from gateway.discovery.targets import Targets

# applies a source's whole current set to the fleet (gateway.membership.reconcile)
Publish = Callable[[Targets], Awaitable[None]]


class Source(Protocol):
    stats: SourceStats

    @property
    def label(self) -> str: ...

    async def run(self, publish: Publish) -> None:
        """Find replicas until cancelled, calling ``publish`` with the whole set each time
        it changes (or is confirmed); never returns on its own, never raises but
        ``CancelledError``: failures are counted in ``stats`` and retried."""

    async def close(self) -> None:
        """Release what the source holds (clients, sessions); after ``run`` ended."""
