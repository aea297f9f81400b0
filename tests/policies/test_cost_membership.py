"""The ``cost`` policy as replicas join, leave, restart and change: what it keeps of a
replica that left, and its invariants over a random sequence of legal calls."""

import random

import pytest

from policies.base import Finished, ReplicaRemoved, ReplicaReset, ReplicaView, Routed, RouteRequest
from policies.cost import Cost, CostConfig


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


def test_a_route_to_a_replica_removed_and_added_back_at_once_is_modelled() -> None:
    policy = Cost()
    fleet = [ReplicaView(f"r{i}", kv_capacity_tokens=50_000) for i in range(3)]
    req = _request(3)
    policy.choose(req, fleet)
    policy.observe(Routed(req, "r2", fleet))
    policy.observe(ReplicaRemoved("r2"))
    back = _request(4, at=0.1)  # within the views' refresh interval: they were not read
    assert "r2" in policy.choose(back, fleet).ranked
    policy.observe(Routed(back, "r2", fleet))
    model = policy._models.get("r2")
    assert model is not None and model.capacity == 50_000
    policy.check_integrity()


def _views(fleet: dict[str, dict[str, object]]) -> list[ReplicaView]:
    return [ReplicaView(rid, **state) for rid, state in fleet.items()]  # type: ignore[arg-type]


@pytest.mark.parametrize("seed", range(3))
def test_invariants_hold_as_replicas_join_leave_restart_and_change(seed: int) -> None:
    rng = random.Random(seed)
    policy = Cost(CostConfig(sketch_width=512, hot_min_count=2))  # a window of 64 routes
    fleet: dict[str, dict[str, object]] = {}
    gone: list[str] = []
    joined = 0

    def join() -> None:
        nonlocal joined
        fleet[f"r{joined}"] = {"weight": rng.choice([0.5, 1.0, 2.0]),
                               "kv_capacity_tokens": rng.choice([None, 3000, 20_000])}
        joined += 1

    for _ in range(4):
        join()
    docs = [rng.choice([0, 1, 300, 1200, 3000]) for _ in range(30)]
    at = 0.0
    for step in range(500):
        at += rng.random() * 0.2
        op = rng.random()
        rid = rng.choice(sorted(fleet))
        if op < 0.03:
            join()
        elif op < 0.06 and len(fleet) > 1:
            del fleet[rid]
            gone.append(rid)
            policy.observe(ReplicaRemoved(rid))
        elif op < 0.08:
            fleet[rid]["epoch"] = int(fleet[rid].get("epoch", 0)) + 1  # type: ignore[call-overload]
            policy.observe(ReplicaReset(rid))
        elif op < 0.10:
            fleet[rid]["kv_capacity_tokens"] = rng.choice([None, 1, 3000, 20_000])
        elif op < 0.12:
            fleet[rid]["healthy"] = not fleet[rid].get("healthy", True)
        elif op < 0.15:
            fleet[rid].update(running=rng.randrange(8), waiting=rng.randrange(3),
                              queued_tokens=rng.randrange(10_000))
        else:
            views = _views(fleet)
            ok = {v.id for v in views if v.healthy}
            if not ok:
                continue
            doc = min(int(rng.paretovariate(1.0)), len(docs)) - 1
            req = _request(doc, at, docs[doc])
            d = policy.choose(req, views)
            assert d.chosen in ok and sorted(d.ranked) == sorted(ok), (step, d)
            assert all(s.score == s.score for s in d.scores), (step, d)  # no NaN
            policy.observe(Routed(req, d.chosen, views))
            if gone and rng.random() < 0.05:  # a late route to a replica that left
                policy.observe(Routed(req, rng.choice(gone)))
            policy.observe(Finished(req, d.chosen, True, rng.choice([None, 0, req.prompt_tokens]),
                                    rng.choice([None, 0.0, 0.2]), rng.choice([None, 0.0, 1.0])))
        policy.check_integrity()
        state = policy.describe()
        for name in ("model_tokens", "slots", "placed_hot_tokens"):
            left = set(state[name]) - set(fleet)  # type: ignore[call-overload]
            assert not left, (step, name, left)
