"""An HTTP/1.0 client's stream comes as it is, ended by the connection's close: never
chunked (RFC 9112 6.1), whose chunk-size lines such a client reads as part of its events.
HTTP/1.1 streams stay chunked; answers with a length keep it."""

from __future__ import annotations

import json

from tests.support.fake_replica import Behaviour, fake_replica
from tests.support.gateway_harness import Gateway, Serve, start_gateway
from tests.support.raw_http import raw_post


def _answer(gw: Gateway, version: bytes, stream: bool) -> tuple[bytes, bytes]:
    """The head (lower-cased) and body of one completion's answer over a raw connection,
    read until the gateway closes it."""
    return raw_post(gw.port, "/v1/completions", {"model": "sim-model", "prompt": "p",
                                                 "stream": stream}, version)


def test_an_http10_clients_stream_is_not_chunked(serve: Serve) -> None:
    gw = start_gateway(serve, [("a", serve(fake_replica(Behaviour("a", chunks=3))).url)])
    head, body = _answer(gw, b"1.0", stream=True)
    assert head.startswith(b"http/1.1 200") and b"transfer-encoding" not in head, head
    assert b"content-length" not in head and b"connection: close" in head, head
    events = body.split(b"\n\n")
    assert events[-2:] == [b"data: [DONE]", b""], body
    texts = [json.loads(event.removeprefix(b"data: "))["choices"][0]["text"]
             for event in events[:-2]]
    assert texts == ["t0 ", "t1 ", "t2 "], body

    # an answer with a length keeps it; an HTTP/1.1 stream is chunked as before
    head, body = _answer(gw, b"1.0", stream=False)
    assert f"content-length: {len(body)}".encode() in head, head
    assert json.loads(body)["choices"][0]["text"] == "a ok"
    head, body = _answer(gw, b"1.1", stream=True)
    assert b"transfer-encoding: chunked" in head and body.endswith(b"0\r\n\r\n"), head
