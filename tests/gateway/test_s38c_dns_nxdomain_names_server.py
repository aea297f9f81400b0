"""A name the DNS source cannot resolve is reported with the server it asked, and that it
asks DNS directly, not ``/etc/hosts`` (``localhost`` is NXDOMAIN to a DNS server)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gateway.discovery.config import DNSSourceConfig
from gateway.discovery.dns_source import DNSLookupFailed, DNSSource
from tests.support.fake_dns import FakeDNS


@pytest.fixture
def dns() -> Iterator[FakeDNS]:
    server = FakeDNS().start()
    yield server
    server.stop()


async def test_nxdomain_names_the_server_asked_and_not_the_hosts_file(dns: FakeDNS) -> None:
    src = DNSSource(DNSSourceConfig(name="localhost", port=8000, nameservers=["127.0.0.1"],
                                    nameserver_port=dns.port, timeout_s=1))
    with pytest.raises(DNSLookupFailed) as failed:
        await src.addresses()
    message = str(failed.value)
    assert "NXDOMAIN" in message and "localhost" in message
    assert f"DNS server 127.0.0.1 port {dns.port} directly" in message, message
    assert "/etc/hosts is not read" in message, message
