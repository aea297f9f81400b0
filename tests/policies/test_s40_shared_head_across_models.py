"""A system prompt that the models of one policy state share (a base model's adapters,
or tenants' cache salts) is learned as the common prefix, so each request's key covers
its document after it: the prompts' chain keys are rooted at each (model, salt), and
counted so no one adapter's share reached the learner's."""

from __future__ import annotations

import random

from policies.base import ReplicaView, Routed, RouteRequest
from policies.cost import Cost, CostConfig

HEAD = [random.Random(7).randrange(50_000) for _ in range(512)]  # the shared system prompt


def _document(seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(50_000) for _ in range(800)]


def _fleet() -> list[ReplicaView]:
    return [ReplicaView(f"r{i}", kv_capacity_tokens=20_000) for i in range(8)]


def _route(policy: Cost, model: str, tokens: list[int], at: float) -> None:
    request = RouteRequest(tokens=tokens, prompt_tokens=len(tokens), model=model,
                           arrival_s=at)
    policy.observe(Routed(request, policy.choose(request, _fleet()).chosen))


def test_a_head_shared_by_adapters_is_learned_and_documents_keyed_past_it() -> None:
    policy = Cost(CostConfig())
    adapters = [f"base-lora-{i}" for i in range(5)]  # none with half the requests
    for i in range(600):
        _route(policy, adapters[i % 5], HEAD + _document(i % 40), at=0.1 * i)
    assert policy.describe()["common_prefix_chunks"] > 0
    # two documents of one adapter: keys of their own, not the head's one key
    keys = {policy._prepare(RouteRequest(tokens=HEAD + _document(d), prompt_tokens=1312,
                                         model=adapters[0], arrival_s=61.0)).key
            for d in (1, 2)}
    assert len(keys) == 2


def test_one_model_alone_still_learns_it() -> None:
    policy = Cost(CostConfig())
    for i in range(600):
        _route(policy, "base", HEAD + _document(i % 40), at=0.1 * i)
    assert policy.describe()["common_prefix_chunks"] > 0
