"""A connection closed with an answer its client does not read is dropped once the client
has read nothing of it for ``header_timeout_s``: a close waits for what is buffered to
go out, so a client that asked for a large answer (embeddings, a whole completion) and
read none of it held the connection, the answer's bytes and a place under
``max_connections`` for as long as its machine kept acknowledging TCP probes. A client
that reads its answer, later than the close, gets all of it.

An answer that fills the connection before the next pipelined request is answered makes
that answer's first write wait for the client: one that reads nothing is dropped after
``timeouts.idle_s``, as a relayed answer's client is, instead of holding the connection
and the request's task for as long as it stays."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
import uvicorn

from tests.support.servers import gateway_server
from tests.support.waiting import wait_until

BIG = b"x" * (16 << 20)  # past what the two sockets' buffers take on loopback


async def big_app(scope, receive, send) -> None:  # type: ignore[no-untyped-def]
    if scope["type"] == "http":
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", str(len(BIG)).encode())]})
        await send({"type": "http.response.body", "body": BIG})


@pytest.fixture
def server() -> Iterator[tuple[uvicorn.Server, int]]:
    with gateway_server(big_app, {"header_timeout_s": 0.5, "keep_alive_s": 0.1}) as started:
        yield started


@pytest.fixture
def patient() -> Iterator[tuple[uvicorn.Server, int]]:
    # the late reader's unread drop far off: a stalled test machine must not trigger it
    with gateway_server(big_app, {"header_timeout_s": 5.0, "keep_alive_s": 0.1}) as started:
        yield started


@pytest.fixture
def kept_alive() -> Iterator[tuple[uvicorn.Server, int]]:
    # the connection stays open between answers; only a stalled answer may drop it
    with gateway_server(big_app, {"header_timeout_s": 0.5, "keep_alive_s": 60},
                        {"idle_s": 0.5}) as started:
        yield started


def _asking(port: int, requests: int = 1) -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" * requests)
    return sock


def test_a_client_that_reads_nothing_of_its_answer_is_dropped(
        server: tuple[uvicorn.Server, int]) -> None:
    running, port = server
    with _asking(port):
        wait_until(lambda: running.server_state.connections, 5, "the connection")
        # kept alive 0.1 s, then closed; what is left of the answer waits on the client
        wait_until(lambda: not running.server_state.connections, 5,
                   "the connection whose client reads nothing to be dropped")


def test_a_client_that_reads_its_answer_late_gets_all_of_it(
        patient: tuple[uvicorn.Server, int]) -> None:
    running, port = patient
    with _asking(port) as sock:
        # past the keep-alive: the connection is closed with the rest of the answer held
        wait_until(lambda: running.server_state.connections and all(
            c.transport.is_closing() for c in running.server_state.connections), 5,
            "the connection to be closed with its answer unread")
        sock.settimeout(10)
        got = bytearray()
        while chunk := sock.recv(1 << 20):
            got += chunk
    head, _, body = bytes(got).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and len(body) == len(BIG)


def test_a_pipelined_answer_behind_an_unread_one_drops_the_connection_after_idle_s(
        kept_alive: tuple[uvicorn.Server, int]) -> None:
    running, port = kept_alive
    with _asking(port, requests=2):
        # the first answer is all buffered; the second one's head waits for the client
        wait_until(lambda: running.server_state.connections and all(
            c.cycle is not None and c.flow.write_paused
            for c in running.server_state.connections), 5,
            "the second answer to wait on the client")
        wait_until(lambda: not running.server_state.connections, 5,
                   "the connection whose client reads nothing to be dropped")
        assert not running.server_state.tasks, "the second request's task still waits"
