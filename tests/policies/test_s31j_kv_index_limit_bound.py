"""The exact index's bound on a replica's blocks follows its scraped KV capacity (twice
it), but never past ``MAX_BLOCK_LIMIT``: a garbage capacity gauge (1e18 tokens) lifted the
bound, and the gateway's memory grew with whatever the replica's events named."""

from __future__ import annotations

from policies.kv_index import DEFAULT_BLOCK_LIMIT, MAX_BLOCK_LIMIT, KVIndex


def test_a_huge_limit_is_held_to_the_most_any_replica_gets() -> None:
    index = KVIndex(block_size=16)
    index.set_limit("r0", 2 * 10**18 // 16)  # a gauge of 1e18 tokens, as the subscriber sets it
    assert index.limit_of("r0") == MAX_BLOCK_LIMIT
    assert MAX_BLOCK_LIMIT >= DEFAULT_BLOCK_LIMIT  # a replica of unknown capacity gets no more


def test_a_known_capacity_below_the_most_is_its_limit() -> None:
    index = KVIndex(block_size=16)
    index.set_limit("r0", 5_000)
    assert index.limit_of("r0") == 5_000
