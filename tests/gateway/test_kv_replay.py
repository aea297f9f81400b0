"""KV events that never arrived are asked for again: a real engine publisher keeps its
recent batches on a replay socket, and the gateway's subscriber fills every gap from it."""

from __future__ import annotations

import asyncio
import random

from engine.kv_event_publisher import KVEventPublisher
from gateway.config import ReplicaConfig
from gateway.fleet import Fleet
from gateway.kv_event_subscriber import KVEventSubscriber
from kvwire.kv_event_format import (
    BlockRemoved,
    BlockStored,
    KVEvent,
    KVEventBatch,
    encode_payload,
)
from policies.kv_index import KVIndex
from tests.support.servers import free_port


def batches(n: int, seed: int = 3) -> list[tuple[KVEvent, ...]]:
    """``n`` steps of an engine: chains of blocks stored, some of them evicted later."""
    rng = random.Random(seed)
    out: list[tuple[KVEvent, ...]] = []
    stored: list[int] = []
    next_hash = 1000
    for _ in range(n):
        events: list[KVEvent] = []
        parent = None
        hashes = []
        for _ in range(rng.randint(1, 3)):
            hashes.append(next_hash)
            next_hash += 1
        tokens = tuple(rng.randrange(500) for _ in range(16 * len(hashes)))
        events.append(BlockStored(tuple(hashes), parent, tokens, 16))
        stored += hashes
        if len(stored) > 6 and rng.random() < 0.5:
            gone = stored.pop(0)
            events.append(BlockRemoved((gone,)))
        out.append(tuple(events))
    return out


def frames(seq: int, events: tuple[KVEvent, ...]) -> list[bytes]:
    return [b"", seq.to_bytes(8, "big"), encode_payload(KVEventBatch(0.0, events, 0))]


def held(index: KVIndex) -> dict[int, int]:
    r = index._replicas["r0"]
    return dict(r.keys)


async def test_a_gap_and_a_late_start_are_filled_from_the_replay_socket() -> None:
    steps = batches(15)
    pub_at, replay_at = (f"tcp://127.0.0.1:{free_port()}" for _ in range(2))
    publisher = KVEventPublisher(pub_at, replay_endpoint=replay_at)
    publisher.start()
    try:
        for events in steps:
            publisher.publish(events)
        for _ in range(500):  # the sending thread keeps each batch as it sends it
            if publisher.sent == len(steps):
                break
            await asyncio.sleep(0.01)
        assert publisher.sent == len(steps)
        reference = KVIndex(16)
        for seq, events in enumerate(steps):
            reference.apply("r0", seq, events)
        assert held(reference)

        fleet = Fleet([ReplicaConfig("r0", "http://127.0.0.1:1", kv_events=pub_at,
                                     kv_events_replay=replay_at)])
        index = KVIndex(16)
        sub = KVEventSubscriber(fleet, index)
        await sub.start()
        for seq, events in enumerate(steps):
            if not 5 <= seq <= 9:  # messages 5-9 lost on the way
                await sub.receive("r0", frames(seq, events), replay_at)
        assert held(index) == held(reference)
        assert (sub.gaps, sub.replays, index.stats.gaps) == (1, 1, 0)

        # a gateway that starts late (or restarted) rebuilds from the first kept batch
        late = KVIndex(16)
        fresh = KVEventSubscriber(fleet, late)
        await fresh.start()
        await fresh.receive("r0", frames(14, steps[14]), replay_at)
        assert held(late) == held(reference) and fresh.replays == 1
        await fresh.stop()
        await sub.stop()

        # without a replay endpoint the gap is counted and the blocks in it stay unknown
        lossy = KVIndex(16)
        plain = KVEventSubscriber(fleet, lossy)
        for seq, events in enumerate(steps):
            if not 5 <= seq <= 9:
                await plain.receive("r0", frames(seq, events), None)
        assert lossy.stats.gaps == 5 and held(lossy) != held(reference)
    finally:
        publisher.stop()
