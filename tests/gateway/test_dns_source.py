"""The DNS source against a real DNS server on loopback: records, failures, and the last
good set kept through a failure."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from gateway.discovery.config import DNSSourceConfig
from gateway.discovery.dns_source import DNSLookupFailed, DNSSource
from gateway.discovery.targets import Targets
from tests.support.fake_dns import FakeDNS
from tests.support.waiting import wait_until_async


@pytest.fixture
def dns() -> Iterator[FakeDNS]:
    server = FakeDNS().start()
    yield server
    server.stop()


def source(dns: FakeDNS, name: str = "vllm.llm.svc", **extra: object) -> DNSSource:
    return DNSSource(DNSSourceConfig(name=name, port=8000, nameservers=["127.0.0.1"],
                                     nameserver_port=dns.port, timeout_s=1,
                                     **extra))  # type: ignore[arg-type]


async def test_a_records_else_aaaa_records(dns: FakeDNS) -> None:
    # dual-stack pods have one record of each family: taking both counted each engine
    # twice, splitting its traffic, load and cache placement in two
    dns.set("vllm.llm.svc", ["10.0.0.1", "10.0.0.2", "fd00::1", "fd00::2"])
    assert sorted(await source(dns).addresses()) == ["10.0.0.1", "10.0.0.2"]
    v6_first = source(dns, record_types=["AAAA", "A"])
    assert sorted(await v6_first.addresses()) == ["fd00::1", "fd00::2"]
    every = source(dns, all_record_types=True)  # single-stack pods of either family
    assert len(await every.addresses()) == 4
    dns.set("v6.llm.svc", ["fd00::3"])  # an IPv6-only fleet: its AAAA records
    assert await source(dns, name="v6.llm.svc").addresses() == ["fd00::3"]


async def test_failures_name_the_lookup(dns: FakeDNS) -> None:
    with pytest.raises(DNSLookupFailed, match="NXDOMAIN"):
        await source(dns, name="missing.llm.svc").addresses()
    dns.set("empty.llm.svc", [])
    with pytest.raises(DNSLookupFailed, match="has no A/AAAA record"):
        await source(dns, name="empty.llm.svc").addresses()
    dns.set("vllm.llm.svc", ["10.0.0.1"])
    dns.fail()
    with pytest.raises(DNSLookupFailed, match=r"A vllm\.llm\.svc: "):
        await source(dns).addresses()


async def test_a_failure_keeps_the_last_set(dns: FakeDNS) -> None:
    dns.set("vllm.llm.svc", ["10.0.0.1"])
    published: list[Targets] = []

    async def publish(targets: Targets) -> None:
        published.append(targets)

    src = source(dns, interval_s=0.05)
    task = asyncio.create_task(src.run(publish))
    try:
        await wait_until_async(lambda: published, 5, "a first set")
        dns.fail()
        failures = src.stats.failures
        await wait_until_async(lambda: src.stats.failures >= failures + 2, 5, "failures")
        assert src.stats.replicas == 1 and src.stats.last_error is not None
        assert all(list(p) == ["10.0.0.1:8000"] for p in published)  # never an empty set
        dns.recover()
        dns.set("vllm.llm.svc", ["10.0.0.1", "10.0.0.2"])
        await wait_until_async(lambda: len(published[-1]) == 2, 5, "the new set")
        assert src.stats.last_error is None
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
