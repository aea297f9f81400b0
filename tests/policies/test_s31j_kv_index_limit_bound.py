"""The exact index's bound on a replica's blocks follows its scraped KV capacity (twice
it), but never past ``MAX_BLOCK_LIMIT``: a garbage capacity gauge (1e18 tokens) lifted the
bound, and the gateway's memory grew with whatever the replica's events named."""

from __future__ import annotations

from gateway.config import ReplicaConfig
from gateway.fleet import Fleet
from gateway.kv_event_subscriber import KVEventSubscriber
from gateway.replica_metrics import parse_metrics
from kvwire import metric_names as m
from kvwire.kv_event_format import BlockStored, KVEventBatch, encode_payload
from policies.kv_index import MAX_BLOCK_LIMIT, KVIndex


def _limit_after_a_scrape(num_gpu_blocks: int) -> int:
    """The index's limit on r0 once the subscriber applied a message of its, the replica's
    metrics page having told a KV pool of ``num_gpu_blocks`` blocks of 16 tokens."""
    fleet = Fleet([ReplicaConfig("r0", "http://127.0.0.1:1", kv_events="tcp://127.0.0.1:1")])
    page = (f"{m.NUM_REQUESTS_RUNNING} 0\n"
            f'{m.CACHE_CONFIG_INFO}{{block_size="16",num_gpu_blocks="{num_gpu_blocks}"}} 1\n')
    scraped = parse_metrics(page)
    assert scraped.kv_capacity_tokens == 16 * num_gpu_blocks
    fleet.record_scrape("r0", scraped)
    index = KVIndex(block_size=16)
    sub = KVEventSubscriber(fleet, index)
    batch = KVEventBatch(0.0, (BlockStored((1,), None, tuple(range(16)), 16),), 0)
    sub.handle("r0", [b"", (0).to_bytes(8, "big"), encode_payload(batch)])
    assert sub.messages == 1 and index.num_blocks("r0") == 1
    return index.limit_of("r0")


def test_a_huge_scraped_capacity_is_held_to_the_most_any_replica_gets() -> None:
    # a gauge of 1e18 tokens: twice it in blocks, as the subscriber sets it, is held
    assert _limit_after_a_scrape(62_500_000_000_000_000) == MAX_BLOCK_LIMIT


def test_a_scraped_capacity_below_the_most_gives_twice_its_blocks() -> None:
    assert _limit_after_a_scrape(1_000_000) == 2_000_000 < MAX_BLOCK_LIMIT


def test_a_huge_limit_is_held_to_the_most_any_replica_gets() -> None:
    index = KVIndex(block_size=16)
    index.set_limit("r0", 2 * 10**18 // 16)  # a gauge of 1e18 tokens, as the subscriber sets it
    assert index.limit_of("r0") == MAX_BLOCK_LIMIT


def test_a_known_capacity_below_the_most_is_its_limit() -> None:
    index = KVIndex(block_size=16)
    index.set_limit("r0", 5_000)
    assert index.limit_of("r0") == 5_000
