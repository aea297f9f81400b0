"""radix's list of removed replicas is checked against a decision's views only when either
changed: a decision over the same replicas as the last one, with no removal since, walks
nothing; what a route to a removed replica does stays as before."""

from __future__ import annotations

import random

from policies.base import Finished, ReplicaRemoved, ReplicaView, Routed, RouteRequest
from policies.per_model import PerModel
from policies.radix import Radix
from policies.recent_ids import RecentIds


class CountingIds(RecentIds):
    """``RecentIds`` that counts the ids it is asked to discard."""

    __slots__ = ("discards",)

    def __init__(self) -> None:
        super().__init__()
        self.discards = 0

    def discard(self, replica: str) -> None:
        self.discards += 1
        super().discard(replica)


def views(ids: list[str]) -> list[ReplicaView]:
    return [ReplicaView(rid, kv_capacity_tokens=100_000) for rid in ids]


def request(seed: int, model: str = "m") -> RouteRequest:
    rng = random.Random(seed)
    tokens = [rng.randrange(50_000) for _ in range(600)]
    return RouteRequest(tokens=tokens, prompt_tokens=len(tokens), model=model)


def route(policy: Radix | PerModel, req: RouteRequest, fleet: list[ReplicaView],
          to: str | None = None) -> str:
    chosen = to or policy.choose(req, fleet).chosen
    policy.observe(Routed(req, chosen, fleet))
    policy.observe(Finished(req, chosen, ok=True))
    return chosen


def test_decisions_over_an_unchanged_fleet_check_the_removed_list_once() -> None:
    policy = Radix()
    removed = policy._removed = CountingIds()
    fleet = views([f"r{i}" for i in range(8)])
    for k in range(5):
        route(policy, request(k), fleet)
    policy.observe(ReplicaRemoved("r7"))
    rest = fleet[:7]
    for k in range(40):
        route(policy, request(100 + k), rest)
    assert removed.discards == 7  # one pass over the views, not one per decision
    # a route told to the removed replica is not entered; back in a decision's views, it is
    route(policy, request(500), rest, to="r7")
    assert "r7" not in policy.tree.tokens
    for k in range(3):
        route(policy, request(600 + k), fleet)
    assert removed.discards == 7 + 8  # the views changed: checked once more
    route(policy, request(700), fleet, to="r7")
    assert policy.tree.tokens["r7"] > 0
    # removed again while a decision's views still hold it (taken before the removal):
    # those views bring it back, as before
    policy.observe(ReplicaRemoved("r7"))
    assert "r7" in removed
    policy.choose(request(800), fleet)
    assert "r7" not in removed
    policy.check_integrity()


def test_no_decision_leaves_a_replica_of_its_views_in_the_removed_list() -> None:
    # tenants' partitions of one size, replicas leaving and coming back, two models'
    # instances sharing one list: whatever a decision's views hold is not listed after it
    rng = random.Random(3)
    ids = [f"r{i}" for i in range(8)]
    parts = [ids[:4], ids[4:], ids[2:6]]
    for policy in (Radix(), PerModel(Radix(), Radix)):
        for k in range(400):
            what = rng.random()
            if what < 0.1:
                policy.observe(ReplicaRemoved(rng.choice(ids)))
                continue
            fleet = views(rng.choice(parts))
            req = request(k, model=rng.choice(("m1", "m2")))
            chosen = policy.choose(req, fleet).chosen
            instance = policy.policy_for(req.model) if isinstance(policy, PerModel) \
                else policy
            assert isinstance(instance, Radix)
            assert not [r.id for r in fleet if r.id in instance._removed]
            # sent there, or a late route (another worker's), maybe to a removed replica
            route(policy, req, fleet, rng.choice(ids) if what < 0.2 else chosen)
            instance.check_integrity()
