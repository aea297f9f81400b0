"""One of several gateway copies sees its share of a prefix's requests: its count of the
prefix is scaled to the fleet's (the replicas' prefill counters over what this copy
routed) before it is judged hot, so copies learn a document hot about as soon as one
gateway that sees every request would."""

from __future__ import annotations

import random

from policies.base import ReplicaView, Routed, RouteRequest
from policies.cost import Cost, CostConfig

DOC = 1000


def doc(seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(50_000) for _ in range(DOC + 20)]


def fleet(prefill_per_replica: float) -> list[ReplicaView]:
    return [ReplicaView(f"r{i}", kv_capacity_tokens=4000,
                        prefill_tokens_per_s=prefill_per_replica) for i in range(8)]


def route(policy: Cost, tokens: list[int], views: list[ReplicaView], at: float) -> str:
    req = RouteRequest(tokens=tokens, prompt_tokens=len(tokens), model="m", arrival_s=at)
    decision = policy.choose(req, views)
    policy.observe(Routed(req, decision.chosen))
    return decision.reason


def placed_after_three_requests(prefill_per_replica: float) -> int:
    """The hot prefixes placed on homes by a copy whose replicas prefill
    ``prefill_per_replica`` tokens/s (8 replicas), after one-off traffic of ~10k uncached
    tokens/s and a document's first three requests."""
    policy = Cost(CostConfig(min_scratch=1))
    views = fleet(prefill_per_replica)
    at = 0.0
    for i in range(400):  # one-off documents: the sketch halves, the rates settle
        route(policy, doc(20_000 + i), views, at)
        at += 0.1
    for k in range(3):  # the third is judged on the two before it
        route(policy, doc(7), views, at + k * 0.1)
    placed = policy.describe()["placed_hot_keys"]
    assert isinstance(placed, int)
    return placed


def test_a_copy_with_half_the_traffic_judges_a_document_it_saw_twice_hot() -> None:
    # alone (the replicas prefill what this copy sends): a document seen three times is
    # hot, twice is not; none of the one-off documents is
    assert placed_after_three_requests(1300.0) == 0
    # the replicas prefill twice what this copy sends: another copy saw about as many of
    # the document's requests, so it is hot and placed on a home
    assert placed_after_three_requests(2600.0) == 1
