"""KV events' fields beyond a block's hashes and tokens, kept as the subscriber applies
them: a salted chain's extra keys when a long stored run is applied in slices, and the KV
cache groups of a hybrid model (a sliding-window group beside the full-attention one); and
what the subscriber keeps of a replica that left."""

from __future__ import annotations

from typing import Any

import msgpack

from gateway.config import ReplicaConfig
from gateway.fleet import Fleet
from gateway.kv_event_subscriber import KVEventSubscriber
from kvwire.kv_event_format import (
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    decode_payload,
    encode_payload,
)
from policies.kv_index import KVIndex
from tests.support.servers import free_port
from tests.support.waiting import wait_until_async


def _fleet() -> Fleet:
    return Fleet([ReplicaConfig("r0", "http://127.0.0.1:1",
                                kv_events=f"tcp://127.0.0.1:{free_port()}")])


def _frames(seq: int, payload: bytes) -> list[bytes]:
    return [b"", seq.to_bytes(8, "big"), payload]


async def test_a_salted_run_applied_in_slices_keeps_its_salt() -> None:
    # one stored run past a slice (8,192 blocks): block 0 is hashed over a cache salt, so
    # no unsalted prompt's tokens may match any of the run; its slices dropped the extra
    # keys and indexed the salted tenant's document for everyone
    n = 8_200
    tokens = tuple(i % 50_000 for i in range(16 * n))
    salted = BlockStored(tuple(range(1, n + 1)), None, tokens, 16,
                         extra_keys=(("tenant-salt",),) + (None,) * (n - 1))
    index = KVIndex(16)
    sub = KVEventSubscriber(_fleet(), index)
    await sub.receive("r0", _frames(0, encode_payload(KVEventBatch(0.0, (salted,), 0))),
                      None)
    assert index.match(tokens[:64], ["r0"]) == {"r0": 0}
    # the first slice is keyed elsewhere, the next one's parent is unknown
    assert index.num_blocks("r0") == 0
    assert index.stats.keyed_elsewhere + index.stats.orphans == n
    index.check_integrity()


def _event(kind: str, **fields: Any) -> dict[str, Any]:
    return {"type": kind, "medium": "GPU", **fields}


def _batch(*events: dict[str, Any]) -> bytes:
    # newer vLLM: the batch and each event a map, defaults left out
    return msgpack.packb({"ts": 0.0, "events": list(events), "data_parallel_rank": 0},
                         use_bin_type=True)


async def test_a_sliding_window_groups_evictions_leave_the_full_attention_blocks() -> None:
    # a hybrid model (full-attention and sliding-window layers): each KV cache group
    # stores and evicts the prompt's blocks under the same hashes; the window's group
    # names only its last blocks and soon evicts them, while the full-attention group
    # still holds the whole prefix. Its evictions took the prefix out of the index
    tokens = list(range(64))
    index = KVIndex(16)
    sub = KVEventSubscriber(_fleet(), index)
    stored = _batch(
        _event("BlockStored", block_hashes=[1, 2, 3, 4], parent_block_hash=None,
               token_ids=tokens, block_size=16, lora_id=None, lora_name=None, group_idx=0,
               kv_cache_spec_kind="full_attention"),
        _event("BlockStored", block_hashes=[4], parent_block_hash=None, token_ids=tokens,
               block_size=16, lora_id=None, lora_name=None, group_idx=1,
               kv_cache_spec_kind="sliding_window", kv_cache_spec_sliding_window=32))
    await sub.receive("r0", _frames(0, stored), None)
    await sub.receive("r0", _frames(1, _batch(
        _event("BlockRemoved", block_hashes=[4, 3], group_idx=1))), None)
    assert index.match(tokens, ["r0"]) == {"r0": 4}
    await sub.receive("r0", _frames(2, _batch(
        _event("BlockRemoved", block_hashes=[4], group_idx=0))), None)
    assert index.match(tokens, ["r0"]) == {"r0": 3}  # the full-attention group's own
    assert sub.malformed == 0
    index.check_integrity()


def test_group_fields_read_back_as_written() -> None:
    events = (BlockStored((1, 2), None, tuple(range(32)), 16, group_idx=1,
                          kv_cache_spec_kind="sliding_window"),
              BlockStored((3,), 2, tuple(range(16)), 16, group_idx=0),
              BlockRemoved((1,), "GPU", 1), BlockRemoved((2,)))
    for encoding in ("array", "map"):
        payload = encode_payload(KVEventBatch(0.0, events, 0), encoding)
        assert decode_payload(payload).events == events


async def test_a_replica_that_leaves_takes_its_replay_backoff_with_it() -> None:
    # a replica whose replay endpoint failed leaves; one back under its id (a pod of a
    # StatefulSet) waited out the old one's backoff (its first live message then passed
    # the catch-up for good), and every id ever followed was kept
    down = f"tcp://127.0.0.1:{free_port()}"  # nothing listens
    fleet = Fleet([ReplicaConfig("r0", "http://127.0.0.1:1",
                                 kv_events=f"tcp://127.0.0.1:{free_port()}",
                                 kv_events_replay=down)])
    sub = KVEventSubscriber(fleet, KVIndex(16), reconcile_s=60.0)
    sub.replay_timeout_s = 0.05
    await sub.start()
    try:
        await wait_until_async(lambda: sub.replay_failures == 1)
        assert not sub._may_replay("r0")
        fleet.remove("r0")  # the subscriber's reconcile loop lets its reader go
        await wait_until_async(lambda: "r0" not in sub._readers)
        assert sub._may_replay("r0") and not sub._replay_backoff
    finally:
        await sub.stop()


async def test_a_model_of_windowed_groups_alone_keeps_their_events() -> None:
    # no group holds whole prefixes: its blocks are all the index can know of
    index = KVIndex(16)
    sub = KVEventSubscriber(_fleet(), index)
    await sub.receive("r0", _frames(0, _batch(
        _event("BlockStored", block_hashes=[1, 2], parent_block_hash=None,
               token_ids=list(range(32)), block_size=16, lora_id=None, lora_name=None,
               group_idx=0, kv_cache_spec_kind="sliding_window"))), None)
    assert index.match(list(range(32)), ["r0"]) == {"r0": 2}
