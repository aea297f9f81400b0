"""radix and a route told after its replica left: another worker's route (told as it
stands, with no snapshot) names a replica this worker's fleet removed a moment before."""

import random

from policies.base import ReplicaRemoved, ReplicaView, Routed, RouteRequest
from policies.per_model import PerModel
from policies.radix import Radix


def _request(seed: int, model: str | None = None) -> RouteRequest:
    rng = random.Random(seed)
    tokens = [rng.randrange(50_000) for _ in range(800)]
    return RouteRequest(tokens, len(tokens), model=model)


def test_a_late_route_to_a_removed_replica_leaves_nothing_of_it() -> None:
    policy = Radix()
    fleet = [ReplicaView("r0"), ReplicaView("r1")]
    first = _request(1)
    policy.observe(Routed(first, "r1", fleet))
    policy.observe(ReplicaRemoved("r1"))
    late = _request(2)
    policy.observe(Routed(late, "r1", revocable=False))  # another worker's, told late
    policy.check_integrity()
    assert "r1" not in policy.tree.tokens and "r1" not in policy._seen
    # added back under its id (an empty cache): nothing the late route named is held there
    decision = policy.choose(late, fleet)
    assert decision.reason == "balance" and decision.matched_tokens == 0
    # routed to from this process (its snapshot holds it), it is modelled again
    policy.observe(Routed(late, "r1", fleet))
    assert policy.tree.tokens["r1"] == 800
    assert policy.choose(late, fleet).matched_tokens == 800


def test_an_instance_made_after_the_removal_keeps_nothing_of_it_either() -> None:
    policy = PerModel(Radix(), Radix)
    fleet = [ReplicaView("r0"), ReplicaView("r1")]
    policy.observe(Routed(_request(1, "a"), "r1", fleet))
    policy.observe(ReplicaRemoved("r1"))
    # a model first seen after the removal: its instance shares the tree
    policy.observe(Routed(_request(2, "b"), "r1", revocable=False))
    tree = policy.policy_for("b").tree  # type: ignore[attr-defined]
    assert tree is policy.first.tree  # type: ignore[attr-defined]
    assert "r1" not in tree.tokens


def test_churn_of_replicas_with_late_routes_keeps_no_state_of_those_gone() -> None:
    policy = Radix()
    for k in range(200):
        fleet = [ReplicaView("stay"), ReplicaView(f"pod-{k}")]
        request = _request(k)
        policy.observe(Routed(request, f"pod-{k}", fleet))
        policy.observe(ReplicaRemoved(f"pod-{k}"))
        policy.observe(Routed(_request(10_000 + k), f"pod-{k}", revocable=False))
    policy.check_integrity()
    assert set(policy.tree.tokens) <= {"stay"}
    assert policy.tree.nodes == 0


def test_a_send_after_the_removal_on_a_decision_made_before_it_keeps_nothing() -> None:
    policy = Radix()
    fleet = [ReplicaView("r0"), ReplicaView("r1")]
    request = _request(3)
    assert policy.choose(request, fleet).ranked  # decided while r1 was in the fleet
    policy.observe(ReplicaRemoved("r1"))
    # the send (or a retry) after the removal carries the decision's snapshot, which holds r1
    policy.observe(Routed(request, "r1", fleet))
    policy.check_integrity()
    assert "r1" not in policy.tree.tokens and "r1" not in policy._seen
    # nor is it back in the fleet for a later route told as it stands
    policy.observe(Routed(_request(4), "r1", revocable=False))
    assert "r1" not in policy.tree.tokens
    # a decision's views hold it again: back under its id, routes to it are kept
    assert policy.choose(request, fleet).matched_tokens == 0
    policy.observe(Routed(request, "r1", fleet))
    assert policy.tree.tokens["r1"] == 800


def test_a_decision_of_another_model_brings_a_removed_replica_back_for_all() -> None:
    policy = PerModel(Radix(), Radix)
    fleet = [ReplicaView("r0"), ReplicaView("r1")]
    policy.observe(Routed(_request(1, "a"), "r1", fleet))
    policy.observe(ReplicaRemoved("r1"))
    policy.choose(_request(2, "b"), fleet)  # model b's decision sees r1 in the fleet again
    policy.observe(Routed(_request(3, "a"), "r1", revocable=False))
    assert policy.first.tree.tokens["r1"] == 800  # type: ignore[attr-defined]
