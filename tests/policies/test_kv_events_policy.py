"""The ``kv_events`` policy over an index fed directly (no gateway, no sockets)."""

from __future__ import annotations

from collections import Counter

import pytest

from kvwire.kv_event_format import BlockStored
from policies.base import (
    NoReplicaError,
    ReplicaRemoved,
    ReplicaReset,
    ReplicaView,
    RouteRequest,
)
from policies.kv_events import KVEvents, KVEventsConfig
from policies.registry import build_policy

DOC = list(range(100, 164))  # 64 tokens: 4 blocks of 16


def cache(policy: KVEvents, replica: str, tokens: list[int], first_hash: int) -> None:
    n = len(tokens) // 16
    policy.kv_index.apply_event(replica, BlockStored(
        tuple(range(first_hash, first_hash + n)), None, tuple(tokens[: n * 16]), 16))


def req(tokens: list[int]) -> RouteRequest:
    return RouteRequest(tokens=tokens, prompt_tokens=len(tokens))


def views(**queued: int) -> list[ReplicaView]:
    return [ReplicaView(id=rid, queued_tokens=q) for rid, q in queued.items()]


def test_the_replica_holding_the_prefix_wins_until_its_queue_outweighs_it() -> None:
    policy = build_policy({"name": "kv_events"})
    assert isinstance(policy, KVEvents) and policy.tokens_needed is None
    cache(policy, "b", DOC[:32], 1)  # b holds 2 blocks of the prompt
    prompt = [*DOC, 7, 8, 9]
    d = policy.choose(req(prompt), views(a=0, b=0, c=0))
    assert d.chosen == "b" and d.reason == "cache_match" and d.matched_tokens == 32
    by_id = {s.replica: s for s in d.scores}
    assert by_id["b"].score == len(prompt) - 32 and by_id["b"].matched_tokens == 32
    assert by_id["a"].score == len(prompt) and by_id["a"].matched_tokens == 0
    # 32 saved prefill tokens vs 33 queued: a (67) before b (67 - 32 + 33) before c (67 + 5)
    d = policy.choose(req(prompt), views(a=0, b=33, c=5))
    assert d.ranked == ("a", "b", "c") and d.reason == "balance" and d.matched_tokens == 0
    # a heavier prefill weight makes the cache worth more than the queue
    heavy = KVEvents(KVEventsConfig(prefill_weight=2.0))
    cache(heavy, "b", DOC[:32], 1)
    assert heavy.choose(req(prompt), views(a=0, b=33)).chosen == "b"


def test_the_prompts_last_token_is_never_counted_as_cached() -> None:
    policy = KVEvents()
    cache(policy, "a", DOC, 1)
    assert policy.choose(req(DOC), views(a=0, b=0)).matched_tokens == 48  # not 64
    assert policy.choose(req([*DOC, 1]), views(a=0, b=0)).matched_tokens == 64


def test_ties_are_broken_at_random_and_unhealthy_replicas_skipped() -> None:
    policy = KVEvents(KVEventsConfig(seed=3))
    wins = Counter(policy.choose(req(DOC), views(a=0, b=0, c=0)).chosen for _ in range(300))
    assert set(wins) == {"a", "b", "c"} and min(wins.values()) > 60
    cache(policy, "a", DOC, 1)
    down = [ReplicaView(id="a", healthy=False), ReplicaView(id="b")]
    d = policy.choose(req(DOC), down)
    assert d.ranked == ("b",) and d.reason == "balance"
    with pytest.raises(NoReplicaError):
        policy.choose(req(DOC), [ReplicaView(id="a", healthy=False)])


def test_reset_and_removal_forget_the_replica() -> None:
    policy = KVEvents()
    cache(policy, "a", DOC, 1)
    cache(policy, "b", DOC, 1)
    policy.observe(ReplicaReset("a"))
    assert policy.choose(req(DOC), views(a=0, b=0)).chosen == "b"
    policy.observe(ReplicaRemoved("b"))
    assert policy.kv_index.replicas() == ["a"] and policy.kv_index.num_blocks("a") == 0
    assert policy.choose(req(DOC), views(a=0, b=0)).reason == "balance"


def test_salted_requests_predict_no_hit() -> None:
    """Events carry no salt: a salted request may not share the unsalted blocks."""
    policy = KVEvents()
    cache(policy, "b", DOC, 1)
    salted = RouteRequest(tokens=[*DOC, 1], prompt_tokens=65, cache_salt="tenant-a")
    d = policy.choose(salted, views(a=0, b=0))
    assert d.matched_tokens == 0 and d.reason == "balance"
    assert policy.choose(req([*DOC, 1]), views(a=0, b=0)).chosen == "b"
