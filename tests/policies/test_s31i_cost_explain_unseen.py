"""cost's ``/admin/explain`` when it is the call that finds a replica unseen past the
timeout (it stopped serving the model): the policy's state stays whole, as a decision
would leave it, not forgotten in the explanation's copy of the placement alone."""

import random

from policies.base import ReplicaView, Routed, RouteRequest
from policies.cost import Cost


def _request(seed: int, at: float) -> RouteRequest:
    rng = random.Random(seed)
    ids = [rng.randrange(50_000) for _ in range(800)]
    return RouteRequest(tokens=ids, prompt_tokens=len(ids), model="m", arrival_s=at)


def _placed() -> tuple[Cost, list[ReplicaView], str]:
    """A policy with hot documents placed, and a replica holding some of them."""
    policy = Cost()
    fleet = [ReplicaView(f"r{i}") for i in range(4)]
    at = 0.0
    for _ in range(5):
        for doc in range(6):
            at += 0.1
            request = _request(doc, at)
            policy.observe(Routed(request, policy.choose(request, fleet).chosen, fleet))
    homes = [r.id for r in fleet if policy._placement.tokens_on(r.id)]
    assert homes, "no hot document was placed"
    return policy, fleet, homes[0]


def test_an_explain_that_forgets_a_replica_leaves_the_policy_whole() -> None:
    policy, fleet, home = _placed()
    rest = [r for r in fleet if r.id != home]
    late = _request(0, 610.0)  # more than 600 s after the last decision that saw `home`
    decision = policy.explain(late, rest)
    assert home not in decision.ranked
    policy.check_integrity()
    assert policy._placement.tokens_on(home) == 0
    # the next decision and the next reassignment find nothing of it either
    chosen = policy.choose(late, rest).chosen
    assert chosen != home
    policy.observe(Routed(late, chosen, rest))
    policy.check_integrity()


def test_explain_then_choose_ends_as_choose_alone() -> None:
    explained, fleet, home = _placed()
    chose, _, _ = _placed()
    rest = [r for r in fleet if r.id != home]
    late = _request(1, 610.0)
    explained.explain(late, rest)
    assert explained.choose(late, rest) == chose.choose(late, rest)
    for r in fleet:
        assert explained._placement.tokens_on(r.id) == chose._placement.tokens_on(r.id)
