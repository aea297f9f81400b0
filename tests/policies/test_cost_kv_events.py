"""``cost`` over an exact index fed directly with KV events (no gateway, no sockets)."""

from __future__ import annotations

import random

from kvwire.kv_event_format import BlockRemoved, BlockStored
from policies.base import ReplicaRemoved, ReplicaReset, ReplicaView, Routed, RouteRequest
from policies.cost import Cost, CostConfig
from policies.index_matches import UNMATCHED_LIMIT
from policies.kv_index import KVIndex
from policies.registry import build_policy

DOC = 1000  # tokens per document


def doc(seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(50_000) for _ in range(DOC)]


def views(n: int = 4) -> list[ReplicaView]:
    return [ReplicaView(f"r{i}", kv_capacity_tokens=20_000) for i in range(n)]


def request(tokens: list[int], at: float, salt: str | None = None) -> RouteRequest:
    return RouteRequest(tokens=tokens, prompt_tokens=len(tokens), model="m", arrival_s=at,
                        cache_salt=salt)


def store(index: KVIndex, replica: str, tokens: list[int], first_hash: int,
          seq: int = 0) -> tuple[int, ...]:
    """``replica`` caches the whole blocks of ``tokens``; their engine hashes."""
    n = len(tokens) // 16
    hashes = tuple(range(first_hash, first_hash + n))
    index.apply(replica, seq, [BlockStored(hashes, None, tuple(tokens[: n * 16]), 16)])
    return hashes


def matched(policy: Cost, tokens: list[int], at: float, salt: str | None = None
            ) -> dict[str, int]:
    d = policy.choose(request(tokens, at, salt), views())
    return {s.replica: s.matched_tokens for s in d.scores if s.matched_tokens}


def route(policy: Cost, tokens: list[int], at: float) -> str:
    req = request(tokens, at)
    chosen = policy.choose(req, views()).chosen
    policy.observe(Routed(req, chosen))
    return chosen


def test_the_index_replaces_the_model_once_a_replica_publishes() -> None:
    policy = build_policy({"name": "cost"})
    assert isinstance(policy, Cost) and policy.kv_index is not None
    assert policy.tokens_needed == 0  # no events yet: chunk hashes only
    tokens = doc(1)
    home = route(policy, tokens, at=0.0)
    other = next(r.id for r in views() if r.id != home)
    index = policy.kv_index
    # the home evicted it (cached, then removed), and another replica holds it: sent there
    # by another gateway copy, or by a client that bypasses the gateway
    index.apply(home, 0, [BlockRemoved(store(index, home, tokens, 1, seq=0))])
    store(index, other, tokens, 100)
    assert policy.tokens_needed is None  # the whole prompt, to match in the index
    assert matched(policy, tokens, at=1.0)[home] > 0  # sent lately: the model's word
    late = matched(policy, tokens, at=10.0)
    assert late == {other: (DOC - 1) // 16 * 16}  # the engine serves the last token fresh
    d = policy.choose(request(tokens, 10.0), views())
    assert d.chosen == other and d.reason == "cache_match"
    assert policy.describe()["kv_event_replicas"] == [home, other]


def test_a_prompt_cached_nowhere_is_predicted_cold_once_the_index_has_matched_one() -> None:
    policy = Cost()
    assert policy.kv_index is not None
    first, second = doc(2), doc(3)
    home = route(policy, first, at=0.0)
    store(policy.kv_index, home, second, 1)  # the index and the tokens agree ...
    assert matched(policy, second, at=10.0) == {home: (DOC - 1) // 16 * 16}
    assert route(policy, second, at=10.0) == home
    # ... so the first document, which the model still holds but the engine does not,
    # is predicted cold: the index hears from the home and holds none of it
    assert matched(policy, first, at=20.0) == {}


def test_before_any_match_a_prompt_the_index_lacks_keeps_the_models_prediction() -> None:
    policy = Cost()
    assert policy.kv_index is not None
    tokens = doc(4)
    home = route(policy, tokens, at=0.0)
    store(policy.kv_index, home, doc(5), 1)
    assert matched(policy, tokens, at=10.0)[home] > 0


def test_engines_with_another_tokenizer_turn_the_index_off() -> None:
    policy = Cost()
    assert policy.kv_index is not None
    for i, r in enumerate(views()):  # blocks of tokens no prompt of ours has
        store(policy.kv_index, r.id, doc(6 + 100 * i), 1000 * i)
    # 8 documents, each again 8 s later (past the grace): from its second request on, the
    # model says a replica holds it and that replica's index holds none of it
    routed = 0
    while policy.tokens_needed is None and routed < UNMATCHED_LIMIT + 100:
        route(policy, doc(1000 + routed % 8), at=float(routed))
        routed += 1
    assert routed == UNMATCHED_LIMIT + 8
    assert policy.tokens_needed == 0
    assert policy.describe()["kv_events_unmatched"] is True
    # from then on the model alone predicts: a routed document is found again
    tokens = doc(7)
    home = route(policy, tokens, at=5000.0)
    assert matched(policy, tokens, at=6000.0)[home] > 0


def test_a_salted_prompt_is_not_looked_up_in_the_index() -> None:
    policy = Cost()
    assert policy.kv_index is not None
    tokens = doc(8)
    store(policy.kv_index, "r3", tokens, 1)
    assert matched(policy, tokens, at=0.0) == {"r3": (DOC - 1) // 16 * 16}
    # KV events carry no salt: the blocks may be another tenant's
    assert matched(policy, tokens, at=0.0, salt="tenant-a") == {}


def test_a_reset_clears_and_a_removal_drops_the_replicas_index() -> None:
    policy = Cost()
    index = policy.kv_index
    assert index is not None
    tokens = doc(9)
    store(index, "r1", tokens, 1)
    store(index, "r2", tokens, 100)
    policy.observe(ReplicaReset("r1"))
    assert index.num_blocks("r1") == 0 and index.tracks("r1")
    policy.observe(ReplicaRemoved("r2"))
    assert not index.tracks("r2")


def test_without_kv_events_the_policy_keeps_no_index() -> None:
    policy = Cost(CostConfig(kv_events=False))
    assert policy.kv_index is None and policy.tokens_needed == 0


def test_new_and_short_prompts_do_not_turn_the_index_off() -> None:
    # a burst of documents seen once, and of prompts shorter than a block: nothing the
    # index could have matched, so nothing tells another tokenizer from a new prompt
    policy = Cost()
    assert policy.kv_index is not None
    for i, r in enumerate(views()):
        store(policy.kv_index, r.id, doc(6 + 100 * i), 1000 * i)
    for n in range(2 * UNMATCHED_LIMIT):
        route(policy, doc(5000 + n), at=float(n))
        route(policy, doc(9000 + n % 8)[:12], at=float(n))
    assert policy.tokens_needed is None
    assert policy.describe()["kv_events_unmatched"] is False
