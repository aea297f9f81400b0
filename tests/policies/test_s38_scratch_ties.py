"""One-off prefixes are spread over the scratch set: between scratch replicas equally
loaded (idle ones, most often) the tie goes by the prefix's key, not always to the set's
first member, so one-offs do not stack on one replica, and gateway copies, each blind to
the others' sends between scrapes, do not stack them there together."""

from __future__ import annotations

import random
from collections import Counter

from policies.base import ReplicaView, RouteRequest
from policies.cost import Cost, CostConfig


def one_off(seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(50_000) for _ in range(800)]


def test_idle_scratch_replicas_share_one_off_prefixes() -> None:
    # fill_homes off: a one-off goes to the scratch set even while caches have room
    policy = Cost(CostConfig(min_scratch=2, fill_homes=False))
    views = [ReplicaView(f"r{i}", kv_capacity_tokens=40_000) for i in range(8)]
    scratch = policy.scratch_set(views)
    assert len(scratch) == 2
    chosen: Counter[str] = Counter()
    for i in range(60):  # idle views: every decision sees the same, equal loads
        tokens = one_off(i)
        req = RouteRequest(tokens=tokens, prompt_tokens=len(tokens), model="m",
                           arrival_s=float(i))
        decision = policy.choose(req, views)
        assert decision.reason == "scratch"
        chosen[decision.chosen] += 1
    assert set(chosen) == set(scratch)
    # by key: near half each (60 keys, uniform hash), never all on the set's first member
    assert min(chosen.values()) >= 15, chosen
