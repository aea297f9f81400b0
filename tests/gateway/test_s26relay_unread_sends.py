"""A client that reads nothing of its answer is dropped after ``idle_s`` whichever send to
it waits: not only a body chunk's, but the answer's head (on a kept-alive connection whose
previous answer it has not read) and the end of the body that follows the last bytes
later. Before, those two waited for ever (uvicorn waits for the client to read before
each send once writing is paused): a head's wait held the request's place under
``max_in_flight`` and its replica's stream (every later request refused 429), an end's
the connection and its unread bytes (every later connection refused 503 at
``max_connections``)."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support.fake_replica import Behaviour, fake_replica
from tests.support.gateway_harness import Gateway, Serve, start_gateway, wait_for_metric
from tests.support.waiting import wait_until

BIG = 16 << 20  # past what the two sockets' buffers take on loopback: writing pauses
_OPEN = b'{"text": "'


def _big_body() -> bytes:
    return _OPEN + b"x" * (BIG - len(_OPEN) - 2) + b'"}'


def _replica(b: Behaviour, end: threading.Event) -> Any:
    """``fake_replica(b)``, but a non-streamed completion whose prompt is ``whole`` gets a
    ``BIG`` body with its length, and one whose prompt is ``late_end`` a chunked ``BIG``
    body whose end follows once ``end`` is set."""
    inner = fake_replica(b)

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] != "/v1/completions":
            await inner(scope, receive, send)
            return
        raw, more = b"", True
        while more:
            message = await receive()
            raw += message.get("body", b"")
            more = message.get("more_body", False)
        prompt = json.loads(raw).get("prompt")
        if prompt not in ("whole", "late_end"):
            given = False

            async def replay() -> Any:
                nonlocal given
                if given:
                    return await receive()
                given = True
                return {"type": "http.request", "body": raw, "more_body": False}

            await inner(scope, replay, send)
            return
        headers = [(b"content-type", b"application/json")]
        if prompt == "whole":
            headers.append((b"content-length", str(BIG).encode()))
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": _big_body(),
                    "more_body": prompt == "late_end"})
        if prompt == "late_end":
            await asyncio.to_thread(end.wait, 10)
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    return app


def _post(body: dict[str, Any]) -> bytes:
    raw = json.dumps({"model": "sim-model", **body}).encode()
    return (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(raw)}\r\n\r\n".encode() + raw)


def _unread(gw: Gateway, *requests: bytes) -> socket.socket:
    """A connection that has sent ``requests`` (pipelined) and reads nothing."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", gw.port))
    sock.sendall(b"".join(requests))
    return sock


def _served(gw: Gateway) -> bool:
    """A completion from another client is answered 200 now."""
    try:
        status = httpx.post(f"{gw.url}/v1/completions", timeout=5,
                            json={"model": "sim-model", "prompt": "p"}).status_code
    except httpx.TransportError:
        return False
    return status == 200


@pytest.fixture
def setting(serve: Serve) -> Iterator[tuple[Serve, Behaviour, threading.Event]]:
    b = Behaviour("r", chunks=2, release=threading.Event())  # a stream's end waits
    end = threading.Event()
    yield serve, b, end
    end.set()
    assert b.release is not None
    b.release.set()


def test_a_head_behind_an_unread_answer_frees_its_place_after_idle_s(
        setting: tuple[Serve, Behaviour, threading.Event]) -> None:
    serve, b, end = setting
    gw = start_gateway(serve, [("r", serve(_replica(b, end)).url)],
                       limits={"max_in_flight": 1},
                       timeouts={"idle_s": 0.5, "buffer_bytes": BIG})
    # the first answer, whole, fills the connection; the second's replica streams, and
    # its head waits on the client, which reads nothing
    with _unread(gw, _post({"prompt": "whole"}), _post({"prompt": "s", "stream": True})):
        wait_until(lambda: b.received, 10, "the streamed request to reach its replica")
        wait_until(lambda: _served(gw), 10, "the place it held to be freed")
        wait_until(lambda: b.cancelled, 10, "the replica's stream to be dropped")
        wait_for_metric(gw, 'kvgate_requests_total{replica="r",route="round_robin",'
                            'status="499"}', 1.0)


def test_an_end_of_body_the_client_does_not_take_drops_it_after_idle_s(
        setting: tuple[Serve, Behaviour, threading.Event]) -> None:
    serve, b, end = setting
    gw = start_gateway(serve, [("r", serve(_replica(b, end)).url)],
                       limits={"max_in_flight": 1, "max_connections": 1,
                               "header_timeout_s": 0.5},
                       timeouts={"idle_s": 0.5, "buffer_bytes": BIG})
    with _unread(gw, _post({"prompt": "late_end"})) as sock:
        sock.settimeout(10)
        # the body's bytes are relayed (their writes fill the connection); its end comes
        assert sock.recv(12, socket.MSG_PEEK).startswith(b"HTTP/1.1 200")
        end.set()
        wait_until(lambda: _served(gw), 10, "the connection it held to be dropped")
