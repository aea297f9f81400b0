"""DNS discovery end to end: a real DNS server on loopback whose records change, a gateway
process that re-resolves them, real engine processes behind, the official OpenAI client in
front. One engine listens on 127.0.0.1 and one on ::1 (the A and the AAAA record of the
same name, on the same port, as a headless Service's pods are)."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml

from gateway.replica_metrics import parse_metrics
from tests.support.fake_dns import FakeDNS
from tests.support.fleets import ADMIN_TOKEN, SIM_ENGINE
from tests.support.processes import Processes
from tests.support.servers import free_port
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow

NAME = "vllm-headless.llm.svc.cluster.local"
ADMIN = {"authorization": f"Bearer {ADMIN_TOKEN}"}


def port_free_on_both() -> int:
    """A port free on 127.0.0.1 and on ::1 alike."""
    while True:
        port = free_port()
        with socket.socket(socket.AF_INET6) as s:
            try:
                s.bind(("::1", port))
            except OSError:
                continue
        return port


def queries(url: str) -> float:
    """Prompt tokens the engine has looked up in its prefix cache: one lookup a request."""
    found = parse_metrics(httpx.get(f"{url}/metrics").text).query_tokens
    assert found is not None
    return found


def test_replicas_follow_the_records(spawn: Processes, tmp_path: Path) -> None:
    dns = FakeDNS().start()
    try:
        run(spawn, tmp_path, dns)
    finally:
        dns.stop()


def run(spawn: Processes, tmp_path: Path, dns: FakeDNS) -> None:
    port = port_free_on_both()
    v4, v6 = f"http://127.0.0.1:{port}", f"http://[::1]:{port}"
    engines = [spawn("engine", *SIM_ENGINE, "--host", host, "--port", str(port))
               for host in ("127.0.0.1", "::1")]
    for proc, url in zip(engines, (v4, v6), strict=True):
        Processes.wait_ready(proc, f"{url}/health", 120, ("engine",))
    dns.set(NAME, ["127.0.0.1"])
    gport, aport = free_port(), free_port()
    config = tmp_path / "gateway.yaml"
    config.write_text(yaml.safe_dump({
        "port": gport, "policy": {"name": "round_robin"},
        "admin": {"token": ADMIN_TOKEN, "port": aport},
        "shutdown": {"grace_s": 0, "timeout_s": 5},
        "health": {"interval_s": 0.3, "timeout_s": 1, "failures_to_eject": 1},
        "scrape": {"interval_s": 0.3},
        "discovery": [{"type": "dns", "name": NAME, "port": port, "interval_s": 0.2,
                       "timeout_s": 1, "nameservers": ["127.0.0.1"],
                       "all_record_types": True,  # single-stack pods of either family
                       "nameserver_port": dns.port}],
    }))
    gateway = f"http://127.0.0.1:{gport}"
    source = f"dns:{NAME}:{port}"
    spawn("serve", "--config", str(config), ready_url=f"{gateway}/ready")
    client = openai.OpenAI(base_url=f"{gateway}/v1", api_key="unused", max_retries=0)

    def members() -> dict[str, dict[str, Any]]:
        got = httpx.get(f"http://127.0.0.1:{aport}/admin/replicas", headers=ADMIN).json()
        return {r["id"]: r for r in got["replicas"]}

    def converges(ids: set[str], what: str) -> dict[str, dict[str, Any]]:
        def found() -> dict[str, dict[str, Any]] | None:
            now = members()
            return now if set(now) == ids else None

        return wait_until(found, 15, what)

    def answered_by(n: int) -> set[str]:
        return {client.completions.with_raw_response.create(
            model="sim-llama", prompt=f"question {i}", max_tokens=2)
            .headers["x-kvgate-replica"] for i in range(n)}

    def failures() -> float:
        for line in httpx.get(f"{gateway}/metrics").text.splitlines():
            if line.startswith(f'kvgate_discovery_failures_total{{source="{source}"}} '):
                return float(line.split()[-1])
        return 0.0

    a, b = f"127.0.0.1:{port}", f"[::1]:{port}"
    found = converges({a}, "the A record's replica")
    assert found[a]["source"] == source and found[a]["url"] == v4
    assert answered_by(3) == {a}

    dns.set(NAME, ["127.0.0.1", "::1"])  # a pod joins: its AAAA record appears
    found = converges({a, b}, "the AAAA record's replica to join")
    assert found[b]["url"] == v6
    assert answered_by(4) == {a, b}

    dns.fail()  # DNS answers SERVFAIL: the fleet stays as it was
    wait_until(lambda: failures() >= 2, 10, "failed lookups to be counted")
    assert set(members()) == {a, b}
    assert answered_by(2) == {a, b}

    dns.recover()
    dns.set(NAME, ["::1"])  # the IPv4 pod goes away
    converges({b}, "the A record's replica to leave")
    before = queries(v4)
    assert answered_by(4) == {b}
    assert queries(v4) == before  # none reached the removed replica
