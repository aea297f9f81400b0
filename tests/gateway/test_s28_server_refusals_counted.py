"""An answer the HTTP server writes itself, before any handler (malformed HTTP, a head too
large or too slow), is counted in ``kvgate_requests_total`` (``replica="none"``,
``route="none"``) as every other refusal is: these appeared in no series, so a client
sending bad requests was invisible on the dashboard. A connection that sends nothing
and is dropped after ``header_timeout_s`` is no request: it is not counted."""

from __future__ import annotations

import socket

import httpx

from tests.support.fake_replica import Behaviour, fake_replica
from tests.support.gateway_harness import Gateway, Serve, start_gateway, wait_for_metric
from tests.support.waiting import wait_until

SERIES = 'kvgate_requests_total{replica="none",route="none",status="%s"}'


def _answer(gw: Gateway, raw: bytes, wait_s: float = 10) -> bytes:
    with socket.create_connection(("127.0.0.1", gw.port), timeout=wait_s) as sock:
        if raw:
            sock.sendall(raw)
        got = b""
        while chunk := sock.recv(65536):
            got += chunk
    return got


def test_the_servers_own_refusals_are_counted(serve: Serve) -> None:
    gw = start_gateway(serve, [("a", serve(fake_replica(Behaviour("a"))).url)],
                       limits={"header_timeout_s": 0.3, "max_header_bytes": 4096})
    wait_until(lambda: httpx.get(f"{gw.url}/ready").status_code == 200, 10, "a ready gateway")
    assert _answer(gw, b"NOT HTTP AT ALL\r\n\r\n").startswith(b"HTTP/1.1 400")
    assert _answer(gw, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n"
                       b"Content-Length: 2\r\n\r\nab").startswith(b"HTTP/1.1 400")
    big = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 8192 + b"\r\n\r\n"
    assert _answer(gw, big).startswith(b"HTTP/1.1 431")
    assert _answer(gw, b"GET /health HTTP/1.1\r\nHost: x\r\n").startswith(b"HTTP/1.1 408")
    assert _answer(gw, b"").startswith(b"HTTP/1.1 408")  # connected, sent nothing
    wait_for_metric(gw, SERIES % "400", 2)
    wait_for_metric(gw, SERIES % "431", 1)
    wait_for_metric(gw, SERIES % "408", 1)  # the head begun; the silent one is not counted
