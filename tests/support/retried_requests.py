"""Requests tried on several replicas, for the tests that a policy counts each request once
in what it learns of the traffic, whether a try before was refused or timed out: a fleet
with two replicas whose tries fail, a workload over a few hot documents, the failing
replicas each request is tried on first, and what two ``PrefixAffinity`` learned."""

from __future__ import annotations

import random

from policies.base import Finished, ReplicaView, Routed, RouteRequest
from policies.cost import Cost
from policies.prefix_affinity import PrefixAffinity

# two replicas whose tries fail, refused or timed out (a queue no decision sends to), and
# four that answer
FAILING = ("x", "y")
FLEET = [ReplicaView(rid, kv_capacity_tokens=20_000) for rid in ("a", "b", "c", "d")] + [
    ReplicaView(rid, kv_capacity_tokens=20_000, queued_tokens=10**9) for rid in FAILING]


def tokens_of(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(50_000) for _ in range(n)]


def request(tokens: list[int], at: float | None) -> RouteRequest:
    return RouteRequest(tokens=tokens, prompt_tokens=len(tokens), model="m", arrival_s=at)


def workload(n: int, seed: int, first_question: int) -> list[RouteRequest]:
    """``n`` requests over 30 documents (a few hot, drawn with ``seed``), each with its own
    question (request ``i``'s of seed ``first_question + i``)."""
    rng = random.Random(seed)
    docs = [tokens_of(d, 600) for d in range(30)]
    return [request([*docs[min(int(rng.expovariate(0.25)), 29)],
                     *tokens_of(first_question + i, 48)], at=0.05 * i) for i in range(n)]


def failed_tries(i: int) -> tuple[str, ...]:
    """The failing replicas request ``i`` is tried on before the one that answers it."""
    return FAILING if i % 7 == 0 else FAILING[:1] if i % 3 == 0 else ()


def warm_failing(policy: Cost) -> None:
    """Give each failing replica a model in ``policy`` (of the capacity its view tells;
    the models' sizes make the sketch's window), with a request answered there."""
    warm = request(tokens_of(99, 600), at=0.0)
    policy.choose(warm, FLEET)
    for rid in FAILING:
        policy.observe(Routed(warm, rid, FLEET))
        policy.observe(Finished(warm, rid, ok=True))


def asked_of_a_document() -> tuple[list[RouteRequest], list[RouteRequest]]:
    """Four questions on one document shorter than ``PrefixAffinity``'s K (keyed by the
    rung inside it, in time), and every request in the order they come: the first
    question, 80 others, then the other three questions."""
    document = tokens_of(3, 400)
    asked = [request([*document, *tokens_of(200 + q, 200)], at=float(q)) for q in range(4)]
    others = [request(tokens_of(300 + i, 900), at=10.0 + i) for i in range(80)]
    return asked, [asked[0], *others, *asked[1:]]


def assert_learned_alike(retried: PrefixAffinity, once: PrefixAffinity,
                         asked: list[RouteRequest]) -> None:
    """``retried`` (its requests tried more than once) learned what ``once`` did: the same
    keys for ``asked``, key depth counts and common prefix learned."""
    assert [retried.key(r) for r in asked] == [once.key(r) for r in asked]
    depth_once, depth_retried = once._depth, retried._depth
    assert depth_once._sketch is not None and depth_retried._sketch is not None
    assert depth_retried._sketch._counts == depth_once._sketch._counts
    assert depth_retried._tags == depth_once._tags
    learned_once, learned_retried = once._learner, retried._learner
    assert learned_once is not None and learned_retried is not None
    assert learned_retried._counts == learned_once._counts
    assert learned_retried._recent == learned_once._recent
