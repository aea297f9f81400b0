"""Idle kept-alive connections do not lock new clients out: past ``max_connections`` a
new connection closes the oldest idle ones and is served; a connection with a request in
progress (its head, its body or its answer) is never closed so, and when every
connection is busy the new one is refused."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from typing import Any

import uvicorn

from tests.support.raw_answers import connections, read_answer
from tests.support.servers import gateway_server
from tests.support.waiting import wait_until

GET = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"


class App:
    """``/slow`` starts a streamed answer and ends it on ``end_slow``; ``/body`` answers
    with the body it read; anything else answers ``ok``."""

    def __init__(self) -> None:
        self.body_started = threading.Event()
        self._gate: tuple[asyncio.AbstractEventLoop, asyncio.Event] | None = None

    def end_slow(self) -> None:
        """(From the test's thread, once ``/slow``'s first bytes came.)"""
        assert self._gate is not None
        loop, gate = self._gate
        loop.call_soon_threadsafe(gate.set)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        if scope["path"] == "/slow":
            gate = asyncio.Event()
            self._gate = asyncio.get_running_loop(), gate
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"first", "more_body": True})
            await gate.wait()
            await send({"type": "http.response.body", "body": b"last"})
            return
        body = b"ok"
        if scope["path"] == "/body":
            self.body_started.set()
            body, more = b"", True
            while more:
                message = await receive()
                body += message.get("body", b"")
                more = message.get("more_body", False)
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


def read_until(sock: socket.socket, end: bytes) -> bytes:
    data = b""
    while end not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed after {data!r}"
        data += chunk
    return data


def closed_by_server(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def idle_count(server: uvicorn.Server) -> int:
    """Connections waiting for their next request (uvicorn's keep-alive wait running)."""
    return sum(protocol.timeout_keep_alive_task is not None
               for protocol in tuple(server.server_state.connections))


def test_idle_kept_alive_connections_make_room_for_a_new_client_oldest_first() -> None:
    with gateway_server(App(), {"max_connections": 40}) as (server, port), \
            connections(port, 40) as held:
        for sock in held:  # each asks once (as a /health probe would), then idles
            sock.sendall(GET)
            assert read_answer(sock).startswith(b"HTTP/1.1 200")
        wait_until(lambda: idle_count(server) == 40, 5, "40 idle connections")
        with connections(port, 1) as (new,):
            new.sendall(GET)
            assert read_answer(new).startswith(b"HTTP/1.1 200")
            # a batch of the oldest (an eighth of those idle) was closed to make room
            for sock in held[:5]:
                assert closed_by_server(sock)
            # ... and the rest, with the new one within the limit, still serve
            for sock in held[5:]:
                sock.sendall(GET)
                assert read_answer(sock).startswith(b"HTTP/1.1 200")


def test_a_connection_with_a_request_in_progress_is_never_closed_to_make_room() -> None:
    app = App()
    with gateway_server(app, {"max_connections": 4}) as (server, port), \
            connections(port, 4) as (idle, in_head, in_body, in_answer):
        for sock in (idle, in_head):
            sock.sendall(GET)
            assert read_answer(sock).startswith(b"HTTP/1.1 200")
        wait_until(lambda: idle_count(server) == 2, 5, "two idle connections")
        in_head.sendall(b"GET / HTTP/1.1\r\nHo")  # its next request's head, begun
        wait_until(lambda: idle_count(server) == 1, 5, "the head's bytes to be read")
        in_body.sendall(b"POST /body HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabcde")
        wait_until(app.body_started.is_set, 5, "the body's request to start")
        in_answer.sendall(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
        assert b"first" in read_until(in_answer, b"first")

        with connections(port, 1) as (new,):  # the idle one makes room
            new.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            assert read_answer(new).startswith(b"HTTP/1.1 200")
        assert closed_by_server(idle)
        wait_until(lambda: len(server.server_state.connections) == 3, 5,
                   "the closed connections to go")

        # a client that sent nothing yet holds the fourth place, and every one is busy
        with connections(port, 1):
            wait_until(lambda: len(server.server_state.connections) == 4, 5,
                       "the fourth connection")
            with connections(port, 1) as (refused,):  # answered as it connects
                head, _, body = read_answer(refused).partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 503")
            assert json.loads(body)["error"]["code"] == "too_many_connections"

        # the busy connections were left alone: each request ends as it would have
        in_head.sendall(b"st: x\r\n\r\n")
        assert read_answer(in_head).startswith(b"HTTP/1.1 200")
        in_body.sendall(b"fghij")
        assert read_answer(in_body).endswith(b"\r\n\r\nabcdefghij")
        app.end_slow()
        assert b"last" in read_until(in_answer, b"0\r\n\r\n")
