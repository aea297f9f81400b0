"""A reader of a KV event publisher's replay endpoint, as the gateway's catch-up reads it:
a DEALER socket asking for every kept batch from sequence number 0."""

from __future__ import annotations

import zmq

from kvwire.kv_event_format import REPLAY_END


def replayed_seqs(ctx: zmq.Context[zmq.Socket[bytes]], endpoint: str, *,
                  slow: bool = False) -> list[int]:
    """The sequence numbers a replay from 0 brings, in the order they came; ``slow``: read
    by a reader slower than its sender (one message queued on its side, a small socket
    buffer), so the batches wait on the publisher's side."""
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    if slow:
        dealer.setsockopt(zmq.RCVHWM, 1)
        dealer.setsockopt(zmq.RCVBUF, 4096)
    try:
        dealer.connect(endpoint)
        dealer.send_multipart([b"", (0).to_bytes(8, "big")])
        seqs: list[int] = []
        while True:
            assert dealer.poll(10_000), f"the replay stalled after {len(seqs)} batches"
            frames = dealer.recv_multipart()  # [b"", seq, payload]
            if frames[-2] == REPLAY_END:
                return seqs
            seqs.append(int.from_bytes(frames[-2], "big"))
    finally:
        dealer.close()
