"""A request body in a transfer coding the gateway does not decode (``gzip, chunked``,
``identity``) is answered 501, naming the header, before its body reaches the JSON decoder
or a replica, as RFC 9112 and nginx answer it; ``chunked`` alone is served."""

from __future__ import annotations

import gzip
import json

import pytest

from tests.support.fake_replica import Behaviour, fake_replica
from tests.support.gateway_harness import Serve, start_gateway
from tests.support.raw_http import raw_answer

BODY = b'{"model":"sim-model","prompt":"hi","max_tokens":2}'
POST = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"


def _chunked(data: bytes) -> bytes:
    return b"%x\r\n" % len(data) + data + b"\r\n0\r\n\r\n"


def _answer(port: int, data: bytes) -> tuple[bytes, bytes]:
    head, _, body = raw_answer(port, data).partition(b"\r\n\r\n")
    return head, body


@pytest.mark.parametrize("headers, body", [
    (b"Transfer-Encoding: gzip, chunked\r\n", _chunked(gzip.compress(BODY, mtime=0))),
    (b"Transfer-Encoding: deflate, chunked\r\n", _chunked(BODY)),
    (b"Transfer-Encoding: identity\r\nTransfer-Encoding: chunked\r\n", _chunked(BODY)),
], ids=["gzip-chunked", "deflate-chunked", "identity-then-chunked"])
def test_a_coding_besides_chunked_is_refused_501(serve: Serve, headers: bytes,
                                                 body: bytes) -> None:
    rec = Behaviour("rec")
    gw = start_gateway(serve, [("r0", serve(fake_replica(rec)).url)],
                       scrape={"enabled": False})
    head, answer = _answer(gw.port, POST + headers + b"\r\n" + body)
    assert head.startswith(b"HTTP/1.1 501"), head
    assert b"connection: close" in head.lower()
    error = json.loads(answer)["error"]
    assert error["code"] == "unsupported_transfer_encoding", error
    said = headers.split(b": ", 1)[1].split(b"\r\n")[0].decode()
    assert f"Transfer-Encoding '{said}" in error["message"], error
    assert rec.received == []


def test_chunked_alone_is_served(serve: Serve) -> None:
    rec = Behaviour("rec")
    gw = start_gateway(serve, [("r0", serve(fake_replica(rec)).url)],
                       scrape={"enabled": False})
    head, _ = _answer(gw.port, POST + b"Transfer-Encoding: Chunked\r\nConnection: close\r\n"
                      b"\r\n" + _chunked(BODY))
    assert head.startswith(b"HTTP/1.1 200"), head
    assert len(rec.received) == 1
