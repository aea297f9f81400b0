"""``/admin/explain``'s policy state is the state that decides the explained request's
model (``Policy.describe_for``): with one model routed so far, explaining another model's
request shows a state that learned nothing, never the first model's placement."""

from __future__ import annotations

import random

from policies.base import ReplicaView, Routed, RouteRequest
from policies.per_model import PerModel
from policies.registry import build_policy


def _request(model: str, seed: int, at: float) -> RouteRequest:
    rng = random.Random(seed)
    tokens = [rng.randrange(50_000) for _ in range(1020)]
    return RouteRequest(tokens=tokens, prompt_tokens=len(tokens), model=model, arrival_s=at)


def test_explaining_another_model_shows_none_of_the_first_models_state() -> None:
    policy = PerModel(build_policy({"name": "cost"}), lambda: build_policy({"name": "cost"}))
    alpha = [ReplicaView(f"a{i}", kv_capacity_tokens=8000) for i in range(4)]
    for n in range(300):  # a few hot documents, alpha's only
        req = _request("alpha", n % 5, float(n))
        policy.observe(Routed(req, policy.choose(req, alpha).chosen))
    alpha_state = policy.describe_for(_request("alpha", 0, 300.0))
    assert alpha_state["placed_hot_tokens"]  # alpha's placement, on alpha's replicas
    beta_state = policy.describe_for(_request("beta", 0, 300.0))
    assert not beta_state["placed_hot_tokens"], beta_state
    assert "models" not in beta_state  # one instance's state, as for a fleet of one model
    assert policy.describe() == alpha_state  # the whole policy: the one instance kept
    assert len(list(policy._all())) == 1  # explaining kept no instance for beta
