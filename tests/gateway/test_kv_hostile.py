"""KV event streams no engine sends: wrong types inside a batch, a bad batch kept on the
replay endpoint, a replay endpoint that is down, batches of millions of blocks, a stream
that never removes what it stores. Each is skipped and counted, or bounded; the reader
goes on with the next message."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import msgpack
import pytest
import zmq
import zmq.asyncio

from gateway.config import ReplicaConfig
from gateway.fleet import Fleet
from gateway.kv_event_subscriber import KVEventSubscriber
from kvwire.kv_event_format import (
    REPLAY_END,
    BlockRemoved,
    BlockStored,
    KVEvent,
    KVEventBatch,
    encode_payload,
)
from policies.kv_index import KVIndex
from tests.support.loop_turns import counted_turns
from tests.support.servers import free_port

TOKENS = tuple(range(32))


def frames(seq: int, events: tuple[KVEvent, ...] | None = None,
           raw: bytes | None = None) -> list[bytes]:
    payload = raw if raw is not None else encode_payload(KVEventBatch(0.0, events or (), 0))
    return [b"", seq.to_bytes(8, "big"), payload]


def good(seq: int) -> list[bytes]:
    h = 100 + 2 * seq
    return frames(seq, (BlockStored((h, h + 1), None, TOKENS, 16),))


def packed(events: list[object]) -> bytes:
    return msgpack.packb([0.0, events, 0], use_bin_type=True)


def stored_map(**changed: object) -> dict[str, object]:
    return {"type": "BlockStored", "block_hashes": [7, 8], "parent_block_hash": None,
            "token_ids": list(TOKENS), "block_size": 16, "lora_id": None, "medium": "GPU",
            "lora_name": None, **changed}


HOSTILE = {
    "type_a_list": packed([stored_map(type=["BlockStored"])]),
    "lora_name_a_number": packed([stored_map(lora_name=7)]),
    "lora_name_a_map": packed([stored_map(lora_name={"a": 1})]),
    "token_id_negative": packed([stored_map(token_ids=[-1] * 32)]),
    "token_id_past_u32": packed([stored_map(token_ids=[1 << 40] * 32)]),
    # a map whose key is an array: msgpack cannot make it a dict key
    "array_key": b"\x93\xcb" + b"\x00" * 8 + b"\x91\x81\x91\x01\x01\x00",
}


@contextlib.asynccontextmanager
async def replay_endpoint(ctx: zmq.asyncio.Context, batches: list[tuple[int, bytes]],
                          gap_s: float = 0.0) -> AsyncIterator[str]:
    """A replay endpoint on loopback (its address) that answers every request with
    ``batches`` (sequence number, payload), ``gap_s`` apart, then the end marker."""
    address = f"tcp://127.0.0.1:{free_port()}"
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.bind(address)

    async def serve() -> None:
        while True:
            peer, _, _ = await router.recv_multipart()
            for seq, payload in batches:
                await asyncio.sleep(gap_s)
                await router.send_multipart([peer, b"", seq.to_bytes(8, "big"), payload])
            await router.send_multipart([peer, b"", REPLAY_END, b""])

    serving = asyncio.create_task(serve())
    try:
        yield address
    finally:
        serving.cancel()
        router.close()


def fleet(**config: str) -> Fleet:
    return Fleet([ReplicaConfig("r0", "http://127.0.0.1:1",
                                kv_events=f"tcp://127.0.0.1:{free_port()}", **config)])


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_hostile_message_is_skipped_and_counted_and_the_next_ones_applied(name: str
                                                                           ) -> None:
    index = KVIndex(16)
    sub = KVEventSubscriber(fleet(), index)
    sub.handle("r0", good(0))
    sub.handle("r0", frames(1, raw=HOSTILE[name]))  # raised out of the reader before
    for seq in range(2, 5):
        sub.handle("r0", good(seq))
    assert sub.malformed == 1
    assert index.last_seq("r0") == 4 and index.num_blocks("r0") == 2  # the same tokens
    assert index.match(TOKENS, ["r0"]) == {"r0": 2}


async def test_a_bad_batch_kept_for_replay_is_skipped_not_replayed_for_ever() -> None:
    # the replay endpoint keeps batches 0-2, the middle one malformed: the catch-up
    # applies the others and goes on following the live stream
    ctx = zmq.asyncio.Context()
    index = KVIndex(16)
    batches = [(0, good(0)[2]), (1, HOSTILE["type_a_list"]), (2, good(2)[2])]
    async with replay_endpoint(ctx, batches) as replay_at:
        sub = KVEventSubscriber(fleet(kv_events_replay=replay_at), index)
        await sub.start()
        try:
            for _ in range(250):
                if index.last_seq("r0") == 2:
                    break
                await asyncio.sleep(0.02)
            assert index.last_seq("r0") == 2 and sub.replays == 1 and sub.malformed == 1
            await sub.receive("r0", good(3), replay_at)  # the live stream carries on
            assert index.last_seq("r0") == 3 and sub.replay_failures == 0
        finally:
            await sub.stop()
    ctx.term()


async def test_a_replay_endpoint_that_is_down_is_not_asked_at_every_gap() -> None:
    down = f"tcp://127.0.0.1:{free_port()}"  # nothing listens
    index = KVIndex(16)
    sub = KVEventSubscriber(fleet(kv_events_replay=down), index)
    sub.replay_timeout_s = 0.2
    sub._ctx = zmq.asyncio.Context()
    try:
        loop = asyncio.get_running_loop()
        started = loop.time()
        for seq in range(0, 20, 2):  # every other message lost
            await sub.receive("r0", good(seq), down)
        took = loop.time() - started
        assert sub.gaps == 9 and sub.replay_failures == 1 and sub.messages == 10
        assert took < 1.0  # one failed replay waited, not nine
        assert index.stats.gaps == 9  # counted as lost
    finally:
        sub._ctx.destroy(linger=0)


async def test_a_batch_of_many_blocks_is_applied_in_slices_as_one() -> None:
    # 20,000 blocks stored in one run (a payload decoded on a thread), then half of them
    # removed in one message (decoded in place): the same index as applying each batch
    # at once, the event loop served between the removal's slices
    n = 20_000
    hashes = tuple(range(1, n + 1))
    tokens = tuple(i % 50_000 for i in range(16 * n))
    stored: tuple[KVEvent, ...] = (BlockStored(hashes, None, tokens, 16),)
    removed: tuple[KVEvent, ...] = (BlockRemoved(hashes[n // 2:]),)
    reference = KVIndex(16)
    reference.apply("r0", 0, stored)
    reference.apply("r0", 1, removed)
    index = KVIndex(16)
    sub = KVEventSubscriber(fleet(), index)
    async with counted_turns() as turns:
        await sub.receive("r0", frames(0, stored), None)
        before = turns.count
        await sub.receive("r0", frames(1, removed), None)  # ~100 KB: no thread, 2 slices
        served = turns.count - before
    assert index._replicas["r0"].keys == reference._replicas["r0"].keys
    assert index.num_blocks("r0") == n // 2 and sub.messages == 2
    assert served >= 1  # the loop ran between the removal's slices
    index.check_integrity()


async def test_a_replayed_batch_of_many_blocks_is_applied_in_slices() -> None:
    # a catch-up replays a removal of 10,000 blocks: applied in slices, the event loop
    # served between them, as a live one is
    n = 20_000
    hashes = tuple(range(1, n + 1))
    stored = frames(0, (BlockStored(hashes, None, tuple(i % 50_000 for i in range(16 * n)),
                                    16),))
    removal = encode_payload(KVEventBatch(0.0, (BlockRemoved(hashes[n // 2:]),), 0))
    ctx = zmq.asyncio.Context()
    index = KVIndex(16)
    sub = KVEventSubscriber(fleet(), index)
    sub._ctx = ctx
    await sub.receive("r0", stored, None)
    slices: list[int] = []  # block hashes of each part applied
    apply = sub._apply

    def counted(replica: str, seq: int, batch: Any, count: bool = True) -> None:
        events = batch.events if isinstance(batch, KVEventBatch) else batch
        slices.append(sum(len(ev.block_hashes) for ev in events
                          if isinstance(ev, BlockStored | BlockRemoved)))
        apply(replica, seq, batch, count)

    sub._apply = counted  # type: ignore[method-assign]
    async with replay_endpoint(ctx, [(1, removal)]) as replay_at:
        await sub._replay("r0", replay_at, 1, None)
    ctx.term()
    assert len(slices) == 2 and sum(slices) == n // 2  # two slices, the loop between
    assert index.num_blocks("r0") == n // 2 and index.last_seq("r0") == 1
    assert sub.replays == 1 and sub.messages == 2
    index.check_integrity()


async def test_a_long_replay_that_keeps_answering_is_not_cut_off() -> None:
    # five batches 0.15 s apart take longer than the replay's 0.4 s timeout, which is
    # for each answer: the replay completes
    ctx = zmq.asyncio.Context()
    index = KVIndex(16)
    sub = KVEventSubscriber(fleet(), index)
    sub._ctx = ctx
    sub.replay_timeout_s = 0.4
    batches = [(seq, good(seq)[2]) for seq in range(5)]
    async with replay_endpoint(ctx, batches, gap_s=0.15) as replay_at:
        assert await sub._replay("r0", replay_at, 0, None) == 4
    ctx.term()
    assert sub.replays == 1 and sub.replay_failures == 0 and index.last_seq("r0") == 4


async def test_a_replay_endpoint_repeating_one_batch_without_end_times_out() -> None:
    # every answer moved the replay's timer on: an endpoint sending the same batch for
    # ever held the replica's reader (the live stream unread) for good
    ctx = zmq.asyncio.Context()
    sub = KVEventSubscriber(fleet(), KVIndex(16))
    sub._ctx = ctx
    sub.replay_timeout_s = 0.3
    batches = [(0, good(0)[2])] * 100_000
    async with replay_endpoint(ctx, batches, gap_s=0.001) as replay_at:
        loop = asyncio.get_running_loop()
        started = loop.time()
        assert await sub._replay("r0", replay_at, 0, None) == 0
        assert loop.time() - started < 3
    ctx.term()
    assert sub.replays == 0 and sub.replay_failures == 1


def test_a_stream_that_names_more_blocks_than_a_replica_holds_is_bounded() -> None:
    index = KVIndex(16)
    index.set_limit("r0", 8)
    for seq in range(3):  # 2 + 2 + 2 blocks: within the limit
        h = 10 * seq
        index.apply("r0", seq, (BlockStored((h, h + 1), None, TOKENS, 16),))
    assert index.num_blocks("r0") == 2  # the same two blocks of tokens each time
    chain = tuple(range(1000, 1010))  # 10 blocks more than the 6 held: past 8
    index.apply("r0", 3, (BlockStored(chain, None, tuple(range(160)), 16),))
    assert index.stats.overflows == 1 and index.num_blocks("r0") == 0
    index.check_integrity()
    with pytest.raises(ValueError, match="blocks must be >= 1"):
        index.set_limit("r0", 0)
