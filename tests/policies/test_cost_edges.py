"""The ``cost`` policy on edge inputs: replicas of weight 0, empty and one-token prompts, a
single replica."""

import math
import random

import pytest

from policies.base import Finished, ReplicaView, Routed, RouteRequest
from policies.cost import Cost


def _request(seed: int, tokens: int = 800, at: float = 0.0) -> RouteRequest:
    rng = random.Random(seed)
    ids = [rng.randrange(50_000) for _ in range(tokens)]
    return RouteRequest(tokens=ids, prompt_tokens=len(ids), model="m", arrival_s=at)


def _route(policy: Cost, req: RouteRequest, fleet: list[ReplicaView]) -> str:
    chosen = policy.choose(req, fleet).chosen
    policy.observe(Routed(req, chosen, fleet))
    return chosen


def test_a_fleet_of_weight_zero_holding_the_prompt_is_ranked_not_divided_by() -> None:
    policy = Cost()
    fleet = [ReplicaView("r0", weight=0.0), ReplicaView("r1", weight=0.0)]
    req = _request(1)
    policy.observe(Routed(req, "r0"))
    d = policy.choose(req, fleet)  # divided by the heaviest weight, 0
    assert sorted(d.ranked) == ["r0", "r1"]


def test_a_hot_prefix_is_not_homed_on_a_replica_of_weight_zero() -> None:
    # off the ring, it was still a home to place on: placing found no ring replica
    policy = Cost()
    fleet = [ReplicaView("r0", kv_capacity_tokens=500), ReplicaView("r1", weight=0.0)]
    req = _request(2)
    for _ in range(4):
        assert _route(policy, req, fleet) == "r0"
    policy.check_integrity()
    # a placed home whose weight fell to 0 is left: it was the only candidate
    policy = Cost()
    fleet = [ReplicaView(f"r{i}", kv_capacity_tokens=100_000) for i in range(4)]
    for seed in range(100, 140):  # one-off prompts: the hot one's share needs one home
        _route(policy, _request(seed), fleet)
    for _ in range(4):
        home = _route(policy, req, fleet)
    assert policy._placement.home_of(policy._prepare(req).key) == home
    weightless = [v._replace(weight=0.0) if v.id == home else v for v in fleet]
    assert policy.choose(req, weightless).chosen != home
    policy.check_integrity()


@pytest.mark.parametrize("n", [1, 2, 64])
@pytest.mark.parametrize("tokens", [0, 1, 2, 300])
def test_short_prompts_and_fleets_of_any_size_are_routed(n: int, tokens: int) -> None:
    policy = Cost()
    fleet = [ReplicaView(f"r{i}") for i in range(n)]
    for k in range(4):
        req = _request(3, tokens, at=float(k))
        chosen = _route(policy, req, fleet)
        policy.observe(Finished(req, chosen, True, 0, 0.0, 0.0))
        assert policy.explain(req, fleet).chosen in {v.id for v in fleet}
    policy.check_integrity()


def test_gauges_that_are_no_numbers_are_taken_as_unknown() -> None:
    # a foreign server's metrics: a negative capacity failed every route there, an
    # infinite prefill rate every decision, and a NaN one stopped its model's aging
    policy = Cost()
    bad = [ReplicaView("r0", kv_capacity_tokens=-5000, prefill_tokens_per_s=math.inf),
           ReplicaView("r1", kv_capacity_tokens=0, prefill_tokens_per_s=math.nan)]
    for k in range(4):
        chosen = _route(policy, _request(k, at=k * 0.5), bad)
        policy.observe(Finished(_request(k), chosen, True, 0, 0.1, 0.5))
    capacity = policy.describe()["model_capacity"]
    assert set(capacity.values()) == {200_000}  # type: ignore[attr-defined]  # the default
    policy.check_integrity()
    good = [v._replace(prefill_tokens_per_s=100_000.0) for v in bad]
    used = {rid: model.used for rid, model in policy._models.models()}
    for k in range(4, 8):  # others' prefill ages each model again
        policy.choose(_request(k, at=k * 0.5), good)
    assert all(model.used > used.get(rid, 0) for rid, model in policy._models.models())


def test_explaining_a_hot_key_without_a_home_places_nothing() -> None:
    # /admin/explain for a key turned hot but not routed since: it joined the placed set
    # (every other key placed again) for a request never sent, and stayed until it cooled
    policy = Cost()
    fleet = [ReplicaView(f"r{i}", kv_capacity_tokens=100_000) for i in range(4)]
    for seed in range(100, 140):
        _route(policy, _request(seed), fleet)
    hot = _request(7)
    for _ in range(3):  # counted hot by the third; no decision for it since
        policy.observe(Routed(hot, "r0", fleet))
    key = policy._prepare(hot).key
    assert policy._placement.home_of(key) is None
    placed = len(policy._placement)
    shown = policy.explain(hot, fleet)
    assert policy._placement.home_of(key) is None
    assert len(policy._placement) == placed
    assert policy.choose(hot, fleet).chosen == shown.chosen  # the preview was the home
    assert policy._placement.home_of(key) is not None
    policy.check_integrity()
