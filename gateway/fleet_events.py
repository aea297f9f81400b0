"""What a ``Fleet`` tells its listeners: replicas joining and leaving, health changes,
restarts noticed in a scrape, and prefix caches flushed through the admin API.

Listeners (the policy, the KV-event subscriber) are called synchronously on the event
loop thread, after the fleet's state changed; they must not await or block.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from policies.base import ReplicaRemoved, ReplicaReset


@dataclass(frozen=True, slots=True)
class ReplicaAdded:
    replica: str


@dataclass(frozen=True, slots=True)
class HealthChanged:
    replica: str
    healthy: bool


@dataclass(frozen=True, slots=True)
class CacheFlushed:
    """The replica's prefix cache was emptied on the gateway's request (``/flush_cache``):
    what it held is gone, though its process and KV pool are the same."""

    replica: str


FleetEvent = ReplicaAdded | ReplicaRemoved | ReplicaReset | HealthChanged | CacheFlushed
FleetListener = Callable[[FleetEvent], None]
