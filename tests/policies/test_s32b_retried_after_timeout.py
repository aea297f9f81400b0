"""A request tried again on another replica after a try that may have reached its replica
(it timed out, or broke after being sent: a second ``Routed`` with no ``Unrouted`` between)
counts once in what a policy learns of the traffic, as one refused does; what the first
try made the policy believe of its replica's cache stays."""

from __future__ import annotations

import pytest

from policies.base import Finished, Routed, Unrouted
from policies.cost import Cost
from policies.counted_requests import _COUNTED_KEPT
from policies.prefix_affinity import PrefixAffinity
from tests.support.retried_requests import (
    FLEET,
    asked_of_a_document,
    assert_learned_alike,
    failed_tries,
    request,
    tokens_of,
    warm_failing,
    workload,
)


def traffic(policy: Cost, now: float) -> dict[str, object]:
    """What the policy learned of the traffic (not of each replica's cache or load)."""
    learner = policy._keys.learner
    assert learner is not None
    sketch = policy._sketch
    return {
        "sketch": (bytes(sketch._counts), sketch.total, sketch.halvings, sketch.window),
        "routed": (policy._routed, policy._mean_prompt),
        "requests": pytest.approx(policy._requests.rate(now)),
        "hot_requests": pytest.approx(policy._hot_requests.rate(now)),
        "judged": policy._scratch._judged,
        "learner": (dict(learner._counts), len(learner._recent)),
    }


def test_cost_counts_a_request_retried_after_timeouts_once() -> None:
    once, retried = Cost(), Cost()
    for policy in (once, retried):  # each failing replica has a model in both
        warm_failing(policy)
    reqs = workload(700, seed=11, first_question=20_000)
    for i, req in enumerate(reqs):
        chosen = once.choose(req, FLEET).chosen
        retried.choose(req, FLEET)
        once.observe(Routed(req, chosen, FLEET))
        for rid in failed_tries(i):  # sent, and no answer in time: no Unrouted
            retried.observe(Routed(req, rid, FLEET))
        retried.observe(Routed(req, chosen, FLEET))
        for policy in (once, retried):
            policy.observe(Finished(req, chosen, ok=True))
    retried.check_integrity()
    assert retried._sketch.halvings > 0 and retried._scratch._judged > 0  # all exercised
    now = reqs[-1].arrival_s
    assert now is not None
    assert traffic(retried, now) == traffic(once, now)
    # the slow replicas may hold the prompts they were sent: their models keep them
    held = {rid: model.used for rid, model in retried._models.models()}
    assert held["x"] > 0 and held["y"] > 0
    assert len(retried._counted) == len(once._counted) == 0  # every request ended


def test_cost_counts_a_retry_once_after_a_timeout_then_a_refusal() -> None:
    policy = Cost()
    req = request(tokens_of(5, 600), at=1.0)
    policy.choose(req, FLEET)
    policy.observe(Routed(req, "x", FLEET))  # timed out
    policy.observe(Routed(req, "a", FLEET))
    policy.observe(Unrouted(req, "a"))  # refused
    policy.observe(Routed(req, "b", FLEET))
    assert policy._sketch.estimate(policy._prepare(req).key) == 1
    assert policy._routed == 1
    policy.observe(Finished(req, "b", ok=True))
    # ended: the same object routed again is another request (a caller that reuses it)
    policy.observe(Routed(req, "b", FLEET))
    assert policy._routed == 2


def test_cost_keeps_a_bounded_count_of_requests_whose_end_is_not_told() -> None:
    policy = Cost()
    reqs = [request(tokens_of(7, 40), at=0.001 * i) for i in range(_COUNTED_KEPT + 50)]
    for req in reqs:
        policy.observe(Routed(req, "a", FLEET))  # no end told
    assert len(policy._counted) == _COUNTED_KEPT
    assert policy._routed == len(reqs)
    # the oldest went first (a retry of it counts again); a newer one's is still known
    policy.observe(Routed(reqs[-1], "b", FLEET))
    assert policy._routed == len(reqs)
    policy.observe(Routed(reqs[0], "b", FLEET))
    assert policy._routed == len(reqs) + 1


def test_prefix_affinity_counts_a_request_retried_after_timeouts_once() -> None:
    once, retried = PrefixAffinity(), PrefixAffinity()
    fleet = FLEET[:4]
    asked, every = asked_of_a_document()
    for i, req in enumerate(every):
        for policy in (once, retried):
            policy.choose(req, fleet)
        once.observe(Routed(req, "a", fleet))
        for rid in ("b", "c")[: 1 + i % 2]:  # timed out once, or twice
            retried.observe(Routed(req, rid, fleet))
        retried.observe(Routed(req, "a", fleet))
        for policy in (once, retried):
            policy.observe(Finished(req, "a", ok=True))
    assert_learned_alike(retried, once, asked)
    assert len(retried._counted) == 0


def test_routes_another_process_made_are_each_counted_and_not_kept() -> None:
    # told once as they stand, with no end to come: nothing is kept for them
    cost, affinity = Cost(), PrefixAffinity()
    for k in range(3):
        req = request(tokens_of(k, 600), at=float(k))
        for policy in (cost, affinity):
            policy.observe(Routed(req, "a", revocable=False))
    assert cost._routed == 3
    assert len(cost._counted) == len(affinity._counted) == 0
