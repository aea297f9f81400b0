"""``kv_events``: route to the replica with the least work, judged from an exact index of
what each replica caches (fed by the engines' KV events; see ``kv_index``).

For prompt length ``p`` and each healthy replica ``r``::

    overlap[r] = B x (leading prompt blocks r holds),  at most (p - 1) // B blocks
                 (an engine never serves the prompt's last token from cache)
    cost[r]    = (p - overlap[r]) x prefill_weight + queued_tokens[r]

Lowest cost wins, ties at random (never list order); all healthy replicas are ranked by
cost. Reason ``cache_match`` when the winner holds part of the prompt, else ``balance``.
Each score is the replica's cost (lower is better) with its matched tokens.

The policy owns the index; the gateway feeds it (``gateway.kv_event_subscriber``) and tests may feed
it directly. ``choose`` only reads it. ``observe`` clears a replica that restarted and
drops one that left; routing decisions themselves are not recorded (the index is exact).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from policies.base import (
    Decision,
    Policy,
    ReplicaRemoved,
    ReplicaReset,
    ReplicaScore,
    ReplicaView,
    RouteEvent,
    RouteRequest,
    healthy,
)
from policies.kv_index import KVIndex
from policies.size_bounds import check_sizes


@dataclass(frozen=True, slots=True)
class KVEventsConfig:
    """See ``presets/kv_events.yaml`` for what each key means."""

    block_size: int = 16
    prefill_weight: float = 1.0
    seed: int = 0

    def validate(self) -> None:
        check_sizes(self)
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size!r}")
        if self.prefill_weight < 0:
            raise ValueError(f"prefill_weight must be >= 0, got {self.prefill_weight!r}")


class KVEvents(Policy):
    """Least prefill-plus-queue cost over an exact per-replica block index."""

    name = "kv_events"
    reasons = ("cache_match", "balance")
    tokens_needed = None

    def __init__(self, config: KVEventsConfig | None = None) -> None:
        self.config = config or KVEventsConfig()
        self.kv_index: KVIndex = KVIndex(self.config.block_size)
        self._rng = random.Random(self.config.seed)

    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaView]) -> Decision:
        ok = healthy(replicas)
        bs = self.config.block_size
        p = max(request.prompt_tokens, len(request.tokens))
        max_blocks = max(0, (p - 1) // bs)
        if request.cache_salt is None:
            blocks = self.kv_index.match(request.tokens, [r.id for r in ok], max_blocks,
                                         request.model, request.adapter)
        else:
            # KV events carry no salt: the index cannot tell whether this tenant's salted
            # blocks are cached anywhere, so predict no hit rather than a wrong one.
            blocks = dict.fromkeys((r.id for r in ok), 0)
        weight = self.config.prefill_weight
        rng = self._rng
        keyed = []
        for r in ok:
            overlap = blocks[r.id] * bs
            cost = (p - overlap) * weight + r.queued_tokens
            keyed.append((cost, rng.random(), overlap, r.id))
        keyed.sort()
        best_overlap = keyed[0][2]
        scores = tuple(ReplicaScore(rid, cost, overlap) for cost, _, overlap, rid in keyed)
        return Decision(tuple(rid for *_, rid in keyed),
                        "cache_match" if best_overlap > 0 else "balance", best_overlap, scores)

    def observe(self, event: RouteEvent) -> None:
        if isinstance(event, ReplicaReset):
            self.kv_index.reset(event.replica)
        elif isinstance(event, ReplicaRemoved):
            self.kv_index.remove_replica(event.replica)
