"""The ``cost`` policy's decisions do not depend on the order the fleet's replicas come in:
gateway copies whose discovery lists them in another order send a prompt to one replica."""

import random

from policies.base import ReplicaView, Routed, RouteRequest
from policies.cost import Cost


def _request(seed: int) -> RouteRequest:
    rng = random.Random(seed)
    tokens = [rng.randrange(50_000) for _ in range(1200)]
    return RouteRequest(tokens=tokens, prompt_tokens=len(tokens), model="m", arrival_s=0.0)


def test_replicas_holding_a_prompt_alike_are_told_apart_whatever_the_fleets_order() -> None:
    ids = [f"r{i}" for i in range(6)]
    for seed in range(12):
        req = _request(seed)
        chosen = set()
        for order in (ids, ids[::-1], ids[3:] + ids[:3]):
            policy = Cost()
            fleet = [ReplicaView(rid, kv_capacity_tokens=100_000) for rid in order]
            for holder in ("r1", "r4"):  # both hold the prompt (a rare one: seen twice)
                policy.observe(Routed(req, holder, fleet))
            d = policy.choose(req, fleet)
            assert d.reason == "cache_match"
            chosen.add(d.chosen)
        assert len(chosen) == 1, (seed, chosen)
