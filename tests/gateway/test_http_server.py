"""The gateway's HTTP server bounds what a client can make it hold: the request head's
size and the time to send it."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import pytest
import uvicorn

from gateway.config import parse_config
from gateway.http_server import server_config
from tests.support.servers import free_port
from tests.support.waiting import wait_until


async def ok_app(scope, receive, send) -> None:  # type: ignore[no-untyped-def]
    if scope["type"] == "http":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture
def port() -> Iterator[int]:
    config = parse_config({"port": free_port(), "limits": {"max_header_bytes": 8192,
                                                           "header_timeout_s": 0.5}})
    server = uvicorn.Server(server_config(ok_app, config, log_level="critical"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(lambda: server.started, 10, "the server to start")
    yield config.port
    server.should_exit = True
    thread.join(5)


def exchange(port: int, data: bytes, wait: float = 3.0) -> bytes:
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.settimeout(wait)
        with contextlib.suppress(OSError):  # closed on us mid-send: read what it said
            sock.sendall(data)
        chunks = []
        try:
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        except (TimeoutError, ConnectionResetError):
            pass
        return b"".join(chunks)


def test_a_huge_request_head_gets_431(port: int) -> None:
    answer = exchange(port, b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 200_000)
    assert answer.startswith(b"HTTP/1.1 431")
    assert b"\r\nx-request-id: gw-" in answer.split(b"\r\n\r\n")[0]  # a new one: no head


def test_a_head_that_never_ends_gets_408(port: int) -> None:
    started = time.monotonic()
    answer = exchange(port, b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: a")
    assert answer.startswith(b"HTTP/1.1 408") and time.monotonic() - started < 2


def test_normal_requests_and_kept_alive_ones_pass(port: int) -> None:
    two = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" * 2
    answer = exchange(port, two, wait=1.0)
    assert answer.count(b"HTTP/1.1 200") == 2
