"""KV event misconfigurations are told, not silent: an engine whose block size is not the
gateway's (its stored events all dropped) is warned of and counted per replica on
/metrics; two replicas, or two data-parallel ranks, naming one KV event endpoint are
refused with the config (and through the admin API)."""

from __future__ import annotations

import itertools
import logging
import re
from pathlib import Path

import httpx
import pytest
import yaml
import zmq

from gateway.config import ReplicaConfig, load_config
from gateway.fleet import Fleet
from gateway.kv_event_subscriber import KVEventSubscriber
from gateway.metrics import GatewayMetrics
from kvwire.kv_event_format import BlockStored, KVEventBatch, encode_payload
from policies.config import ConfigError
from policies.registry import build_policy
from tests.support.gateway_harness import AUTH, Serve, start_gateway
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


def load(tmp_path: Path, replicas: list[dict[str, object]]) -> None:
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump({"policy": {"name": "kv_events"}, "replicas": replicas}))
    load_config(path)


E0: dict[str, object] = {"id": "r0", "url": "http://127.0.0.1:8101", "kv_events": "tcp://127.0.0.1:5557",
      "kv_events_replay": "tcp://127.0.0.1:5558"}


def test_two_replicas_naming_one_endpoint_are_refused_naming_both(tmp_path: Path) -> None:
    slip = {**E0, "id": "r1", "url": "http://127.0.0.1:8102"}
    with pytest.raises(ConfigError) as raised:
        load(tmp_path, [E0, slip])
    assert str(raised.value) == (
        f"{tmp_path / 'gateway.yaml'}: replicas[1] (r1) kv_events 'tcp://127.0.0.1:5557' is "
        "also replicas[0] (r0)'s kv_events: each replica's engine publishes on endpoints of "
        "its own (two replicas following one would both mirror that engine's cache)")
    # one's publish endpoint another's replay endpoint
    slip = {"id": "r1", "url": "http://127.0.0.1:8102", "kv_events": "tcp://127.0.0.1:5558"}
    with pytest.raises(ConfigError, match=r"replicas\[1\] \(r1\) kv_events "
                       r"'tcp://127.0.0.1:5558' is also replicas\[0\] \(r0\)'s "
                       "kv_events_replay"):
        load(tmp_path, [E0, slip])
    # apart, they load
    load(tmp_path, [E0, {"id": "r1", "url": "http://127.0.0.1:8102",
                         "kv_events": "tcp://127.0.0.1:5567",
                         "kv_events_replay": "tcp://127.0.0.1:5568"}])


def test_data_parallel_ranks_whose_endpoints_meet_are_refused(tmp_path: Path) -> None:
    # rank 1 publishes on 5558, rank 0's replay port
    with pytest.raises(ConfigError) as raised:
        load(tmp_path, [{**E0, "id": "ds", "data_parallel_size": 2}])
    assert str(raised.value) == (
        f"{tmp_path / 'gateway.yaml'}.replicas[0]: rank ds.dp1's kv_events "
        "'tcp://127.0.0.1:5558' is also rank ds.dp0's kv_events_replay: a rank's endpoints "
        "are the configured ports plus its rank, so kv_events and kv_events_replay must be "
        "2 or more ports apart (data_parallel_size 2)")
    # another replica on a rank's port (r1's 5560 is ds.dp3's)
    ds = {**E0, "id": "ds", "data_parallel_size": 4, "kv_events_replay": "tcp://127.0.0.1:5600"}
    with pytest.raises(ConfigError, match=r"replicas\[1\] \(r1\) kv_events "
                       r"'tcp://127.0.0.1:5560' is also replicas\[0\] \(ds.dp3\)'s kv_events"):
        load(tmp_path, [ds, {"id": "r1", "url": "http://127.0.0.1:8102",
                             "kv_events": "tcp://127.0.0.1:5560"}])
    load(tmp_path, [ds])  # docs/replicas.md's example: apart
    with pytest.raises(ConfigError, match=re.escape(
            "kv_events_replay 'tcp://127.0.0.1:5557' is also its kv_events: the engine "
            "publishes and replays on endpoints of their own")):
        load(tmp_path, [{**E0, "kv_events_replay": E0["kv_events"]}])


def test_the_admin_api_refuses_a_replica_whose_ranks_endpoints_meet(serve: Serve) -> None:
    gw = start_gateway(serve, [])
    answer = httpx.post(f"{gw.admin}/admin/replicas", headers=AUTH, json={
        **E0, "id": "ds", "data_parallel_size": 2})
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["code"] == "invalid_replica"
    assert "rank ds.dp1's kv_events 'tcp://127.0.0.1:5558' is also rank ds.dp0's " \
        "kv_events_replay" in error["message"]
    assert httpx.get(f"{gw.admin}/admin/replicas", headers=AUTH).json()["replicas"] == []
