"""A KV event publisher whose socket fails a send: that batch and every later one are
counted as dropped, so ``sent + dropped`` stays the number of batches published."""

from __future__ import annotations

from engine.kv_event_publisher import KVEventPublisher
from kvwire.kv_event_format import BlockRemoved
from tests.support.servers import free_port
from tests.support.waiting import wait_until


def test_batches_lost_to_a_failed_send_are_counted() -> None:
    pub = KVEventPublisher(f"tcp://127.0.0.1:{free_port()}", "kv")
    pub.start()
    try:
        pub.publish([BlockRemoved((1,))])
        wait_until(lambda: pub.sent == 1, 10, "the first batch to be sent")
        # the socket fails under the sender (closed while it waits for the next batch):
        # its next send raises ZMQError
        assert pub._sock is not None
        pub._sock.close()
        for i in range(5):
            pub.publish([BlockRemoved((10 + i,))])
        wait_until(lambda: pub.sent + pub.dropped == 6, 10,
                   "every batch to be sent or counted as dropped")
        assert (pub.sent, pub.dropped) == (1, 5)
    finally:
        pub.stop()
    assert pub._sock is None and pub._ctx is None  # closed at the stop all the same
    assert (pub.sent, pub.dropped) == (1, 5)
