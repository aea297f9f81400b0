"""An ``https`` replica whose certificate a private CA signed (real TLS: openssl makes
the CA and the replica's certificate), for tests of ``tls: {ca_file}``."""

from __future__ import annotations

import ssl
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiohttp import web

from tests.support.binaries import which


@dataclass
class Certs:
    ca: Path  # the private CA's certificate
    cert: Path  # the replica's, signed by it, for 127.0.0.1
    key: Path


def make_certs(d: Path) -> Certs:
    """A private CA and a replica certificate for 127.0.0.1 signed by it, under ``d``."""
    openssl = which("openssl", "apt-get install openssl")
    if openssl is None:
        pytest.skip("no openssl binary to make certificates with")
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


@asynccontextmanager
async def https_replica(certs: Certs) -> AsyncIterator[str]:
    """An https replica (its certificate signed by the private CA) on the running loop:
    its base URL."""
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
