"""``https`` replicas signed by a private CA: ``tls: {ca_file}`` names its certificate,
checked at load, and the gateway's upstream client and its health checks trust it beside
the system's CAs; without it a replica's certificate fails, and the failure names the key
that fixes it. Real TLS: openssl makes a CA and a replica certificate signed by it."""

from __future__ import annotations

import ssl
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from gateway.config import HealthConfig, ScrapeConfig, parse_config
from gateway.fleet import Fleet
from gateway.monitor import Monitor
from gateway.upstream_http import UpstreamUnreachable, client_for, replica_tls
from policies.config import ConfigError
from tests.support.binaries import which


@dataclass
class Certs:
    ca: Path  # the private CA's certificate
    cert: Path  # the replica's, signed by it, for 127.0.0.1
    key: Path


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    openssl = which("openssl", "apt-get install openssl")
    if openssl is None:
        pytest.skip("no openssl binary to make certificates with")
    d = tmp_path_factory.mktemp("s37o_ca")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]

    def run(*args: str) -> None:
        subprocess.run([openssl, *args], check=True, capture_output=True)
    run("req", "-x509", *ec, "-days", "1", "-keyout", str(d / "ca.key"),
        "-out", str(d / "ca.pem"), "-subj", "/CN=kvgate test CA",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign")
    run("req", *ec, "-keyout", str(d / "r.key"), "-out", str(d / "r.csr"),
        "-subj", "/CN=replica")
    (d / "r.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    run("x509", "-req", "-in", str(d / "r.csr"), "-CA", str(d / "ca.pem"),
        "-CAkey", str(d / "ca.key"), "-CAcreateserial", "-days", "1",
        "-extfile", str(d / "r.ext"), "-out", str(d / "r.pem"))
    return Certs(d / "ca.pem", d / "r.pem", d / "r.key")


@pytest.fixture
async def replica(certs: Certs) -> AsyncIterator[str]:
    """An https replica (its certificate signed by the private CA): its base URL."""
    served = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    served.load_cert_chain(certs.cert, certs.key)

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="")

    async def complete(request: web.Request) -> web.Response:
        return web.Response(text='{"ok": true}', content_type="application/json")

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": []})

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/completions", complete)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0, ssl_context=served).start()
    try:
        yield f"https://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


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
