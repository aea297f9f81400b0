"""A request the parser refuses behind one still being answered on the same connection
(pipelined) is answered after that answer, whole, never written into the middle of it."""

from __future__ import annotations

import contextlib
import json
import socket
import threading

from tests.support.fake_replica import Behaviour, fake_replica
from tests.support.gateway_harness import Serve, start_gateway

STREAM = json.dumps({"model": "sim-model", "prompt": "hi", "stream": True}).encode()
GOOD = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % len(STREAM) + STREAM)
BAD = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n"


def _read_until_closed(sock: socket.socket) -> bytes:
    got = b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(65536):
            got += chunk
    return got


def _dechunked(body: bytes) -> tuple[bytes, bytes]:
    """A chunked body's content and what follows its last chunk (raises where it is no
    chunked body)."""
    out = b""
    while True:
        size_line, _, body = body.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            assert body.startswith(b"\r\n"), body[:80]
            return out, body[2:]
        out += body[:size]
        assert body[size:size + 2] == b"\r\n", body[size:size + 80]
        body = body[size + 2:]


def test_a_refused_request_behind_a_stream_is_answered_after_it(serve: Serve) -> None:
    release = threading.Event()
    rec = Behaviour("rec", release=release)
    gw = start_gateway(serve, [("r0", serve(fake_replica(rec)).url)],
                       scrape={"enabled": False})
    with socket.create_connection(("127.0.0.1", gw.port)) as sock:
        sock.settimeout(10)
        sock.sendall(GOOD)
        first = sock.recv(65536)  # the stream has begun: its head and first events
        assert first.startswith(b"HTTP/1.1 200"), first[:200]
        sock.sendall(BAD)  # refused while the stream's last chunk is held
        release.set()
        answer = first + _read_until_closed(sock)
    head, _, rest = answer.partition(b"\r\n\r\n")
    assert b"transfer-encoding: chunked" in head.lower(), head
    events, after = _dechunked(rest)
    assert events.rstrip().endswith(b"data: [DONE]"), events[-200:]
    refusal_head, _, refusal = after.partition(b"\r\n\r\n")
    assert refusal_head.startswith(b"HTTP/1.1 400"), after[:200]
    error = json.loads(refusal)["error"]
    assert error["code"] == "invalid_http" and "content-length" in error["message"].lower()
    assert len(rec.received) == 1  # the refused request reached no replica


def test_a_pipelined_flood_ending_mid_body_is_refused_after_the_answers(serve: Serve) -> None:
    # past 64 queued the newest are dropped and a 429 follows the answers; the newest's
    # body still coming once wrote the 429 into the stream being answered
    release = threading.Event()
    rec = Behaviour("rec", release=release)
    gw = start_gateway(serve, [("r0", serve(fake_replica(rec)).url)],
                       scrape={"enabled": False})
    plain = json.dumps({"model": "sim-model", "prompt": "hi"}).encode()
    one = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
           b"Content-Length: %d\r\n\r\n" % len(plain) + plain)
    cut = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"mo"
    with socket.create_connection(("127.0.0.1", gw.port)) as sock:
        sock.settimeout(10)
        sock.sendall(GOOD)
        first = sock.recv(65536)
        assert first.startswith(b"HTTP/1.1 200"), first[:200]
        sock.sendall(one * 70 + cut)
        release.set()
        answer = first + _read_until_closed(sock)
    _, _, rest = answer.partition(b"\r\n\r\n")
    events, after = _dechunked(rest)  # the stream whole, nothing written into it
    assert events.rstrip().endswith(b"data: [DONE]"), events[-200:]
    assert after.count(b"HTTP/1.1 200") == 64
    refusal = after[after.rindex(b"HTTP/1.1 "):]
    assert refusal.startswith(b"HTTP/1.1 429") and b"too_many_pipelined_requests" in refusal
