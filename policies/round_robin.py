"""``round_robin``: the baseline; healthy replicas in turn."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from policies.base import Decision, Policy, ReplicaView, Routed, RouteEvent, RouteRequest, healthy


@dataclass(frozen=True, slots=True)
class RoundRobinConfig:
    """No parameters."""


class RoundRobin(Policy):
    """Takes healthy replicas in turn. The turn advances in ``observe(Routed)``, so
    ``choose`` without routing (explain) leaves the rotation where it was."""

    name = "round_robin"
    reasons = ("round_robin",)
    tokens_needed = 0

    def __init__(self, config: RoundRobinConfig | None = None) -> None:
        self.config = config or RoundRobinConfig()
        self._turn = 0

    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaView]) -> Decision:
        ok = healthy(replicas)
        start = self._turn % len(ok)
        ranked = tuple(r.id for r in ok[start:]) + tuple(r.id for r in ok[:start])
        return Decision(ranked, "round_robin")

    def observe(self, event: RouteEvent) -> None:
        if isinstance(event, Routed):
            self._turn += 1
