"""KV event batches the engine loses itself are counted and exported: past
``max_queued_batches`` waiting for the sender a batch is dropped (a PUB socket drops past
its high-water mark without telling, so that is where a loss can be counted), shown on the
served engine's /metrics, and its sequence number is never sent: the replay endpoint's
batches jump over it, as a subscriber sees."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import zmq

from engine.kv_event_publisher import KVEventPublisher
from kvwire.kv_event_format import BlockRemoved
from tests.support.engine_servers import LiveEngine, serve_engine
from tests.support.kv_replay import replayed_seqs
from tests.support.metrics import samples
from tests.support.servers import free_port
from tests.support.waiting import wait_until

MODEL = "tiny"
BATCHES = 20


@pytest.fixture
def live() -> Iterator[LiveEngine]:
    publisher = KVEventPublisher(f"tcp://127.0.0.1:{free_port()}", "kv",
                                 replay_endpoint=f"tcp://127.0.0.1:{free_port()}",
                                 max_queued_batches=1)
    yield from serve_engine(LiveEngine, MODEL, server_kw={"kv_events": publisher})


def test_batches_past_the_queue_bound_are_dropped_counted_and_leave_a_gap(
        live: LiveEngine) -> None:
    pub = live.server.kv_events
    assert pub is not None and pub.replay_endpoint is not None
    # no request runs, so the engine loop publishes nothing meanwhile; each batch takes
    # the sender milliseconds to encode, and these are queued within far less
    big = [BlockRemoved(tuple(range(k, k + 20_000))) for k in range(5)]
    for _ in range(BATCHES):
        pub.publish(big)
    wait_until(lambda: pub.sent + pub.dropped == BATCHES, 20, "every batch sent or dropped")
    assert 0 < pub.dropped < BATCHES
    metrics = samples(live.http.get("/metrics").text)
    dropped = metrics[("kvgate:engine_kv_events_dropped_total",
                       (("engine", "0"), ("model_name", MODEL)))]
    assert dropped == pub.dropped
    with zmq.Context() as ctx:
        seqs = replayed_seqs(ctx, pub.replay_endpoint)
    assert len(seqs) == pub.sent and seqs == sorted(seqs) and seqs[0] == 0
    assert set(seqs) < set(range(BATCHES))  # the dropped ones' numbers: never sent
