"""A KV event endpoint is followed for one replica only: one that joins the fleet naming
the endpoint another replica is followed on (as discovery may add: two pods annotated
alike, or one engine found by two sources) is not followed, and is warned of once; once
the holder leaves, it is followed. Its index never mirrors the other engine's cache."""

from __future__ import annotations

import itertools
import logging

import pytest
import zmq

from gateway.config import ReplicaConfig
from gateway.fleet import Fleet
from gateway.kv_event_subscriber import KVEventSubscriber
from kvwire.kv_event_format import BlockStored, KVEventBatch, encode_payload
from policies.registry import build_policy
from tests.support.servers import free_port
from tests.support.waiting import wait_until_async


def stored(seq: int) -> list[bytes]:
    """A message storing two blocks of 16 tokens, of hashes new at each ``seq``."""
    h = 1000 + 2 * seq
    ev = BlockStored((h, h + 1), None, tuple(range(32)), 16)
    return [b"", seq.to_bytes(8, "big"), encode_payload(KVEventBatch(0.0, (ev,), 0))]


async def test_a_newcomer_naming_a_followed_endpoint_is_not_followed_until_it_is_free(
        caplog: pytest.LogCaptureFixture) -> None:
    ctx = zmq.Context()
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.bind(endpoint)
    fleet = Fleet([ReplicaConfig("pod-a", "http://127.0.0.1:1", kv_events=endpoint)])
    sub = KVEventSubscriber.for_policy(fleet, build_policy({"name": "kv_events"}))
    assert sub is not None
    sub.reconcile_s = 0.05
    index = sub.index
    caplog.set_level(logging.WARNING, "kvgate.kv_events")
    await sub.start()
    seq = itertools.count()

    def send() -> None:  # a SUB misses what precedes its joining: resend
        pub.send_multipart(stored(next(seq)))

    try:
        await wait_until_async(lambda: index.num_blocks("pod-a") > 0, 10,
                               "pod-a's blocks indexed", retry=send)
        # joins later: pod-a, followed on the endpoint already, keeps it
        fleet.add(ReplicaConfig("a-copy", "http://127.0.0.1:2", kv_events=endpoint))
        await wait_until_async(lambda: any("a-copy" in r.getMessage() for r in caplog.records),
                               10, "a-copy warned of")
        before = index.last_seq("pod-a") or 0
        await wait_until_async(lambda: (index.last_seq("pod-a") or 0) >= before + 2, 10,
                               "more of pod-a's messages applied", retry=send)
        assert index.num_blocks("a-copy") == 0 and index.last_seq("a-copy") is None
        warned = [r.getMessage() for r in caplog.records if "a-copy" in r.getMessage()]
        assert warned == [
            f"replica a-copy: its KV event endpoint {endpoint} is also replica pod-a's: not "
            "followed (each replica's engine publishes on endpoints of its own); its cache "
            "is not matched until the endpoint is free"]
        fleet.remove("pod-a")
        await wait_until_async(lambda: index.num_blocks("a-copy") > 0, 10,
                               "a-copy followed once pod-a left", retry=send)
        assert index.num_blocks("pod-a") == 0
    finally:
        await sub.stop()
        pub.close()
        ctx.term()
