"""KV event streams the subscriber must stay bounded under: a batch of many events that
name no block is applied in slices (the event loop served between), and a replay
endpoint that keeps sending new batches is stopped after a bound."""

from __future__ import annotations

import asyncio

import zmq
import zmq.asyncio

from gateway.config import ReplicaConfig
from gateway.fleet import Fleet
from gateway.kv_event_subscriber import KVEventSubscriber
from kvwire.kv_event_format import BlockRemoved, BlockStored, KVEvent, KVEventBatch, encode_payload
from policies.kv_index import KVIndex
from tests.support.loop_turns import counted_turns
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
    async with counted_turns() as turns:
        await asyncio.sleep(0)
        before = turns.count
        await sub.receive("r0", _frames(0, events), None)
        served = turns.count - before
    assert served >= 1  # the loop ran between the batch's slices
    assert sub.messages == 1 and index.last_seq("r0") == 0
    assert index.num_blocks("r0") == 1  # the same as the batch applied at once
    assert index.match(TOKENS, ["r0"]) == {"r0": 1}
    index.check_integrity()


async def test_a_replay_endpoint_sending_new_batches_without_end_is_cut_off() -> None:
    # every batch moved the replay on, so one numbering new batches for ever held the
    # replica's reader (its live stream unread) for good: past the bound it ends, as failed
    ctx = zmq.asyncio.Context()
    index = KVIndex(16)
    sub = KVEventSubscriber(_fleet(), index)
    sub._ctx = ctx
    sub.replay_max_batches = 50
    address = f"tcp://127.0.0.1:{free_port()}"
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.bind(address)

    async def serve() -> None:  # batch after batch, numbered upwards, and never the end
        peer, _, _ = await router.recv_multipart()
        for seq in range(1000):  # more than the reader takes, one at a time
            h = 100 + 2 * seq
            payload = _frames(seq, (BlockStored((h, h + 1), None, TOKENS, 16),))[2]
            await router.send_multipart([peer, b"", seq.to_bytes(8, "big"), payload])
            await asyncio.sleep(0)
        await asyncio.Event().wait()  # ... and never the end marker

    serving = asyncio.create_task(serve())
    try:
        assert await sub.catch_up("r0", address) is None
    finally:
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)
        router.close()
        ctx.term()
    assert sub.replays == 0 and sub.replay_failures == 1
    assert index.last_seq("r0") == 49 and sub.messages == 50  # what came before is kept
    assert sub._replayed["r0"][0] == 49  # live copies of those are still recognised
    index.check_integrity()
