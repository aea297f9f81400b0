"""``kvgate engine`` answers an HTTP/1.0 client's stream as it is, ended by the
connection's close: never chunked (RFC 9112 6.1), as the gateway does."""

from __future__ import annotations

import json

from tests.support.fleets import SIM_ENGINE
from tests.support.processes import Processes
from tests.support.raw_http import raw_post
from tests.support.servers import free_port


def _answer(port: int, version: bytes, stream: bool) -> tuple[bytes, bytes]:
    return raw_post(port, "/v1/completions", {"model": "sim-llama", "prompt": "p",
                                              "max_tokens": 3, "stream": stream}, version)


def test_an_http10_clients_stream_from_the_engine_is_not_chunked(spawn: Processes) -> None:
    port = free_port()
    spawn("engine", *SIM_ENGINE, "--port", str(port),
          ready_url=f"http://127.0.0.1:{port}/health")
    head, body = _answer(port, b"1.0", stream=True)
    assert head.startswith(b"http/1.1 200") and b"transfer-encoding" not in head, head
    events = body.split(b"\n\n")
    assert events[-2:] == [b"data: [DONE]", b""], body
    assert all(json.loads(e.removeprefix(b"data: "))["choices"] for e in events[:-2]), body
    head, body = _answer(port, b"1.0", stream=False)
    assert f"content-length: {len(body)}".encode() in head, head
    head, body = _answer(port, b"1.1", stream=True)
    assert b"transfer-encoding: chunked" in head and body.endswith(b"0\r\n\r\n"), head
