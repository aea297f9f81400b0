"""Whether a refused try counted its request is decided when it was routed: a replica
removed, or its capacity changed, between the try's ``Routed`` and its ``Unrouted`` does
not make the retry count the request again."""

from __future__ import annotations

import random

from policies.base import ReplicaRemoved, ReplicaView, Routed, RouteRequest, Unrouted
from policies.cost import Cost

FLEET = [ReplicaView(rid, kv_capacity_tokens=20_000) for rid in ("a", "x")]


def request() -> RouteRequest:
    rng = random.Random(1)
    tokens = [rng.randrange(50_000) for _ in range(4000)]
    return RouteRequest(tokens=tokens, prompt_tokens=len(tokens), model="m", arrival_s=1.0)


def counted(policy: Cost, req: RouteRequest) -> tuple[int, int]:
    """The request's prefix count in the sketch, and the requests routed."""
    return policy._sketch.estimate(policy._prepare(req).key), policy._routed


def test_a_retry_after_a_try_to_a_replica_removed_since_counts_once() -> None:
    policy = Cost()
    req = request()
    policy.choose(req, FLEET)
    policy.observe(Routed(req, "x", FLEET))
    policy.observe(ReplicaRemoved("x"))
    policy.observe(Unrouted(req, "x"))
    policy.observe(Routed(req, "a", FLEET))
    assert counted(policy, req) == (1, 1)  # the bug: (2, 2)
    policy.check_integrity()


def test_a_retry_after_a_try_to_a_replica_whose_capacity_shrank_counts_once() -> None:
    policy = Cost()
    req = request()
    policy.choose(req, FLEET)
    policy.observe(Routed(req, "x", FLEET))
    # "x" restarts with a cache the prompt no longer fits in, read at the next decision
    small = [FLEET[0], ReplicaView("x", kv_capacity_tokens=1000, epoch=1)]
    policy.choose(RouteRequest(tokens=[1], prompt_tokens=1, model="m", arrival_s=2.0), small)
    policy.observe(Unrouted(req, "x"))
    policy.observe(Routed(req, "a", small))
    assert counted(policy, req) == (1, 1)  # the bug: (2, 2)
    policy.check_integrity()
