from collections import Counter

import pytest

from policies.base import NoReplicaError, ReplicaView, Routed, RouteRequest
from policies.least_load import LeastLoad, LeastLoadConfig
from policies.round_robin import RoundRobin

REQ = RouteRequest((), 100)


def test_round_robin_rotates_only_when_routed() -> None:
    policy = RoundRobin()
    views = [ReplicaView("a"), ReplicaView("b", healthy=False), ReplicaView("c")]
    assert policy.choose(REQ, views).ranked == ("a", "c")
    assert policy.choose(REQ, views).chosen == "a"  # explain does not advance
    seen = []
    for _ in range(4):
        d = policy.choose(REQ, views)
        seen.append(d.chosen)
        policy.observe(Routed(REQ, d.chosen))
    assert seen == ["a", "c", "a", "c"]


def test_least_load_ranks_by_queue_and_breaks_ties_at_random() -> None:
    policy = LeastLoad(LeastLoadConfig(seed=3))
    views = [ReplicaView(f"r{i}", queued_tokens=q) for i, q in enumerate([50, 0, 0, 0, 9])]
    firsts = Counter()
    for _ in range(300):
        d = policy.choose(REQ, views)
        assert set(d.ranked[:3]) == {"r1", "r2", "r3"} and d.ranked[3:] == ("r4", "r0")
        firsts[d.chosen] += 1
    assert set(firsts) == {"r1", "r2", "r3"} and min(firsts.values()) > 50


def test_least_load_uses_weight_and_health() -> None:
    views = [
        ReplicaView("small", queued_tokens=100, weight=1.0),
        ReplicaView("big", queued_tokens=150, weight=2.0),
        ReplicaView("down", queued_tokens=0, healthy=False),
    ]
    assert LeastLoad().choose(REQ, views).ranked == ("big", "small")


@pytest.mark.parametrize("policy", [RoundRobin(), LeastLoad()])
def test_no_healthy_replica(policy) -> None:
    with pytest.raises(NoReplicaError, match="among 1"):
        policy.choose(REQ, [ReplicaView("a", healthy=False)])


@pytest.mark.parametrize("name", ["least_load", "radix", "kv_events", "prefix_affinity"])
def test_explaining_a_decision_leaves_the_next_one_as_it_was(name: str) -> None:
    from policies.per_model import PerModel
    from policies.registry import build_policy

    fleet = [ReplicaView(f"r{i}") for i in range(4)]  # idle: every choice is a tie
    explained, plain = (PerModel(build_policy({"name": name}),
                                 lambda: build_policy({"name": name})) for _ in range(2))
    for i in range(20):
        request = RouteRequest(tokens=[i] * 40, prompt_tokens=40, model="m")
        for _ in range(3):
            explained.explain(request, fleet)
        assert explained.choose(request, fleet).chosen == plain.choose(request, fleet).chosen
