"""What a ``Fleet`` tells its listeners: replicas joining and leaving, health changes, and
restarts noticed in a scrape.

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


FleetEvent = ReplicaAdded | ReplicaRemoved | ReplicaReset | HealthChanged
FleetListener = Callable[[FleetEvent], None]
