"""KV event streams the subscriber must stay bounded under: a batch of many events that
name no block is applied in slices (the event loop served between), and a replay
endpoint that keeps sending new batches is stopped after a bound."""

from __future__ import annotations

import asyncio

from gateway.config import ReplicaConfig
from gateway.fleet import Fleet
from gateway.kv_event_subscriber import KVEventSubscriber
from kvwire.kv_event_format import BlockRemoved, BlockStored, KVEvent, KVEventBatch, encode_payload
from policies.kv_index import KVIndex
from tests.support.servers import free_port

TOKENS = tuple(range(32))


def _fleet() -> Fleet:
    return Fleet([ReplicaConfig("r0", "http://127.0.0.1:1",
                                kv_events=f"tcp://127.0.0.1:{free_port()}")])


def _frames(seq: int, events: tuple[KVEvent, ...]) -> list[bytes]:
    return [b"", seq.to_bytes(8, "big"), encode_payload(KVEventBatch(0.0, events, 0))]


async def test_a_batch_of_many_events_naming_no_block_is_applied_in_slices() -> None:
    # 12,000 removals of no block between a store and its removal (~230 KB: decoded in
    # place): counted as nothing, they were applied at once, the loop held throughout
    events: tuple[KVEvent, ...] = (BlockStored((1, 2), None, TOKENS, 16),
                                   *(BlockRemoved(()),) * 12_000, BlockRemoved((2,)))
    index = KVIndex(16)
    sub = KVEventSubscriber(_fleet(), index)
    ticks = 0

    async def ticking() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    ticker = asyncio.create_task(ticking())
    try:
        await asyncio.sleep(0)
        before = ticks
        await sub.receive("r0", _frames(0, events), None)
        served = ticks - before
    finally:
        ticker.cancel()
    assert served >= 1  # the loop ran between the batch's slices
    assert sub.messages == 1 and index.last_seq("r0") == 0
    assert index.num_blocks("r0") == 1  # the same as the batch applied at once
    assert index.match(TOKENS, ["r0"]) == {"r0": 1}
    index.check_integrity()
