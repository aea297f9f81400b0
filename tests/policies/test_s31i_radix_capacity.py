"""radix and a scraped KV capacity that tells nothing (under 1 token, NaN, infinite): the
replica's budget is the default capacity's, as ``cost`` takes such a gauge as unknown."""

import math
import random

import pytest

from policies.base import ReplicaView, Routed, RouteRequest
from policies.radix import Radix, RadixConfig


def _request(seed: int) -> RouteRequest:
    rng = random.Random(seed)
    tokens = [rng.randrange(50_000) for _ in range(800)]
    return RouteRequest(tokens, len(tokens))


@pytest.mark.parametrize("capacity", [-1000, 0, math.nan, math.inf, -math.inf])
def test_a_capacity_that_tells_nothing_is_taken_as_unknown(capacity: float) -> None:
    policy = Radix()
    fleet = [ReplicaView("r0", kv_capacity_tokens=capacity),  # type: ignore[arg-type]
             ReplicaView("r1", kv_capacity_tokens=capacity)]  # type: ignore[arg-type]
    request = _request(1)
    policy.observe(Routed(request, "r1", fleet))
    default = int(RadixConfig().default_capacity_tokens * RadixConfig().capacity_fraction)
    assert policy.budget("r1") == default
    assert policy.tree.tokens["r1"] == 800
    decision = policy.choose(request, fleet)
    assert decision.chosen == "r1" and decision.reason == "cache_match"
    assert decision.matched_tokens == 800
    policy.check_integrity()


def test_a_capacity_that_turns_unknown_keeps_what_fits_the_default() -> None:
    policy = Radix()
    request = _request(2)
    policy.observe(Routed(request, "r1", [ReplicaView("r1", kv_capacity_tokens=50_000)]))
    policy.observe(Routed(_request(3), "r1", [ReplicaView("r1", kv_capacity_tokens=-5)]))
    assert policy.tree.tokens["r1"] == 1600
    assert policy.choose(request, [ReplicaView("r0"), ReplicaView("r1")]).matched_tokens == 800
    policy.check_integrity()
