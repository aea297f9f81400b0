"""Where a replica's usage tells no cached tokens (vLLM without
``--enable-prompt-tokens-details``: 0 cached, whatever it held), ``cost`` learns its pace
from what its cache model predicted the replica prefilled when it routed the request there:
a cache hit does not read as a fast prefill."""

from __future__ import annotations

import random

import pytest

from policies.base import Finished, ReplicaView, Routed, RouteRequest
from policies.cost import Cost

TRUE_S = 1e-4  # seconds per prefilled token
DOCS = 40


def _tokens(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(50_000) for _ in range(n)]


def _views() -> list[ReplicaView]:
    return [ReplicaView(f"r{i}", kv_capacity_tokens=500_000) for i in range(2)]


def _answered(policy: Cost, tokens: list[int], at: float, prefilled: int, routed: bool,
              told: bool) -> None:
    """``tokens`` answered by r0, its first token after ``prefilled`` tokens' prefill;
    routed by the policy first (``routed``), or only told finished."""
    req = RouteRequest(tokens=tokens, prompt_tokens=len(tokens), model="m", arrival_s=at)
    if routed:
        policy.choose(req, _views())
        policy.observe(Routed(req, "r0"))
    cached = len(tokens) - prefilled if told else 0
    policy.observe(Finished(req, "r0", ok=True, cached_tokens=cached,
                            ttft_s=max(prefilled, 1) * TRUE_S, duration_s=0.5,
                            cached_told=told))


def _pace_after_docs_and_repeats(routed: bool, told: bool) -> float:
    """The learned seconds per token after DOCS one-off 1,000-token documents, then each
    asked about 5 times more (the document cached: 16 new tokens prefilled)."""
    policy = Cost()
    docs = [_tokens(seed, 1000) for seed in range(DOCS)]
    at = 0.0
    for doc in docs:
        at += 0.1
        _answered(policy, doc, at, 1000, routed, told)
    for round_ in range(5):
        for i, doc in enumerate(docs):
            at += 0.1
            _answered(policy, doc + _tokens(10_000 + 100 * i + round_, 16), at, 16, routed,
                      told)
    value = policy.describe()["prefill_s_per_token"]
    assert isinstance(value, float)
    return value


@pytest.mark.parametrize("told", [True, False])
def test_the_pace_is_the_true_one_whether_or_not_cached_tokens_are_told(told: bool) -> None:
    assert _pace_after_docs_and_repeats(routed=True, told=told) == pytest.approx(TRUE_S)


def test_untold_answers_of_requests_it_did_not_route_teach_nothing() -> None:
    # (nothing predicted: the prompt counted whole would read the hits as fast prefills)
    assert _pace_after_docs_and_repeats(routed=False, told=False) \
        == Cost().describe()["prefill_s_per_token"]
