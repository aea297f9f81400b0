"""A replica a discovery source finds joins only when it passes the checks a configured one
passes (its id, URL and ranks) and has an address a replica can have: an odd pod name, a
host that is no IP address, or a DNS answer of 0.0.0.0, a broadcast or a multicast address
is left out, warned of once (a control character shown escaped, never as a raw log line),
and counted, while the good replicas of the same answer join."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from gateway.admin import create_admin_app
from gateway.app import create_app
from gateway.config import parse_config
from gateway.discovery.config import DNSSourceConfig
from gateway.discovery.dns_source import DNSSource
from gateway.discovery.runner import Discovery
from gateway.state import build_state
from tests.support.fake_dns import FakeDNS
from tests.support.fake_kube_api import FakeKubeAPI, endpoint, endpoint_slice, kubeconfig
from tests.support.fake_replica import Behaviour, fake_replica
from tests.support.servers import ThreadServer
from tests.support.waiting import wait_until, wait_until_async

Serve = Callable[..., ThreadServer]
ADMIN = {"authorization": "Bearer admin-token-0123456789"}
FORGED = "evil\n2026-01-01 00:00:00,000 CRITICAL kvgate: forged"
NAME = "vllm.llm.svc"


def refusals(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "kvgate.membership" and "not added" in r.getMessage()]


@pytest.fixture
def dns() -> Iterator[FakeDNS]:
    server = FakeDNS().start()
    yield server
    server.stop()


def test_kubernetes_endpoints_no_replica_may_be_are_left_out_and_said_once(
        serve: Serve, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="kvgate.membership")
    api = FakeKubeAPI()
    api_server = serve(api.app())
    good = {name: serve(fake_replica(Behaviour(name))) for name in ("vllm-a", "vllm-b")}
    port = good["vllm-a"].port
    bad = [endpoint("127.0.0.1", "bad/name"), endpoint("127.0.0.2", FORGED),
           endpoint("127.0.0.3", "x" * 300), endpoint("127.0.0.4", "pp.dp0"),
           endpoint("not-an-ip", "q1"), endpoint("0.0.0.0", "zero"),
           endpoint("255.255.255.255", "all"), endpoint("224.0.0.1", "group")]
    api.put(endpoint_slice("llm", "s1", "vllm", port, [*bad, endpoint("127.0.0.1", "vllm-a")]))
    path = tmp_path / "kubeconfig.yaml"
    path.write_text(yaml.safe_dump(kubeconfig(api_server.url, namespace="llm")))
    config = parse_config({
        "policy": {"name": "round_robin"},
        "health": {"interval_s": 0.2, "timeout_s": 0.5},
        "scrape": {"enabled": False},
        "admin": {"token": ADMIN["authorization"][7:]},
        "discovery": [{"type": "kubernetes", "kubeconfig": str(path), "service": "vllm",
                       "port_name": "http", "retry_s": 0.05, "resync_s": 3600}],
    })
    state = build_state(config)
    gateway = serve(create_app(config, state), side=create_admin_app(state))

    def members() -> set[str]:
        listed = httpx.get(f"{gateway.side_url}/admin/replicas", headers=ADMIN).json()
        return {r["id"] for r in listed["replicas"]}

    # the good endpoint and the bad ones come in one answer, applied in one pass
    wait_until(lambda: "vllm-a" in members(), 10, "vllm-a to join")
    assert members() == {"vllm-a"}
    said = refusals(caplog)
    assert len(said) == len(bad), said
    assert all("\n" not in line for line in said), said
    assert any(repr(FORGED) in line for line in said), said
    assert any("'http://not-an-ip:" in line and "not an IP address" in line for line in said)
    assert any("0.0.0.0 is the unspecified address" in line for line in said), said
    assert any("255.255.255.255 is the broadcast address" in line for line in said), said
    assert any("224.0.0.1 is a multicast address" in line for line in said), said
    page = httpx.get(f"{gateway.url}/metrics").text
    assert any(line.startswith("kvgate_discovery_refused_total{") and line.endswith(" 8.0")
               for line in page.splitlines()), \
        [line for line in page.splitlines() if "discovery" in line]

    # a full list again (its old version forgotten: 410 Gone), then a watch event: the
    # same bad entries, made anew, are not said again; a new good one joins
    lists = len(api.list_requests())
    wait_until(api.watching, 10, "a watch")
    api.bookmark()  # the watch got an event: its end is no short watch (a failure)
    api.put(endpoint_slice("llm", "other", "other", port, []))  # another Service's
    api.compact()
    api.end_watches()
    wait_until(lambda: len(api.list_requests()) > lists, 10, "a list again")
    api.put(endpoint_slice("llm", "s2", "vllm", good["vllm-b"].port,
                           [endpoint("127.0.0.1", "vllm-b")]))
    wait_until(lambda: members() == {"vllm-a", "vllm-b"}, 10, "vllm-b to join")
    assert refusals(caplog) == said


async def test_dns_answers_no_replica_may_have_are_left_out_and_counted_once(
        dns: FakeDNS, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="kvgate.membership")
    odd = ["0.0.0.0", "255.255.255.255", "224.0.0.1", "::", "ff02::1", "::ffff:0:0"]
    dns.set(NAME, [*odd, "10.0.0.1"])
    source = DNSSource(DNSSourceConfig(name=NAME, port=8000, nameservers=["127.0.0.1"],
                                       nameserver_port=dns.port, timeout_s=1,
                                       interval_s=0.02, all_record_types=True))
    gw = build_state(parse_config({"replicas": []}))
    discovery = Discovery(gw, [source])

    def fleet() -> set[str]:
        return {s.id for s in gw.fleet}

    await discovery.start()
    try:
        await wait_until_async(lambda: source.stats.syncs >= 5, 10, "five answers")
        assert fleet() == {"10.0.0.1:8000"}
        assert source.stats.refused == len(odd)
        said = refusals(caplog)
        assert len(said) == len(odd), said
        for address in ("0.0.0.0", "[::]", "[::ffff:0.0.0.0]"):
            assert any(f"replica {address}:8000 not added" in line
                       and "the unspecified address" in line for line in said), said
        assert any("replica [ff02::1]:8000 not added" in line
                   and "multicast" in line for line in said), said

        # a new good address joins; the odd ones still answered are not counted again
        dns.set(NAME, [*odd, "10.0.0.1", "10.0.0.2"])
        await wait_until_async(lambda: "10.0.0.2:8000" in fleet(), 10, "10.0.0.2 to join")
        syncs = source.stats.syncs
        await wait_until_async(lambda: source.stats.syncs >= syncs + 3, 10, "more answers")
        assert fleet() == {"10.0.0.1:8000", "10.0.0.2:8000"}
        assert source.stats.refused == len(odd) and refusals(caplog) == said
    finally:
        await discovery.stop()
