"""The KV event publisher's replay endpoint serves every kept batch to a real DEALER socket,
however many there are and however slowly it reads, as the gateway's catch-up reads them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import zmq

from engine.kv_event_publisher import KVEventPublisher
from kvwire.kv_event_format import BlockRemoved
from tests.support.kv_replay import replayed_seqs
from tests.support.servers import free_port
from tests.support.waiting import wait_until

KEPT = 2_000  # past ZMQ's default high-water mark of 1,000 messages


@pytest.fixture
def pub() -> Iterator[KVEventPublisher]:
    pub = KVEventPublisher(f"tcp://127.0.0.1:{free_port()}", "kv",
                           replay_endpoint=f"tcp://127.0.0.1:{free_port()}",
                           replay_buffer=KEPT)
    pub.start()
    try:
        event = BlockRemoved(tuple(range(1 << 40, (1 << 40) + 500)))  # ~4.5 KB a batch
        for _ in range(KEPT):
            pub.publish([event])
        wait_until(lambda: pub.sent == KEPT, 10, "the batches sent")
        yield pub
    finally:
        pub.stop()


@pytest.fixture
def ctx() -> Iterator[zmq.Context[zmq.Socket[bytes]]]:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    try:
        yield ctx
    finally:
        ctx.term()


def test_a_replay_longer_than_the_sockets_high_water_mark_loses_no_batch(
        pub: KVEventPublisher, ctx: zmq.Context[zmq.Socket[bytes]]) -> None:
    assert pub.replay_endpoint is not None
    assert replayed_seqs(ctx, pub.replay_endpoint, slow=True) == list(range(KEPT))
    wait_until(lambda: pub.replays == 1, 5, "the replay counted")


def test_a_reader_leaving_mid_replay_leaves_the_replay_endpoint_serving(
        pub: KVEventPublisher, ctx: zmq.Context[zmq.Socket[bytes]]) -> None:
    assert pub.replay_endpoint is not None
    gone = ctx.socket(zmq.DEALER)
    gone.setsockopt(zmq.LINGER, 0)
    gone.setsockopt(zmq.RCVHWM, 1)
    gone.connect(pub.replay_endpoint)
    gone.send_multipart([b"", (0).to_bytes(8, "big")])
    assert gone.poll(5_000)  # its replay began
    gone.close()
    assert replayed_seqs(ctx, pub.replay_endpoint, slow=True) == list(range(KEPT))
