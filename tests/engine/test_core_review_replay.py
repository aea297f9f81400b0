"""The KV event publisher's replay endpoint serves every kept batch to a real DEALER socket,
however many there are and however slowly it reads, as the gateway's catch-up reads them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import zmq

from engine.kv_event_publisher import KVEventPublisher
from kvwire.kv_event_format import REPLAY_END, BlockRemoved
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


def replayed(ctx: zmq.Context[zmq.Socket[bytes]], endpoint: str) -> list[int]:
    """The sequence numbers a replay from 0 brings a reader slower than its sender."""
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.setsockopt(zmq.RCVHWM, 1)  # a reader busy applying what it got: the batches
    dealer.setsockopt(zmq.RCVBUF, 4096)  # wait on the publisher's side
    try:
        dealer.connect(endpoint)
        dealer.send_multipart([b"", (0).to_bytes(8, "big")])
        seqs: list[int] = []
        while True:
            assert dealer.poll(5_000), f"the replay stalled after {len(seqs)} batches"
            frames = dealer.recv_multipart()
            if frames[-2] == REPLAY_END:
                return seqs
            seqs.append(int.from_bytes(frames[-2], "big"))
    finally:
        dealer.close()


def test_a_replay_longer_than_the_sockets_high_water_mark_loses_no_batch(
        pub: KVEventPublisher) -> None:
    assert pub.replay_endpoint is not None
    ctx = zmq.Context()
    try:
        assert replayed(ctx, pub.replay_endpoint) == list(range(KEPT))
        wait_until(lambda: pub.replays == 1, 5, "the replay counted")
    finally:
        ctx.term()


def test_a_reader_leaving_mid_replay_leaves_the_replay_endpoint_serving(
        pub: KVEventPublisher) -> None:
    assert pub.replay_endpoint is not None
    ctx = zmq.Context()
    try:
        gone = ctx.socket(zmq.DEALER)
        gone.setsockopt(zmq.LINGER, 0)
        gone.setsockopt(zmq.RCVHWM, 1)
        gone.connect(pub.replay_endpoint)
        gone.send_multipart([b"", (0).to_bytes(8, "big")])
        assert gone.poll(5_000)  # its replay began
        gone.close()
        assert replayed(ctx, pub.replay_endpoint) == list(range(KEPT))
    finally:
        ctx.term()
