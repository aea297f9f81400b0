"""``least_load``: the replica with the fewest queued prompt tokens, ties at random."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from policies.base import Decision, Policy, ReplicaScore, ReplicaView, RouteRequest, healthy


def least_loaded(replicas: Sequence[ReplicaView], rng: random.Random) -> ReplicaView:
    """The replica with the fewest queued tokens per unit of weight; a tie is broken by
    ``rng`` (never by list order). ``replicas`` must be non-empty."""
    best: list[ReplicaView] = []
    best_load = float("inf")
    for r in replicas:
        load = r.queued_tokens / r.weight if r.weight > 0 else float("inf")
        if load < best_load:
            best_load, best = load, [r]
        elif load == best_load:
            best.append(r)
    if not best:  # every weight is zero: fall back to raw queue length
        return min(replicas, key=lambda r: r.queued_tokens)
    return best[0] if len(best) == 1 else rng.choice(best)


@dataclass(frozen=True, slots=True)
class LeastLoadConfig:
    """``seed``: seed of the policy's own generator for tie breaks."""

    seed: int = 0


class LeastLoad(Policy):
    """Ranks healthy replicas by queued prompt tokens (per unit of weight), ties shuffled."""

    name = "least_load"
    reasons = ("balance",)
    tokens_needed = 0

    def __init__(self, config: LeastLoadConfig | None = None) -> None:
        self.config = config or LeastLoadConfig()
        self._rng = random.Random(self.config.seed)

    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaView]) -> Decision:
        ok = healthy(replicas)
        rng = self._rng
        keyed = [
            (r.queued_tokens / r.weight if r.weight > 0 else float("inf"), rng.random(), r)
            for r in ok
        ]
        keyed.sort(key=lambda t: (t[0], t[1]))
        scores = tuple(ReplicaScore(r.id, -load) for load, _, r in keyed)
        return Decision(tuple(r.id for _, _, r in keyed), "balance", 0, scores)
