"""A KV event message over the size limit: ZMQ drops the connection and never connects to
that publisher again; the subscriber reconnects, and the stream's later messages reach the
index. Real PUB and SUB sockets on loopback."""

from __future__ import annotations

import contextlib
import itertools
import logging
from collections.abc import AsyncIterator
from typing import NamedTuple

import pytest
import zmq

from gateway.config import ReplicaConfig
from gateway.fleet import Fleet
from gateway.kv_event_subscriber import MAX_MESSAGE_BYTES, KVEventSubscriber
from kvwire.kv_event_format import BlockStored, KVEventBatch, encode_payload
from policies.kv_index import KVIndex
from tests.support.servers import free_port
from tests.support.waiting import wait_until_async

BLOCK = 16


def tokens(doc: int) -> tuple[int, ...]:
    """Two blocks' tokens of their own for document ``doc``."""
    return tuple(range(1000 * doc, 1000 * doc + 2 * BLOCK))


def message(seq: int, doc: int) -> list[bytes]:
    """Batch ``seq``: document ``doc``'s two blocks stored."""
    ev = BlockStored((10 * doc, 10 * doc + 1), None, tokens(doc), BLOCK)
    return [b"", seq.to_bytes(8, "big"), encode_payload(KVEventBatch(0.0, (ev,), 0))]


class Publishing(NamedTuple):
    ctx: zmq.Context[zmq.Socket[bytes]]
    index: KVIndex
    sub: KVEventSubscriber
    endpoint: str
    pub: zmq.Socket[bytes]


@contextlib.asynccontextmanager
async def publishing() -> AsyncIterator[Publishing]:
    """A PUB socket bound on loopback and a started subscriber following r0 on it."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.bind(endpoint)
    index = KVIndex(BLOCK)
    sub = KVEventSubscriber(Fleet([ReplicaConfig("r0", "http://127.0.0.1:1",
                                                 kv_events=endpoint)]),
                            index, reconcile_s=0.05)
    await sub.start()
    try:
        yield Publishing(ctx, index, sub, endpoint, pub)
    finally:
        await sub.stop()
        pub.close()
        ctx.term()


def bound(sock: zmq.Socket[bytes], endpoint: str) -> bool:
    """Whether ``sock`` is bound to ``endpoint`` now (False: the port is still taken)."""
    try:
        sock.bind(endpoint)
    except zmq.ZMQError as exc:
        if exc.errno != zmq.EADDRINUSE:
            raise
        return False
    return True


def holds(index: KVIndex, doc: int) -> bool:
    return index.match(tokens(doc), ["r0"]) == {"r0": 2}


async def test_an_oversized_message_drops_the_connection_and_the_feed_recovers(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "kvgate.kv_events")
    async with publishing() as (_, index, sub, _, pub):
        seq = itertools.count()
        # a SUB misses what precedes its joining: resent until it has joined
        await wait_until_async(lambda: holds(index, 1), 10, "the first document",
                               retry=lambda: pub.send_multipart(message(next(seq), 1)))
        pub.send_multipart(message(next(seq), 2))
        pub.send_multipart(message(next(seq), 3))
        oversized = next(seq)
        pub.send_multipart([b"", oversized.to_bytes(8, "big"),
                              b"\x00" * (MAX_MESSAGE_BYTES + 1)])
        await wait_until_async(lambda: sub.malformed, 10, "the dropped connection counted")
        # the messages queued before the drop were read first
        assert holds(index, 2) and holds(index, 3)
        assert index.last_seq("r0") == oversized - 1
        # the new socket joins late too: resent until it has
        await wait_until_async(lambda: holds(index, 4), 10,
                               "the document sent after the oversized message",
                               retry=lambda: pub.send_multipart(message(next(seq), 4)))
        last = index.last_seq("r0")
        assert last is not None and last > oversized
        # no replay endpoint: the oversized message's number (at least) was a gap, counted
        assert sub.gaps >= 1 and index.stats.gaps >= last - oversized
        assert sub.malformed == 1 and sub.messages >= 4
        index.check_integrity()
    warned = [r.getMessage() for r in caplog.records if "dropped its KV event" in r.getMessage()]
    assert len(warned) == 1
    assert "replica r0" in warned[0] and f"{MAX_MESSAGE_BYTES}-byte limit" in warned[0]


async def test_a_publisher_that_restarts_is_reconnected_by_zmq_not_counted() -> None:
    async with publishing() as (ctx, index, sub, endpoint, pub):
        seq = itertools.count()
        await wait_until_async(lambda: holds(index, 1), 10, "the first document",
                               retry=lambda: pub.send_multipart(message(next(seq), 1)))
        # the engine's process restarts: its socket closes, a new one binds the endpoint
        pub.close()
        fresh = ctx.socket(zmq.PUB)
        fresh.setsockopt(zmq.LINGER, 0)
        try:
            # the old socket's port is let go by ZMQ's I/O thread, soon after close()
            await wait_until_async(lambda: bound(fresh, endpoint), 10, "the port let go")
            await wait_until_async(lambda: holds(index, 2), 10, "the restarted publisher's",
                                   retry=lambda: fresh.send_multipart(message(next(seq), 2)))
        finally:
            fresh.close()
        # a network error: libzmq connected again itself, nothing dropped for good
        assert sub.malformed == 0
