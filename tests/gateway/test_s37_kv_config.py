"""KV event misconfigurations are told, not silent: an engine whose block size is not the
gateway's (its stored events all dropped) is warned of and counted per replica on
/metrics."""

from __future__ import annotations

import itertools
import logging

import pytest
import zmq

from gateway.config import ReplicaConfig
from gateway.fleet import Fleet
from gateway.kv_event_subscriber import KVEventSubscriber
from gateway.metrics import GatewayMetrics
from kvwire.kv_event_format import BlockStored, KVEventBatch, encode_payload
from policies.registry import build_policy
from tests.support.metrics import samples
from tests.support.servers import free_port
from tests.support.waiting import wait_until_async

DROP_REASONS = ("orphans", "keyed_elsewhere", "wrong_block_size", "gaps", "restarts",
                "overflows")


def stored(seq: int, block_size: int) -> list[bytes]:
    """A message storing two blocks of ``block_size`` tokens."""
    h = 1000 + 2 * seq
    ev = BlockStored((h, h + 1), None, tuple(range(2 * block_size)), block_size)
    return [b"", seq.to_bytes(8, "big"), encode_payload(KVEventBatch(0.0, (ev,), 0))]


def drops(page: str, replica: str) -> dict[str, float]:
    found = samples(page)
    return {reason: found[("kvgate_kv_index_drops_total",
                           (("reason", reason), ("replica", replica)))]
            for reason in DROP_REASONS
            if ("kvgate_kv_index_drops_total", (("reason", reason), ("replica", replica)))
            in found}


async def test_an_engine_of_another_block_size_is_warned_of_once_and_counted_per_replica(
        caplog: pytest.LogCaptureFixture) -> None:
    ctx = zmq.Context()
    endpoints = [f"tcp://127.0.0.1:{free_port()}" for _ in range(2)]
    pubs = []
    for endpoint in endpoints:
        pub = ctx.socket(zmq.PUB)
        pub.setsockopt(zmq.LINGER, 0)
        pub.bind(endpoint)
        pubs.append(pub)
    # r2's engine runs --block-size 32; r0's the gateway's 16
    fleet = Fleet([ReplicaConfig("r0", "http://127.0.0.1:1", kv_events=endpoints[0]),
                   ReplicaConfig("r2", "http://127.0.0.1:2", kv_events=endpoints[1])])
    policy = build_policy({"name": "kv_events"})
    sub = KVEventSubscriber.for_policy(fleet, policy)
    assert sub is not None
    sub.reconcile_s = 0.05
    metrics = GatewayMetrics(fleet)
    metrics.watch_kv_events(sub)
    index = sub.index
    caplog.set_level(logging.WARNING, "kvgate.kv_events")
    await sub.start()
    try:
        seq = itertools.count()

        def send() -> None:  # a SUB misses what precedes its joining: resend
            n = next(seq)
            pubs[0].send_multipart(stored(n, 16))
            pubs[1].send_multipart(stored(n, 32))

        def both_seen() -> bool:
            r2 = index.stats_of("r2")
            return index.num_blocks("r0") == 2 and r2 is not None \
                and r2.wrong_block_size >= 3
        await wait_until_async(both_seen, 10, "r0's blocks indexed, r2's dropped thrice",
                               retry=send)
        warned = [r.getMessage() for r in caplog.records
                  if "block" in r.getMessage() and r.name == "kvgate.kv_events"]
        # once per interval, not once per engine step
        assert len(warned) == 1, warned
        assert warned[0].startswith("replica r2: its KV events store blocks of 32 tokens, "
                                    "the gateway's index blocks of 16")
        assert "set policy.block_size to 32" in warned[0]
        assert "--block-size 16" in warned[0]
        page = (await metrics.page()).decode()
        r2 = drops(page, "r2")
        assert set(r2) == set(DROP_REASONS)
        assert r2["wrong_block_size"] >= 3  # each message's stored event
        assert {k: v for k, v in r2.items() if k not in ("wrong_block_size", "gaps")} == \
            dict.fromkeys(set(DROP_REASONS) - {"wrong_block_size", "gaps"}, 0.0)
        assert drops(page, "r0")["wrong_block_size"] == 0.0
        assert index.match(tuple(range(64)), ["r0", "r2"]) == {"r0": 2, "r2": 0}
        fleet.remove("r2")  # its series go with it
        await wait_until_async(lambda: index.stats_of("r2") is None, 10, "r2 forgotten")
        page = (await metrics.page()).decode()
        assert drops(page, "r2") == {} and set(drops(page, "r0")) == set(DROP_REASONS)
    finally:
        await sub.stop()
        for pub in pubs:
            pub.close()
        ctx.term()


def test_the_cost_policy_names_its_own_block_size_key() -> None:
    fleet = Fleet([ReplicaConfig("r0", "http://127.0.0.1:1", kv_events="tcp://127.0.0.1:9")])
    sub = KVEventSubscriber.for_policy(fleet, build_policy({"name": "cost"}))
    assert sub is not None and sub.block_size_key == "policy.kv_block_size"
