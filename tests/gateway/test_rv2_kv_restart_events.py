"""The KV event subscriber and the fleet's scrapes around an engine restart, a hybrid
model's groups seen from mid-stream, and a replica re-added with another replay endpoint."""

from __future__ import annotations

from typing import Any

import msgpack

from engine.kv_event_publisher import KVEventPublisher
from gateway.config import ReplicaConfig
from gateway.fleet import Fleet
from gateway.kv_event_subscriber import KVEventSubscriber
from gateway.replica_metrics import parse_metrics
from gateway.state import policy_listener
from kvwire.kv_event_format import BlockStored, KVEventBatch, encode_payload
from policies.kv_events import KVEvents
from policies.kv_index import KVIndex
from tests.support.servers import free_port
from tests.support.waiting import wait_until_async

VLLM = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{model_name="m"}} 0.0
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{{model_name="m"}} {n}
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{{model_name="m"}} {n}
# TYPE vllm:prompt_tokens counter
vllm:prompt_tokens_total{{model_name="m"}} {n}
"""
OLD = tuple(range(100, 164))  # 4 blocks of 16
NEW = tuple(range(500, 564))


def _fleet(**replay: str) -> Fleet:
    return Fleet([ReplicaConfig("r0", "http://127.0.0.1:1",
                                kv_events=f"tcp://127.0.0.1:{free_port()}", **replay)])


def _stored_events(first_hash: int, tokens: tuple[int, ...]) -> list[BlockStored]:
    return [BlockStored(tuple(range(first_hash, first_hash + len(tokens) // 16)), None,
                        tokens, 16)]


def _stored(seq: int, first_hash: int, tokens: tuple[int, ...]) -> list[bytes]:
    batch = KVEventBatch(0.0, tuple(_stored_events(first_hash, tokens)), 0)
    return [b"", seq.to_bytes(8, "big"), encode_payload(batch)]


async def test_a_restart_the_stream_showed_is_not_cleared_again_at_the_next_scrape() -> None:
    fleet = _fleet()
    policy = KVEvents()
    fleet.listen(policy_listener(policy))
    index = policy.kv_index
    sub = KVEventSubscriber(fleet, index)
    assert not fleet.record_scrape("r0", parse_metrics(VLLM.format(n=90_000.0)))
    await sub.receive("r0", _stored(5000, 1, OLD), None)
    await sub.receive("r0", _stored(0, 10, NEW), None)  # the new process's first message
    assert index.match(OLD, ["r0"]) == {"r0": 0} and index.match(NEW, ["r0"]) == {"r0": 4}
    # the next scrape sees its counters back: the same restart
    assert fleet.record_scrape("r0", parse_metrics(VLLM.format(n=64.0)))
    assert index.match(NEW, ["r0"]) == {"r0": 4}
    assert index.stats.restarts == 1
    index.check_integrity()


def _event(kind: str, **fields: Any) -> dict[str, Any]:
    return {"type": kind, "medium": "GPU", **fields}


def _batch(seq: int, *events: dict[str, Any]) -> list[bytes]:
    payload = msgpack.packb({"ts": 0.0, "events": list(events), "data_parallel_rank": 0},
                            use_bin_type=True)
    return [b"", seq.to_bytes(8, "big"), payload]


async def test_a_windowed_groups_removal_before_its_kind_is_known_leaves_the_prefix() -> None:
    # followed from mid-stream: the full-attention group's store names its kind, then the
    # sliding-window group evicts two of the same blocks before any store of its own named
    # its kind; that removal was applied as if full-attention, taking them out
    tokens = list(range(64))
    policy = KVEvents()
    index = policy.kv_index
    sub = KVEventSubscriber(_fleet(), index)
    await sub.receive("r0", _batch(100, _event(
        "BlockStored", block_hashes=[1, 2, 3, 4], parent_block_hash=None, token_ids=tokens,
        block_size=16, lora_id=None, lora_name=None, group_idx=0,
        kv_cache_spec_kind="full_attention")), None)
    await sub.receive("r0", _batch(101, _event("BlockRemoved", block_hashes=[4, 3],
                                               group_idx=1)), None)
    assert index.match(tokens, ["r0"]) == {"r0": 4}
    # the full-attention group's own removal still applies
    await sub.receive("r0", _batch(102, _event("BlockRemoved", block_hashes=[4],
                                               group_idx=0)), None)
    assert index.match(tokens, ["r0"]) == {"r0": 3}
    # a group whose stores name no kind counts its copies: its removals apply too
    await sub.receive("r0", _batch(103, _event(
        "BlockStored", block_hashes=[1], parent_block_hash=None, token_ids=tokens[:16],
        block_size=16, lora_id=None, lora_name=None, group_idx=2)), None)
    await sub.receive("r0", _batch(104, _event("BlockRemoved", block_hashes=[1],
                                               group_idx=2)), None)
    await sub.receive("r0", _batch(105, _event("BlockRemoved", block_hashes=[1],
                                               group_idx=0)), None)
    assert index.match(tokens, ["r0"]) == {"r0": 0}
    assert sub.malformed == 0
    index.check_integrity()


async def test_a_replica_re_added_with_another_replay_endpoint_is_replayed_from_it() -> None:
    # removed and added back (before a reconcile ran) with the same publish endpoint but a
    # new replay one: its reader was kept, asking the old replay endpoint for good
    publish = f"tcp://127.0.0.1:{free_port()}"
    old_replay = f"tcp://127.0.0.1:{free_port()}"  # nothing listens there
    new_replay = f"tcp://127.0.0.1:{free_port()}"
    fleet = Fleet([ReplicaConfig("r0", "http://127.0.0.1:1", kv_events=publish,
                                 kv_events_replay=old_replay)])
    index = KVIndex(16)
    sub = KVEventSubscriber(fleet, index, reconcile_s=60.0)
    sub.replay_timeout_s = 0.1
    publisher = KVEventPublisher(publish, replay_endpoint=new_replay)
    publisher.start()
    try:
        publisher.publish(tuple(_stored_events(1, NEW)))
        await wait_until_async(lambda: publisher.sent == 1)
        await sub.start()
        await wait_until_async(lambda: sub.replay_failures >= 1)
        fleet.remove("r0")
        fleet.add(ReplicaConfig("r0", "http://127.0.0.1:1", kv_events=publish,
                                kv_events_replay=new_replay))
        await wait_until_async(lambda: index.match(NEW, ["r0"]) == {"r0": 4})
        assert sub.replays == 1
    finally:
        await sub.stop()
        publisher.stop()


def _kept_frames(publisher: KVEventPublisher) -> dict[int, list[bytes]]:
    """What ``publisher`` sent, as the stream carried it (the batches it keeps)."""
    return {seq: [b"", seq.to_bytes(8, "big"), payload]
            for seq, payload in publisher._kept}


async def test_a_restart_numbered_past_the_old_process_is_told_by_its_replay() -> None:
    # the old process sent 0..2 and died young; the new one's first message to arrive is
    # 5 (0..4 sent before the subscriber reconnected): taken as a gap, the old process's
    # blocks stayed. Its replay endpoint keeps another batch 2 than the one applied
    replay = f"tcp://127.0.0.1:{free_port()}"
    index = KVIndex(16)
    sub = KVEventSubscriber(_fleet(), index)  # its reader follows no replay on its own
    await sub.start()
    new = KVEventPublisher(f"tcp://127.0.0.1:{free_port()}", replay_endpoint=replay)
    new.start()
    try:
        for seq, first in ((0, 1), (1, 1), (2, 1)):
            await sub.receive("r0", _stored(seq, first, OLD), None)
        assert index.match(OLD, ["r0"]) == {"r0": 4}
        for step in range(6):
            new.publish(tuple(_stored_events(10 + 10 * step, NEW)))
        await wait_until_async(lambda: new.sent == 6)
        await sub.receive("r0", _kept_frames(new)[5], replay)
        assert index.match(OLD, ["r0"]) == {"r0": 0}
        assert index.match(NEW, ["r0"]) == {"r0": 4}
        assert index.stats.restarts == 1 and index.last_seq("r0") == 5
        index.check_integrity()
    finally:
        await sub.stop()
        new.stop()


async def test_a_gap_in_one_processs_stream_keeps_what_it_told_before() -> None:
    replay = f"tcp://127.0.0.1:{free_port()}"
    index = KVIndex(16)
    sub = KVEventSubscriber(_fleet(), index)
    await sub.start()
    engine = KVEventPublisher(f"tcp://127.0.0.1:{free_port()}", replay_endpoint=replay)
    engine.start()
    try:
        engine.publish(tuple(_stored_events(1, OLD)))
        for step in range(1, 6):
            engine.publish(tuple(_stored_events(10 + 10 * step, NEW)))
        await wait_until_async(lambda: engine.sent == 6)
        sent = _kept_frames(engine)
        for seq in (0, 1, 2):
            await sub.receive("r0", sent[seq], None)
        await sub.receive("r0", sent[5], replay)  # 3 and 4 lost on the way
        assert index.match(OLD, ["r0"]) == {"r0": 4}
        assert index.stats.restarts == 0 and index.last_seq("r0") == 5
        assert sub.replays == 1 and index.stats.gaps == 0
        index.check_integrity()
    finally:
        await sub.stop()
        engine.stop()
