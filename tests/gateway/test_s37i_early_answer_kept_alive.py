"""A connection answered before its request's body came whole (413, 401, 404, 415: the
gateway refuses on the head) whose client then sends the rest of the body is kept alive
as after any answer: it waits ``keep_alive_s`` for its next request and counts as idle
under ``max_connections``. Its keep-alive wait had been ended by the body's bytes and
never armed again, so a client that sent a head, its body and then nothing held a place
for good, never idle: a few such connections locked every new client out (503)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Iterator
from typing import Any

import uvicorn

from tests.support.raw_answers import connections, read_answer
from tests.support.servers import gateway_server
from tests.support.waiting import wait_until

BODY = b"x" * 1000
# a request refused on its head, its body not sent yet
EARLY = (b"POST /early HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
         b"Content-Length: %d\r\n\r\n" % len(BODY))


async def app(scope: Any, receive: Any, send: Any) -> None:
    """``/early`` answers 413 without reading the body; ``/late`` answers after a while
    longer than the tests' ``keep_alive_s``; anything else answers ``ok``."""
    if scope["type"] != "http":
        return
    status, body = 200, b"ok"
    if scope["path"] == "/early":
        status, body = 413, b"too large"
    elif scope["path"] == "/late":
        await asyncio.sleep(0.6)
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def closed_by_server(sock: socket.socket) -> bool:
    """Waits for the server to close (``socket.timeout``: it held the connection)."""
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


@contextlib.contextmanager
def answered_early(port: int, count: int) -> Iterator[list[socket.socket]]:
    """``count`` connections, each answered 413 on its head, then sent the whole body."""
    with connections(port, count) as socks:
        for sock in socks:
            sock.sendall(EARLY)
            assert read_answer(sock).startswith(b"HTTP/1.1 413")
            sock.sendall(BODY)
        yield socks


def test_a_connection_answered_before_its_body_waits_keep_alive_s_once_the_body_came(
        ) -> None:
    # the rest of a body is dropped for header_timeout_s at most: here far longer than
    # keep_alive_s and than the socket's 5 s, so only the keep-alive wait closes it
    with gateway_server(app, {"keep_alive_s": 0.2, "header_timeout_s": 60}) as (_, port), \
            answered_early(port, 1) as (sock,):
        assert closed_by_server(sock)


def waiting(server: uvicorn.Server) -> int:
    """Connections waiting for their next request (uvicorn's keep-alive wait running)."""
    return sum(protocol.timeout_keep_alive_task is not None
               for protocol in tuple(server.server_state.connections))


def test_a_connection_answered_before_its_body_counts_as_idle_under_max_connections(
        ) -> None:
    with gateway_server(app, {"max_connections": 2, "keep_alive_s": 60}) as (server, port), \
            answered_early(port, 2) as held:
        wait_until(lambda: waiting(server) == 2, 5, "both bodies dropped, kept alive")
        with socket.create_connection(("127.0.0.1", port)) as new:
            new.settimeout(5)
            new.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            head, _, body = read_answer(new).partition(b"\r\n\r\n")
        # the oldest, idle, made room: not refused too_many_connections
        assert head.startswith(b"HTTP/1.1 200"), body
        assert closed_by_server(held[0])
        held[1].sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_answer(held[1]).startswith(b"HTTP/1.1 200")


def test_a_request_that_follows_a_dropped_body_in_the_same_read_is_answered() -> None:
    # its answer takes longer than keep_alive_s: the wait armed as the body ended is
    # over once the next request begins, in the same read
    with gateway_server(app, {"keep_alive_s": 0.2, "header_timeout_s": 60}) as (_, port), \
            socket.create_connection(("127.0.0.1", port)) as sock:
        sock.settimeout(5)
        sock.sendall(EARLY)
        assert read_answer(sock).startswith(b"HTTP/1.1 413")
        sock.sendall(BODY + b"GET /late HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_answer(sock).endswith(b"\r\n\r\nok")
