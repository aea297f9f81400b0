"""A request a gateway copy or worker process tries on several replicas is told to its peers
and sibling workers at each try; there each told try is a new object, and the receiving
policy counts the request's share of the traffic once (the frame marks the later tries),
while what each try suggests of its replica's cache stays."""

from __future__ import annotations

import dataclasses
import gc
from collections.abc import AsyncIterator, Callable

import pytest

from gateway.peer_wire import (
    HEAD_BYTES,
    MAX_META,
    RoutedElsewhere,
    ToldRequests,
    WireError,
    frame_length,
    parse_frame,
    routed_frame,
)
from policies.base import Finished, Routed, RouteRequest
from policies.cost import Cost
from policies.prefix_affinity import PrefixAffinity, PrefixAffinityConfig
from tests.support.peer_copies import PeerCopy, linked_pair
from tests.support.retried_requests import FLEET as RETRY_FLEET
from tests.support.retried_requests import failed_tries, warm_failing, workload
from tests.support.route_documents import FLEET, document, paired_workers
from tests.support.waiting import wait_until_async

REPLICAS = [view.id for view in FLEET]
# each request is tried on these replicas, in order, the last answering
TRIES = [("r0",), ("r1", "r2"), ("r3", "r0", "r1"), ("r2",), ("r3", "r2")]


def _read(frame: bytes) -> RoutedElsewhere:
    _, kind = frame_length(frame[:HEAD_BYTES])
    got = parse_frame(kind, frame[HEAD_BYTES:], 0.0)
    assert isinstance(got, RoutedElsewhere)
    return got


def test_a_later_try_reads_back_marked_and_a_first_try_as_before() -> None:
    req = document(1)
    told = ToldRequests()
    first, later = (_read(told.frame(req, "r1")) for _ in range(2))
    assert (first.again, later.again) == (False, True)
    assert b"again" not in routed_frame(req, "r1")  # a first try's meta is as it was
    # an equal request, another object: a first try
    assert not _read(told.frame(document(1), "r1")).again
    bad = routed_frame(req, "r1", True).replace(b'"again":true', b'"again":1234')
    with pytest.raises(WireError, match="'again' is int, not a boolean"):
        _read(bad)


def test_the_requests_told_are_held_while_they_live() -> None:
    told = ToldRequests()
    kept = [document(seed) for seed in range(5)]
    for req in kept:
        told.frame(req, "r0")
    for seed in range(100):  # requests that end once told
        told.frame(document(100 + seed), "r0")
    gc.collect()
    assert len(told) == len(kept)
    assert all(_read(told.frame(req, "r0")).again for req in kept)


def test_a_try_whose_frame_cannot_be_built_leaves_the_next_a_first_try() -> None:
    # the meta holds the replica's id: a try to a replica of a long one is told to no one
    req = document(1)
    told = ToldRequests()
    with pytest.raises(WireError, match="routing meta"):
        told.frame(req, "r" * MAX_META)
    assert len(told) == 0
    assert not _read(told.frame(req, "r1")).again
    assert _read(told.frame(req, "r2")).again


@pytest.fixture
async def pair() -> AsyncIterator[tuple[PeerCopy, PeerCopy]]:
    """``b`` listens; ``a`` sends to it."""
    async with linked_pair() as copies:
        yield copies


def _tried(tell: Callable[[RouteRequest, str], None], requests: list[RouteRequest]) -> int:
    """Tell each request's tries (``TRIES``) through ``tell``: the routes told."""
    told = 0
    for i, req in enumerate(requests):
        for rid in TRIES[i % len(TRIES)]:
            tell(req, rid)
            told += 1
    return told


async def test_a_peers_retry_counts_once_and_each_try_teaches_its_replica(
        pair: tuple[PeerCopy, PeerCopy]) -> None:
    a, b = pair
    requests = [document(seed) for seed in range(10)]
    told = _tried(a.peers.routed, requests)
    await wait_until_async(lambda: b.peers.counts.frames_received == told, 5.0,
                           "b hears every try")
    assert b.policy._routed == len(requests)  # each request once, not each try
    key = b.policy._prepare(document(2)).key  # tried on three replicas
    assert b.policy._sketch.estimate(key) == 1
    held = {rid: model.used for rid, model in b.policy._models.models()}
    assert all(held.get(rid, 0) > 0 for rid in REPLICAS)  # every try's replica holds some


async def test_a_peers_retry_passed_on_to_the_other_workers_counts_once(
        pair: tuple[PeerCopy, PeerCopy]) -> None:
    a, b = pair
    sibling = PrefixAffinity(PrefixAffinityConfig(chunk_chars=64))
    once = PrefixAffinity(PrefixAffinityConfig(chunk_chars=64))
    forwarder, receiver = paired_workers(b_policy=sibling)
    b.peers.forward = forwarder.routed
    try:
        requests = [document(seed) for seed in range(10)]
        told = _tried(a.peers.routed, requests)
        await wait_until_async(lambda: receiver.received == told, 5.0,
                               "the sibling hears every try, passed on")
        for req in requests:  # as the sibling would learn each request told once
            once.observe(_routed_once(req))
        assert sibling._depth._sketch is not None and once._depth._sketch is not None
        assert sibling._depth._sketch._counts == once._depth._sketch._counts
    finally:
        forwarder.stop()
        receiver.stop()


def _routed_once(req: RouteRequest) -> Routed:
    return Routed(_read(routed_frame(req, "r0")).request, "r0", revocable=False)


async def test_a_workers_retry_counts_once_at_the_other_worker() -> None:
    a, b = paired_workers()
    try:
        requests = [document(seed) for seed in range(10)]
        told = _tried(a.routed, requests)
        await wait_until_async(lambda: b.received == told, 5.0, "b hears every try")
        assert isinstance(b.policy, Cost)
        assert b.policy._routed == len(requests)
        held = {rid: model.used for rid, model in b.policy._models.models()}
        assert all(held.get(rid, 0) > 0 for rid in REPLICAS)
    finally:
        a.stop()
        b.stop()


async def test_a_peers_try_not_told_leaves_its_next_try_counted_there(
        pair: tuple[PeerCopy, PeerCopy]) -> None:
    # the first try's frame could not be built (its replica's id too long for the meta):
    # the peer hears the second try alone, and counts the request at it
    a, b = pair
    req = document(1)
    a.peers.routed(req, "r" * MAX_META)
    assert a.peers.counts.frames_dropped == 1
    a.peers.routed(req, "r1")
    await wait_until_async(lambda: b.peers.counts.frames_received == 1, 5.0,
                           "b hears the second try")
    assert b.policy._routed == 1
    assert b.policy._sketch.estimate(b.policy._prepare(document(1)).key) == 1


async def test_a_workers_try_not_told_leaves_its_next_try_counted_there() -> None:
    a, b = paired_workers()
    try:
        req = document(1)
        a.routed(req, "r" * MAX_META)
        a.routed(req, "r1")
        await wait_until_async(lambda: b.received == 1, 5.0, "b hears the second try")
        assert isinstance(b.policy, Cost)
        assert b.policy._routed == 1
    finally:
        a.stop()
        b.stop()


def test_a_told_retry_is_judged_rare_or_hot_as_its_first_try_was() -> None:
    # a retry is judged rare or hot for the scratch set as its first try was, before that
    # try's count: so a told one, whose first try's count the sketch here holds
    local, told = Cost(), Cost()
    for policy in (local, told):
        warm_failing(policy)
    reqs = workload(700, seed=7, first_question=10_000)
    for i, req in enumerate(reqs):
        chosen = local.choose(req, RETRY_FLEET).chosen
        assert told.choose(req, RETRY_FLEET).chosen == chosen
        for rid in failed_tries(i):  # timed out: each try stands
            local.observe(Routed(req, rid, RETRY_FLEET))
        local.observe(Routed(req, chosen, RETRY_FLEET))
        local.observe(Finished(req, chosen, ok=True))
        for k, rid in enumerate((*failed_tries(i), chosen)):  # each try a new object
            told.observe(Routed(dataclasses.replace(req), rid, RETRY_FLEET, revocable=False,
                                again=k > 0))
    now = reqs[-1].arrival_s
    assert now is not None and told._sketch.halvings > 0  # judged
    assert bytes(told._sketch._counts) == bytes(local._sketch._counts)
    assert told._scratch._judged == local._scratch._judged > 0
    assert told._scratch._rare_load.rate(now) == \
        pytest.approx(local._scratch._rare_load.rate(now))
