"""cost and a scraped KV capacity of no sense (10^18 tokens, infinite): a replica's cache
model is sized within a fixed maximum, so it evicts and the gateway's memory stays bounded
whatever the gauge says."""

import math
import random

import pytest

from policies.base import ReplicaView, Routed, RouteRequest
from policies.cost import Cost, CostConfig

_CHUNK_TOKENS = 65_536.0  # each piece stands for this many tokens: few pieces, many tokens


def _request(seed: int, at: float) -> RouteRequest:
    rng = random.Random(seed)
    chunks = [rng.randrange(1 << 32) for _ in range(64)]
    return RouteRequest((), int(len(chunks) * _CHUNK_TOKENS), model="m", arrival_s=at,
                        chunks=chunks, chunk_tokens=_CHUNK_TOKENS)


def test_a_huge_capacity_gauge_gives_a_model_that_still_evicts() -> None:
    policy = Cost(CostConfig(kv_events=False))
    fleet = [ReplicaView("r0", kv_capacity_tokens=10**18)]
    routed = 0
    for k in range(40):  # distinct prompts of 4M tokens each: 160M tokens in all
        request = _request(k, at=k * 0.5)
        policy.choose(request, fleet)
        policy.observe(Routed(request, "r0", fleet))
        routed += request.prompt_tokens
    model = policy._models.get("r0")
    assert model is not None
    # bounded by a maximum far below what was routed (1 << 25 tokens at this writing)
    assert model.capacity < 64_000_000 and model.used <= model.capacity < routed // 2
    assert len(model) < 40 * 8 // 2  # entries of the oldest prompts were evicted
    assert policy.describe()["model_capacity"] == {"r0": model.capacity}
    policy.check_integrity()
    # the newest prompt is still held whole
    assert policy.choose(_request(39, at=21.0), fleet).reason == "cache_match"


@pytest.mark.parametrize("capacity", [math.inf, math.nan, -5])
def test_a_capacity_of_no_number_is_unknown(capacity: float) -> None:
    policy = Cost(CostConfig(kv_events=False))
    fleet = [ReplicaView("r0", kv_capacity_tokens=capacity)]  # type: ignore[arg-type]
    request = _request(1, at=0.0)
    policy.choose(request, fleet)
    policy.observe(Routed(request, "r0", fleet))
    model = policy._models.get("r0")
    assert model is not None and model.capacity == CostConfig().default_capacity_tokens
    policy.check_integrity()
