"""A request retried on another replica after one refused it (``Routed``, ``Unrouted``,
``Routed``) counts once in what a policy learns of the traffic: the policy ends as one that
saw it sent once, to the replica that took it."""

from __future__ import annotations

import pytest

from kvwire.kv_event_format import BlockRemoved, BlockStored
from policies.base import Finished, ReplicaRemoved, ReplicaView, Routed, Unrouted
from policies.cost import Cost
from policies.kv_index import KVIndex
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
    for policy in (once, retried):  # each failing replica has a model in both
        warm_failing(policy)
    reqs = workload(700, seed=7, first_question=10_000)
    for i, req in enumerate(reqs):
        chosen = once.choose(req, FLEET)
        assert retried.choose(req, FLEET) == chosen  # as in a fleet that took it at once
        once.observe(Routed(req, chosen.chosen, FLEET))
        for rid in failed_tries(i):  # refused
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
    asked, every = asked_of_a_document()
    for i, req in enumerate(every):
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
    assert_learned_alike(retried, once, asked)
