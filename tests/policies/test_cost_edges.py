"""The ``cost`` policy on edge inputs: replicas of weight 0, empty and one-token prompts, a
single replica, a replica that stops serving the model, prompts past a replica's capacity."""

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
    """``req`` routed and answered (a request routed again is another request then, not a
    retry of it)."""
    chosen = policy.choose(req, fleet).chosen
    policy.observe(Routed(req, chosen, fleet))
    policy.observe(Finished(req, chosen, ok=True))
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
        policy.observe(Finished(hot, "r0", ok=True))
    key = policy._prepare(hot).key
    assert policy._placement.home_of(key) is None
    placed = len(policy._placement)
    shown = policy.explain(hot, fleet)
    assert policy._placement.home_of(key) is None
    assert len(policy._placement) == placed
    assert policy.choose(hot, fleet).chosen == shown.chosen  # the preview was the home
    assert policy._placement.home_of(key) is not None
    policy.check_integrity()


def test_a_replica_that_stopped_serving_the_model_is_forgotten() -> None:
    # its id stays in the fleet (no ReplicaRemoved): remembered, it made every later
    # decision look like a tenant partition's, and no hot prefix was placed again
    policy = Cost()
    fleet = [ReplicaView(f"r{i}", kv_capacity_tokens=100_000) for i in range(4)]
    at = 0.0
    for k in range(40):
        at += 0.1
        _route(policy, _request(k % 4, at=at), fleet)
    assert "r3" in policy.describe()["slots"]  # type: ignore[operator]
    fleet = fleet[:3]  # r3 serves another model now
    for k in range(1200):
        at += 1.0
        _route(policy, _request(100 + k % 4, at=at), fleet)
    assert "r3" not in policy.describe()["slots"]  # type: ignore[operator]
    assert "r3" not in policy.describe()["placed_hot_tokens"]  # type: ignore[operator]
    homes = {policy._placement.home_of(policy._prepare(_request(100 + j, at=at)).key)
             for j in range(4)}
    assert None not in homes and homes <= {"r0", "r1", "r2"}, homes
    policy.check_integrity()


def _send(policy: Cost, req: RouteRequest, fleet: list[ReplicaView], replica: str) -> None:
    """``req`` decided over ``fleet`` (which tells the policy the capacities), then sent to
    ``replica``."""
    policy.explain(req, fleet)
    policy.observe(Routed(req, replica, fleet))


def _matched(policy: Cost, req: RouteRequest, fleet: list[ReplicaView], replica: str) -> int:
    scores = policy.explain(req, fleet).scores
    return next((s.matched_tokens for s in scores if s.replica == replica), 0)


# A prompt far longer than a replica's known KV capacity, which vLLM and SGLang refuse
# (400: a request must fit the cache whole), neither enters ``cost``'s model of that
# replica nor evicts what it holds: it was entered, and pushed out of the model every
# document the replica still held.
def test_a_prompt_past_the_replicas_capacity_leaves_its_model_as_it_was() -> None:
    policy = Cost()
    fleet = [ReplicaView(f"r{i}", kv_capacity_tokens=10_000) for i in range(2)]
    _send(policy, _request(1, 2_000, 1.0), fleet, "r0")
    held = _matched(policy, _request(1, 2_000, 2.0), fleet, "r0")
    assert held >= 1_900
    _send(policy, _request(2, 50_000, 3.0), fleet, "r0")
    assert _matched(policy, _request(1, 2_000, 4.0), fleet, "r0") == held
    policy.check_integrity()


def test_a_prompt_that_fits_the_capacity_still_evicts_what_it_must() -> None:
    policy = Cost()
    fleet = [ReplicaView(f"r{i}", kv_capacity_tokens=10_000) for i in range(2)]
    _send(policy, _request(1, 2_000, 1.0), fleet, "r0")
    _send(policy, _request(2, 9_500, 2.0), fleet, "r0")  # fits: LRU makes room
    assert _matched(policy, _request(1, 2_000, 3.0), fleet, "r0") < 1_000
    assert _matched(policy, _request(2, 9_500, 4.0), fleet, "r0") > 0
