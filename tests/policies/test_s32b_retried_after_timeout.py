"""A request tried again on another replica after a try that may have reached its replica
(it timed out, or broke after being sent: a second ``Routed`` with no ``Unrouted`` between)
counts once in what a policy learns of the traffic, as one refused does; what the first
try made the policy believe of its replica's cache stays."""

from __future__ import annotations

import random

import pytest

from policies.base import Finished, ReplicaView, Routed, RouteRequest, Unrouted
from policies.cost import Cost
from policies.counted_requests import _COUNTED_KEPT
from policies.prefix_affinity import PrefixAffinity

# two replicas whose tries time out (a queue no decision sends to), and four that answer
SLOW = ("x", "y")
FLEET = [ReplicaView(rid, kv_capacity_tokens=20_000) for rid in ("a", "b", "c", "d")] + [
    ReplicaView(rid, kv_capacity_tokens=20_000, queued_tokens=10**9) for rid in SLOW]


def tokens_of(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(50_000) for _ in range(n)]


def request(tokens: list[int], at: float | None) -> RouteRequest:
    return RouteRequest(tokens=tokens, prompt_tokens=len(tokens), model="m", arrival_s=at)


def workload(n: int) -> list[RouteRequest]:
    """``n`` requests over 30 documents (a few hot), each with its own question."""
    rng = random.Random(11)
    docs = [tokens_of(d, 600) for d in range(30)]
    return [request([*docs[min(int(rng.expovariate(0.25)), 29)], *tokens_of(20_000 + i, 48)],
                    at=0.05 * i) for i in range(n)]


def timeouts(i: int) -> tuple[str, ...]:
    """The slow replicas request ``i`` timed out on before it was answered."""
    return SLOW if i % 7 == 0 else SLOW[:1] if i % 3 == 0 else ()


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
    warm = request(tokens_of(99, 600), at=0.0)
    for policy in (once, retried):  # each slow replica has a model in both (whose sizes
        policy.choose(warm, FLEET)  # make the sketch's window)
        for rid in SLOW:
            policy.observe(Routed(warm, rid, FLEET))
            policy.observe(Finished(warm, rid, ok=True))
    reqs = workload(700)
    for i, req in enumerate(reqs):
        chosen = once.choose(req, FLEET).chosen
        retried.choose(req, FLEET)
        once.observe(Routed(req, chosen, FLEET))
        for rid in timeouts(i):  # sent, and no answer in time: no Unrouted
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
    document = tokens_of(3, 400)  # shorter than K: keyed by the rung inside it, in time
    asked = [request([*document, *tokens_of(200 + q, 200)], at=float(q)) for q in range(4)]
    others = [request(tokens_of(300 + i, 900), at=10.0 + i) for i in range(80)]
    for i, req in enumerate([asked[0], *others, *asked[1:]]):
        for policy in (once, retried):
            policy.choose(req, fleet)
        once.observe(Routed(req, "a", fleet))
        for rid in ("b", "c")[: 1 + i % 2]:  # timed out once, or twice
            retried.observe(Routed(req, rid, fleet))
        retried.observe(Routed(req, "a", fleet))
        for policy in (once, retried):
            policy.observe(Finished(req, "a", ok=True))
    assert [retried.key(r) for r in asked] == [once.key(r) for r in asked]
    depth_once, depth_retried = once._depth, retried._depth
    assert depth_once._sketch is not None and depth_retried._sketch is not None
    assert depth_retried._sketch._counts == depth_once._sketch._counts
    assert depth_retried._tags == depth_once._tags
    learned_once, learned_retried = once._learner, retried._learner
    assert learned_once is not None and learned_retried is not None
    assert learned_retried._counts == learned_once._counts
    assert learned_retried._recent == learned_once._recent
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
