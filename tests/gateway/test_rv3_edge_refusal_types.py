"""The errors the HTTP server answers itself carry the OpenAI error type of their status,
as the application's do: a 429 for too many pipelined requests is a ``rate_limit_error``
(it said ``invalid_request_error``, which a client that tells errors by type does not
retry), a 503 for too many connections a ``service_unavailable``."""

from __future__ import annotations

import contextlib
import json
import socket
from collections.abc import Iterator

import pytest

from gateway.http_server import MAX_PIPELINED
from kvwire.openai_schema import TooManyRequests
from tests.support.servers import answer_ok, gateway_server


@pytest.fixture
def port() -> Iterator[int]:
    with gateway_server(answer_ok) as (_, port):
        yield port


def test_too_many_pipelined_requests_is_a_rate_limit_error(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.settimeout(5)
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" * (MAX_PIPELINED + 8))
        got = b""
        with contextlib.suppress(ConnectionResetError):
            while chunk := sock.recv(65536):
                got += chunk
    refusal = got[got.rindex(b"HTTP/1.1 "):]
    head, _, body = refusal.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 429") and b"\r\nretry-after: 1" in head, head
    error = json.loads(body)["error"]
    assert error["code"] == "too_many_pipelined_requests"
    assert error["type"] == TooManyRequests.type == "rate_limit_error"
