"""``PerModel`` past ``max_models`` when the least recent instance is the one of requests
that name no model (or a model no replica lists)."""

import random

from policies.base import ReplicaView, Routed, RouteRequest
from policies.per_model import PerModel
from policies.registry import build_policy


def _fleet(prefix: str) -> list[ReplicaView]:
    return [ReplicaView(f"{prefix}{i}", kv_capacity_tokens=8000) for i in range(3)]


def _route(policy: PerModel, model: str | None, fleet: list[ReplicaView], seed: int) -> str:
    rng = random.Random(seed)
    tokens = [rng.randrange(50_000) for _ in range(600)]
    req = RouteRequest(tokens=tokens, prompt_tokens=len(tokens), model=model, arrival_s=0.0)
    explained = policy.explain(req, fleet)
    decision = policy.choose(req, fleet)
    assert decision.ranked == explained.ranked
    policy.observe(Routed(req, decision.chosen, fleet))
    return decision.chosen


def test_a_new_model_takes_the_place_of_the_unnamed_models_instance() -> None:
    # the instance of requests naming no model was kept under the name None, which read as
    # "no instance to give up": every later model was decided by the first model's state
    models = {"a", "b"}
    policy = PerModel(build_policy({"name": "cost"}), lambda: build_policy({"name": "cost"}),
                      max_models=2, listed=models.__contains__)
    _route(policy, "a", _fleet("a"), 1)
    _route(policy, None, _fleet("a") + _fleet("b"), 2)  # least recent now, but not first
    _route(policy, "b", _fleet("b"), 3)
    assert set(policy._by_model) == {"a", "b"}
    assert policy.policy_for("b") is not policy.first
    # the first model's state never saw the other model's replicas
    assert set(policy.first.describe()["slots"]) == {"a0", "a1", "a2"}  # type: ignore[call-overload]
