"""A prompt far longer than a replica's known KV capacity, which vLLM and SGLang refuse
(400: a request must fit the cache whole), neither enters ``cost``'s model of that
replica nor evicts what it holds: it was entered, and pushed out of the model every
document the replica still held."""

import random

from policies.base import ReplicaView, Routed, RouteRequest
from policies.cost import Cost


def _request(doc: int, at: float, tokens: int) -> RouteRequest:
    rng = random.Random(doc)
    ids = [rng.randrange(50_000) for _ in range(tokens)]
    return RouteRequest(tokens=ids, prompt_tokens=tokens, model="m", arrival_s=at)


def _send(policy: Cost, req: RouteRequest, fleet: list[ReplicaView], replica: str) -> None:
    """``req`` decided over ``fleet`` (which tells the policy the capacities), then sent to
    ``replica``."""
    policy.explain(req, fleet)
    policy.observe(Routed(req, replica, fleet))


def _matched(policy: Cost, req: RouteRequest, fleet: list[ReplicaView], replica: str) -> int:
    scores = policy.explain(req, fleet).scores
    return next((s.matched_tokens for s in scores if s.replica == replica), 0)


def test_a_prompt_past_the_replicas_capacity_leaves_its_model_as_it_was() -> None:
    policy = Cost()
    fleet = [ReplicaView(f"r{i}", kv_capacity_tokens=10_000) for i in range(2)]
    _send(policy, _request(1, 1.0, 2_000), fleet, "r0")
    held = _matched(policy, _request(1, 2.0, 2_000), fleet, "r0")
    assert held >= 1_900
    _send(policy, _request(2, 3.0, 50_000), fleet, "r0")
    assert _matched(policy, _request(1, 4.0, 2_000), fleet, "r0") == held
    policy.check_integrity()


def test_a_prompt_that_fits_the_capacity_still_evicts_what_it_must() -> None:
    policy = Cost()
    fleet = [ReplicaView(f"r{i}", kv_capacity_tokens=10_000) for i in range(2)]
    _send(policy, _request(1, 1.0, 2_000), fleet, "r0")
    _send(policy, _request(2, 2.0, 9_500), fleet, "r0")  # fits: LRU makes room
    assert _matched(policy, _request(1, 3.0, 2_000), fleet, "r0") < 1_000
    assert _matched(policy, _request(2, 4.0, 9_500), fleet, "r0") > 0
