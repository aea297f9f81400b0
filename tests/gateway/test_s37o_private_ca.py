"""``https`` replicas signed by a private CA: ``tls: {ca_file}`` names its certificate,
checked at load, and the gateway's upstream client and its health checks trust it beside
the system's CAs; without it a replica's certificate fails, and the failure names the key
that fixes it. Real TLS: openssl makes a CA and a replica certificate signed by it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from gateway.config import HealthConfig, ScrapeConfig, parse_config
from gateway.fleet import Fleet
from gateway.monitor import Monitor
from gateway.upstream_http import UpstreamUnreachable, client_for, replica_tls
from policies.config import ConfigError
from tests.support.private_ca import Certs, https_replica, make_certs


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("s37o_ca"))


@pytest.fixture
async def replica(certs: Certs) -> AsyncIterator[str]:
    """An https replica (its certificate signed by the private CA): its base URL."""
    async with https_replica(certs) as url:
        yield url


def test_ca_file_is_checked_at_load(certs: Certs, tmp_path: Path) -> None:
    assert parse_config({"tls": {"ca_file": str(certs.ca)}}).tls.ca_file == str(certs.ca)
    missing = tmp_path / "nowhere.pem"
    with pytest.raises(ConfigError, match=rf"tls: ca_file '{missing}' cannot be read"):
        parse_config({"tls": {"ca_file": str(missing)}})
    with pytest.raises(ConfigError, match=r"tls: ca_file '.*r\.key' holds no PEM certificate"):
        parse_config({"tls": {"ca_file": str(certs.key)}})
    with pytest.raises(ConfigError, match="unknown key 'verify'"):  # no way to turn it off
        parse_config({"tls": {"verify": False}})


async def test_proxied_requests_trust_the_named_ca(certs: Certs, replica: str) -> None:
    trusting = client_for(parse_config({"tls": {"ca_file": str(certs.ca)}}))
    try:
        answer = await trusting.post(f"{replica}/v1/completions", b"{}", {})
        assert answer.status == 200 and await answer.read(100) == b'{"ok": true}'
        answer.release()
    finally:
        await trusting.close()
    default = client_for(parse_config({}))  # the system's CAs alone
    try:
        with pytest.raises(UpstreamUnreachable, match=r"tls: \{ca_file: PATH\}"):
            await default.post(f"{replica}/v1/completions", b"{}", {})
    finally:
        await default.close()


async def test_health_checks_trust_the_named_ca(certs: Certs, replica: str) -> None:
    config = parse_config({"replicas": [{"id": "r0", "url": replica}],
                           "tls": {"ca_file": str(certs.ca)}})
    async with aiohttp.ClientSession() as session:
        for tls in (replica_tls(config.tls), None):
            fleet = Fleet(config.replicas)
            monitor = Monitor(fleet, session, HealthConfig(failures_to_eject=1),
                              ScrapeConfig(), tls=tls)
            state = fleet.get("r0")
            assert state is not None
            await monitor.check_one(state)
            if tls is not None:
                assert state.healthy and state.last_error is None
            else:  # the system's CAs alone: the failure says how to trust the CA
                assert not state.healthy
                assert state.last_error is not None
                assert "tls: {ca_file: PATH}" in state.last_error, state.last_error
