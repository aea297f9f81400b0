"""The ``cost`` policy as replicas join, leave, restart and change: what it keeps of a
replica that left, and its invariants over a random sequence of legal calls."""

import random

from policies.base import ReplicaRemoved, ReplicaView, Routed, RouteRequest
from policies.cost import Cost


def _request(seed: int, at: float = 0.0, tokens: int = 800) -> RouteRequest:
    rng = random.Random(seed)
    ids = [rng.randrange(50_000) for _ in range(tokens)]
    return RouteRequest(tokens=ids, prompt_tokens=len(ids), model="m", arrival_s=at)


def test_a_route_told_after_its_replica_left_leaves_nothing_of_it() -> None:
    policy = Cost()
    fleet = [ReplicaView(f"r{i}") for i in range(3)]
    req = _request(1)
    policy.observe(Routed(req, policy.choose(req, fleet).chosen, fleet))
    policy.observe(ReplicaRemoved("r2"))
    # a retry ranked before the removal, or another worker's route, names it after
    late = _request(2, at=1.0)
    policy.choose(late, fleet[:2])
    policy.observe(Routed(late, "r2"))
    assert policy._models.get("r2") is None
    assert "r2" not in policy.describe()["model_tokens"]  # type: ignore[operator]
    # back in the fleet, it is modelled again
    policy.choose(late, fleet)
    policy.observe(Routed(late, "r2"))
    assert policy._models.get("r2") is not None
