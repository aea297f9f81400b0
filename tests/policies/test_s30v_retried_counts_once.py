"""A request retried on another replica after one refused it (``Routed``, ``Unrouted``,
``Routed``) counts once in what a policy learns of the traffic: the policy ends as one that
saw it sent once, to the replica that took it."""

from __future__ import annotations

import random

import pytest

from kvwire.kv_event_format import BlockRemoved, BlockStored
from policies.base import (
    Finished,
    ReplicaRemoved,
    ReplicaView,
    Routed,
    RouteRequest,
    Unrouted,
)
from policies.cost import Cost
from policies.kv_index import KVIndex
from policies.prefix_affinity import PrefixAffinity

# two replicas that shed every try they get (a queue no decision sends to), and four that
# take them
SHEDDING = ("x", "y")
FLEET = [ReplicaView(rid, kv_capacity_tokens=20_000) for rid in ("a", "b", "c", "d")] + [
    ReplicaView(rid, kv_capacity_tokens=20_000, queued_tokens=10**9) for rid in SHEDDING]


def tokens_of(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(50_000) for _ in range(n)]


def request(tokens: list[int], at: float | None) -> RouteRequest:
    return RouteRequest(tokens=tokens, prompt_tokens=len(tokens), model="m", arrival_s=at)


def workload(n: int) -> list[RouteRequest]:
    """``n`` requests over 30 documents (a few hot), each with its own question."""
    rng = random.Random(7)
    docs = [tokens_of(d, 600) for d in range(30)]
    out = []
    for i in range(n):
        d = min(int(rng.expovariate(0.25)), 29)
        out.append(request([*docs[d], *tokens_of(10_000 + i, 48)], at=0.05 * i))
    return out


def refusals(i: int) -> tuple[str, ...]:
    """The shedding replicas request ``i`` is refused by before it is taken."""
    return SHEDDING if i % 7 == 0 else SHEDDING[:1] if i % 3 == 0 else ()


def cost_figures(policy: Cost, now: float) -> dict[str, object]:
    """What the policy learned of the traffic, fleet-wide."""
    learner = policy._keys.learner
    assert learner is not None
    scratch = policy._scratch
    return {
        "sketch": (bytes(policy._sketch._counts), policy._sketch.total,
                   policy._sketch.halvings),
        "routed": (policy._routed, policy._mean_prompt),
        "requests": pytest.approx(policy._requests.rate(now)),
        "hot_requests": pytest.approx(policy._hot_requests.rate(now)),
        "all_load": pytest.approx(policy._all_load.rate(now)),
        "scratch": (scratch._judged, pytest.approx(scratch._judged_load.rate(now)),
                    pytest.approx(scratch._rare_load.rate(now)), scratch.size),
        "learner": (dict(learner._counts), len(learner._recent)),
        "describe": policy.describe(),
    }


def test_cost_counts_a_request_retried_after_refusals_once() -> None:
    once, retried = Cost(), Cost()
    warm = request(tokens_of(99, 600), at=0.0)
    for policy in (once, retried):  # each shedding replica has a model in both
        policy.choose(warm, FLEET)  # (of the capacity its view tells)
        for rid in SHEDDING:
            policy.observe(Routed(warm, rid, FLEET))
            policy.observe(Finished(warm, rid, ok=True))
    reqs = workload(700)
    for i, req in enumerate(reqs):
        chosen = once.choose(req, FLEET)
        assert retried.choose(req, FLEET) == chosen  # as in a fleet that took it at once
        once.observe(Routed(req, chosen.chosen, FLEET))
        for rid in refusals(i):
            retried.observe(Routed(req, rid, FLEET))
            retried.observe(Unrouted(req, rid))
        retried.observe(Routed(req, chosen.chosen, FLEET))
        for policy in (once, retried):
            policy.observe(Finished(req, chosen.chosen, ok=True))
    retried.check_integrity()
    assert retried._sketch.halvings > 0 and retried._scratch._judged > 0  # all exercised
    now = reqs[-1].arrival_s
    assert now is not None
    assert cost_figures(retried, now) == cost_figures(once, now)


def test_cost_counts_a_try_to_a_replica_it_let_go_nowhere() -> None:
    # a try to a replica removed counts nothing, refused or not: the retry is the request's
    # first count
    policy = Cost()
    policy.observe(ReplicaRemoved("x"))
    req = request(tokens_of(5, 600), at=1.0)
    policy.observe(Routed(req, "x", FLEET))
    policy.observe(Unrouted(req, "x"))
    policy.observe(Routed(req, "a", FLEET))
    assert policy._sketch.estimate(policy._prepare(req).key) == 1
    assert policy._routed == 1


DOC = 1000  # tokens of a document


def views() -> list[ReplicaView]:
    return [ReplicaView(f"r{i}", kv_capacity_tokens=20_000) for i in range(4)]


def store(index: KVIndex, replica: str, tokens: list[int], first_hash: int) -> tuple[int, ...]:
    """``replica`` caches the whole blocks of ``tokens``; their engine hashes."""
    n = len(tokens) // 16
    hashes = tuple(range(first_hash, first_hash + n))
    index.apply(replica, 0, [BlockStored(hashes, None, tuple(tokens[: n * 16]), 16)])
    return hashes


def matched(policy: Cost, tokens: list[int], at: float) -> dict[str, int]:
    """Each replica's cached tokens of ``tokens`` (those holding some), each asked alone (a
    candidate far behind the best is ranked unscored)."""
    out = {}
    for view in views():
        d = policy.explain(request(tokens, at), [view])
        if d.matched_tokens:
            out[view.id] = d.matched_tokens
    return out


@pytest.mark.parametrize("earlier_send_s", [0.0, 2.0])
def test_cost_kv_grace_is_not_kept_for_a_refused_send(earlier_send_s: float) -> None:
    # the document went to its home (which evicted it since: the index holds none of it
    # there) and is held elsewhere; a later request for it is refused by the home and
    # answered by another replica: the home is no recent send of it, but the one before
    policy = Cost()
    index = policy.kv_index
    assert index is not None
    body = tokens_of(1, DOC)
    first = request([*body, 1], at=earlier_send_s)
    home = policy.choose(first, views()).chosen
    policy.observe(Routed(first, home, views()))
    policy.observe(Finished(first, home, ok=True))
    other = next(r.id for r in views() if r.id != home)
    index.apply(home, 0, [BlockRemoved(store(index, home, body, 1))])
    store(index, other, body, 100)
    later = request([*body, 2], at=4.0)
    policy.choose(later, views())
    policy.observe(Routed(later, home, views()))
    policy.observe(Unrouted(later, home))
    policy.observe(Routed(later, other, views()))
    got = matched(policy, [*body, 3], at=6.0)
    grace = policy.config.kv_event_grace_s
    if 6.0 - earlier_send_s < grace:  # the send before it, within the grace, stands
        assert got[home] >= DOC - 128
    else:  # the index's word: none of it on the home
        assert home not in got
    assert got[other] == DOC // 16 * 16
    policy.check_integrity()


def test_prefix_affinity_counts_a_request_retried_after_refusals_once() -> None:
    once, retried = PrefixAffinity(), PrefixAffinity()
    fleet = views()
    document = tokens_of(3, 400)  # shorter than K: keyed by the rung inside it, in time
    asked = [request([*document, *tokens_of(200 + q, 200)], at=float(q)) for q in range(4)]
    others = [request(tokens_of(300 + i, 900), at=10.0 + i) for i in range(80)]
    for i, req in enumerate([asked[0], *others, *asked[1:]]):
        for policy in (once, retried):
            policy.choose(req, fleet)
        once.observe(Routed(req, "r0", fleet))
        for rid in ("r1", "r2")[: 1 + i % 2]:  # refused once, or twice
            retried.observe(Routed(req, rid, fleet))
            retried.observe(Unrouted(req, rid))
        retried.observe(Routed(req, "r0", fleet))
        if req is asked[0]:
            # the document's next question is keyed by the document: its first one
            # seemed to come back (counted twice), and it was keyed as a new branch
            assert retried.key(asked[1]) == once.key(asked[1])
    assert [retried.key(r) for r in asked] == [once.key(r) for r in asked]
    depth_once, depth_retried = once._depth, retried._depth
    assert depth_once._sketch is not None and depth_retried._sketch is not None
    assert depth_retried._sketch._counts == depth_once._sketch._counts
    assert depth_retried._tags == depth_once._tags
    learned_once, learned_retried = once._learner, retried._learner
    assert learned_once is not None and learned_retried is not None
    assert learned_retried._counts == learned_once._counts
    assert learned_retried._recent == learned_once._recent
