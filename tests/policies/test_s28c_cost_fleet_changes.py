"""The ``cost`` policy as a replica leaves a model's views without leaving the fleet (it
now serves another model)."""

import random

from policies.base import ReplicaView, Routed, RouteRequest
from policies.cost import Cost


def _request(doc: int, at: float, tokens: int = 800) -> RouteRequest:
    rng = random.Random(doc)
    ids = [rng.randrange(50_000) for _ in range(tokens)]
    return RouteRequest(tokens=ids, prompt_tokens=tokens, model="m", arrival_s=at)


def _route(policy: Cost, req: RouteRequest, fleet: list[ReplicaView]) -> str:
    chosen = policy.choose(req, fleet).chosen
    policy.observe(Routed(req, chosen, fleet))
    return chosen


def test_a_replica_that_stopped_serving_the_model_is_forgotten() -> None:
    # its id stays in the fleet (no ReplicaRemoved): remembered, it made every later
    # decision look like a tenant partition's, and no hot prefix was placed again
    policy = Cost()
    fleet = [ReplicaView(f"r{i}", kv_capacity_tokens=100_000) for i in range(4)]
    at = 0.0
    for k in range(40):
        at += 0.1
        _route(policy, _request(k % 4, at), fleet)
    assert "r3" in policy.describe()["slots"]  # type: ignore[operator]
    fleet = fleet[:3]  # r3 serves another model now
    for k in range(1200):
        at += 1.0
        _route(policy, _request(100 + k % 4, at), fleet)
    assert "r3" not in policy.describe()["slots"]  # type: ignore[operator]
    assert "r3" not in policy.describe()["placed_hot_tokens"]  # type: ignore[operator]
    homes = {policy._placement.home_of(policy._prepare(_request(100 + j, at)).key)
             for j in range(4)}
    assert None not in homes and homes <= {"r0", "r1", "r2"}, homes
    policy.check_integrity()
