"""The gateway's KV event subscriber: real PUB sockets, the subscriber in its own loop."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import AsyncIterator
from typing import NamedTuple

import pytest
import zmq

from gateway.config import ReplicaConfig
from gateway.fleet import Fleet
from gateway.kv_event_subscriber import KVEventSubscriber
from kvwire.kv_event_format import BlockStored, KVEventBatch, encode_payload
from policies.kv_index import KVIndex
from tests.support.servers import free_port
from tests.support.waiting import wait_until_async

TOKENS = tuple(range(32))


def message(seq: int, first_hash: int) -> list[bytes]:
    ev = BlockStored((first_hash, first_hash + 1), None, TOKENS, 16)
    return [b"", seq.to_bytes(8, "big"), encode_payload(KVEventBatch(0.0, (ev,), 0))]


class Following(NamedTuple):
    """A running subscriber over a fleet whose r0 publishes at ``endpoints[0]``."""

    fleet: Fleet
    index: KVIndex
    sub: KVEventSubscriber
    endpoints: list[str]
    pubs: list[zmq.Socket]


@contextlib.asynccontextmanager
async def following(n: int) -> AsyncIterator[Following]:
    """``n`` PUB sockets bound on loopback and a started subscriber following r0 on the
    first; everything stopped and closed on the way out."""
    ctx = zmq.Context()
    endpoints = [f"tcp://127.0.0.1:{free_port()}" for _ in range(n)]
    pubs = []
    for endpoint in endpoints:
        pub = ctx.socket(zmq.PUB)
        pub.setsockopt(zmq.LINGER, 0)
        pub.bind(endpoint)
        pubs.append(pub)
    fleet = Fleet([ReplicaConfig("r0", "http://127.0.0.1:1", kv_events=endpoints[0])])
    index = KVIndex(16)
    sub = KVEventSubscriber(fleet, index, reconcile_s=0.05)
    await sub.start()
    try:
        yield Following(fleet, index, sub, endpoints, pubs)
    finally:
        await sub.stop()
        for pub in pubs:
            pub.close()
        ctx.term()


def test_malformed_messages_are_skipped_and_removed_replicas_ignored() -> None:
    fleet = Fleet([ReplicaConfig("r0", "http://127.0.0.1:1", kv_events="tcp://127.0.0.1:1")])
    index = KVIndex(16)
    sub = KVEventSubscriber(fleet, index)
    sub.handle("r0", [b"", b"\x00", b""])  # short seq frame
    sub.handle("r0", [b"", (0).to_bytes(8, "big"), b"\xc1"])  # not msgpack
    assert sub.malformed == 2 and index.num_blocks("r0") == 0
    sub.handle("r0", message(0, 10))
    assert sub.messages == 1 and index.match(TOKENS, ["r0"]) == {"r0": 2}
    fleet.remove("r0")
    sub.handle("r0", message(1, 20))
    assert sub.messages == 1


async def test_follows_the_fleet_and_reads_each_replicas_socket() -> None:
    async with following(2) as (fleet, index, sub, endpoints, pubs):
        fleet.add(ReplicaConfig("r1", "http://127.0.0.1:2", kv_events=endpoints[1]))
        seq = itertools.count()

        def send() -> None:  # a SUB misses what precedes its joining: resend
            n = next(seq)
            for i, pub in enumerate(pubs):
                pub.send_multipart(message(n, 100 * i))

        await wait_until_async(
            lambda: index.match(TOKENS, ["r0", "r1"]) == {"r0": 2, "r1": 2}, 10,
            "both replicas' blocks in the index", retry=send)
        # r1 joined after start: read from its own socket, its blocks under its own id
        assert index.num_blocks("r0") == index.num_blocks("r1") == 2
        assert sub.messages >= 2 and sub.malformed == 0
        fleet.remove("r1")  # the reconcile loop unsubscribes and forgets it
        await wait_until_async(lambda: not index.num_blocks("r1"), 10, "r1 to be forgotten")
        assert index.match(TOKENS, ["r0", "r1"]) == {"r0": 2, "r1": 0}
        assert index.num_blocks("r0") == 2


async def test_a_failing_reader_does_not_stop_the_others(
        caplog: pytest.LogCaptureFixture) -> None:
    ctx = zmq.Context()
    good = f"tcp://127.0.0.1:{free_port()}"
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.bind(good)
    # "tcp://no-such-host" cannot be connected to: its reader fails at once
    fleet = Fleet([ReplicaConfig("bad", "http://127.0.0.1:1", kv_events="tcp://no such host")])
    index = KVIndex(16)
    sub = KVEventSubscriber(fleet, index, reconcile_s=0.05)
    await sub.start()
    try:
        def failures() -> int:
            return sum("replica bad: KV event reader failed" in r.getMessage()
                       for r in caplog.records)

        # each reconcile round logs the failed reader and starts it again
        await wait_until_async(lambda: failures() >= 2, 10,
                               "reconcile rounds to meet the failed reader twice")
        fleet.add(ReplicaConfig("good", "http://127.0.0.1:2", kv_events=good))
        seq = itertools.count()
        await wait_until_async(lambda: index.match(TOKENS, ["good"]) == {"good": 2}, 10,
                               "the good replica's blocks in the index",
                               retry=lambda: pub.send_multipart(message(next(seq), 1)))
        assert index.num_blocks("good") == 2 and index.num_blocks("bad") == 0
        assert sub.messages >= 1 and sub.malformed == 0
    finally:
        await sub.stop()  # must not raise the failed reader's error
        pub.close()
        ctx.term()
    assert failures() >= 2


async def test_a_replica_that_moves_to_another_endpoint_starts_afresh_there() -> None:
    async with following(2) as (fleet, index, _, endpoints, pubs):
        old = itertools.count()
        await wait_until_async(lambda: index.num_blocks("r0") == 2, 10, "the first engine's",
                               retry=lambda: pubs[0].send_multipart(message(next(old), 10)))
        # the same replica id, now another engine process, well into its own numbering
        fleet.remove("r0")
        fleet.add(ReplicaConfig("r0", "http://127.0.0.1:2", kv_events=endpoints[1]))
        await wait_until_async(lambda: not index.tracks("r0"), 10,
                               "the moved replica's blocks to be forgotten")
        new = itertools.count(1000)
        await wait_until_async(lambda: index.num_blocks("r0") == 2, 10, "the new engine's",
                               retry=lambda: pubs[1].send_multipart(message(next(new), 50)))
        assert index.last_seq("r0") is not None and index.last_seq("r0") >= 1000
        assert index.stats.gaps == 0  # numbered from its own start, not the old engine's
        assert index.match(TOKENS, ["r0"]) == {"r0": 2}
