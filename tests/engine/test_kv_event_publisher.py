"""The KV event publisher on a real PUB socket, read by a plain SUB socket."""

from __future__ import annotations

import msgpack
import pytest
import zmq

from engine.kv_event_publisher import KVEventPublisher
from kvwire.kv_event_format import ENCODINGS, AllBlocksCleared, BlockRemoved, decode_payload
from tests.support.servers import free_port
from tests.support.waiting import wait_until


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_frames_sequence_numbers_and_payload(encoding: str) -> None:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    pub = KVEventPublisher(endpoint, "kv", encoding=encoding)
    pub.publish([BlockRemoved((1,))])  # before start: nothing to send it on, dropped
    pub.start()
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"kv")
    sub.connect(endpoint)
    try:
        # a SUB socket misses what is sent before it has joined: send until one arrives
        wait_until(lambda: sub.poll(0), 10, "a KV event message",
                   retry=lambda: pub.publish([AllBlocksCleared()]), retry_every_s=0.05)
        topic, seq, _payload = sub.recv_multipart()
        assert topic == b"kv" and len(seq) == 8
        first = int.from_bytes(seq, "big")
        pub.publish([])  # an empty step sends nothing
        pub.publish([BlockRemoved((7, 8))])
        seqs = [first]
        while True:  # skip the probes still in flight
            frames = sub.recv_multipart()
            seqs.append(int.from_bytes(frames[1], "big"))
            batch = decode_payload(frames[2])
            if batch.events != (AllBlocksCleared(),):
                break
        assert batch.events == (BlockRemoved((7, 8)),) and batch.data_parallel_rank == 0
        assert seqs == list(range(first, first + len(seqs)))  # one number per message
        # each event as a tagged array, or as a map with its "type" (vLLM's router reads that)
        event = msgpack.unpackb(frames[2])[1][0]
        assert event == (["BlockRemoved", [7, 8], "GPU"] if encoding == "array"
                         else {"type": "BlockRemoved", "block_hashes": [7, 8], "medium": "GPU"})
    finally:
        sub.close()
        ctx.term()
        pub.stop()


def test_an_unknown_encoding_is_refused() -> None:
    with pytest.raises(ValueError, match="'json'"):
        KVEventPublisher("tcp://127.0.0.1:1", encoding="json")


def test_a_backlog_not_sent_by_the_stop_timeout_is_dropped_and_counted() -> None:
    pub = KVEventPublisher(f"tcp://127.0.0.1:{free_port()}", "kv", high_water_mark=10**6)
    pub.start()
    big = [BlockRemoved(tuple(range(k, k + 20_000))) for k in range(5)]
    batches = 300  # seconds of encoding at the least
    for _ in range(batches):
        pub.publish(big)
    pub.stop(timeout=0.05)
    # stopped at its next batch, then its socket closed here, never under it
    assert pub.sent + pub.dropped == batches
    assert pub.dropped > 0 and pub._sock is None
