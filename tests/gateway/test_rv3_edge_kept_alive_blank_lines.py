"""A kept-alive connection that sends bytes which begin no request (blank lines, which a
server skips before a request line) is still held to the head's time limit: they ended
its keep-alive wait, and no head timer started, so two bytes held it open for ever."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from tests.support.servers import answer_ok, gateway_server


@pytest.fixture
def port() -> Iterator[int]:
    with gateway_server(answer_ok, {"header_timeout_s": 0.3, "keep_alive_s": 0.3}) as (_, port):
        yield port


def _rest(sock: socket.socket) -> bytes:
    """What the server sends until it closes (TimeoutError: it held the connection)."""
    got = b""
    while chunk := sock.recv(65536):
        got += chunk
    return got


@pytest.mark.parametrize("stray", [b"\r\n", b"\n", b"\r\n\r\n"])
def test_blank_lines_on_a_kept_alive_connection_do_not_hold_it(port: int,
                                                               stray: bytes) -> None:
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.settimeout(5)  # far past both limits: only a connection held for ever waits
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        first = sock.recv(65536)
        assert first.startswith(b"HTTP/1.1 200") and first.endswith(b"ok")
        sock.sendall(stray)
        answer = _rest(sock)
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert b'"code":"header_timeout"' in answer


def test_a_request_after_blank_lines_is_served(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.settimeout(5)
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        sock.sendall(b"\r\nGET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        answer = _rest(sock)
    assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"ok")
