"""A client's query string reaches the replica as sent (an Azure-style ``api-version``,
a server's own switches), on routed and pass-through endpoints alike; one holding a byte
no URL may carry is refused 400, and nothing is sent."""

from __future__ import annotations

import json
import socket

import httpx
import pytest
from starlette.requests import Request

from gateway.forwarding import upstream_query
from gateway.upstream_http import UpstreamClient
from kvwire.openai_schema import BadRequest
from tests.support.fake_replica import Behaviour, fake_replica
from tests.support.gateway_harness import Serve, start_gateway
from tests.support.waiting import wait_until

_BODIES = {
    "/v1/chat/completions": {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}]},
    "/v1/completions": {"model": "sim-model", "prompt": "hi"},
    "/invocations": {"model": "sim-model", "input": "hi"},  # (an embedding: passed through)
}


@pytest.mark.parametrize("path", sorted(_BODIES))
def test_the_query_string_is_forwarded(serve: Serve, path: str) -> None:
    replica = Behaviour("a")
    gw = start_gateway(serve, [("a", serve(fake_replica(replica)).url)])
    wait_until(lambda: httpx.get(f"{gw.url}/ready").status_code == 200, 10, "a ready gateway")
    r = httpx.post(f"{gw.url}{path}?api-version=2024-06-01&x=%20y", timeout=10,
                   json=_BODIES[path])
    assert r.status_code == 200, r.text
    assert replica.paths == [path]
    assert replica.query_strings == ["api-version=2024-06-01&x=%20y"]
    r = httpx.post(f"{gw.url}{path}", timeout=10, json=_BODIES[path])
    assert r.status_code == 200, r.text
    assert replica.query_strings[-1] == ""


def test_a_query_string_with_a_byte_no_url_carries_is_refused(serve: Serve) -> None:
    replica = Behaviour("a")
    gw = start_gateway(serve, [("a", serve(fake_replica(replica)).url)])
    wait_until(lambda: httpx.get(f"{gw.url}/ready").status_code == 200, 10, "a ready gateway")
    body = json.dumps(_BODIES["/v1/completions"]).encode()
    host, port = gw.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"POST /v1/completions?a=\xff HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Type: application/json\r\nContent-Length: "
                     + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 400"), answer[:300]
    assert replica.received == []


def test_a_query_string_is_checked_before_it_is_written_upstream() -> None:
    """What the HTTP parser let through is checked again, whatever server took it."""
    def query(raw: bytes) -> str:
        return upstream_query(Request({"type": "http", "query_string": raw, "headers": []}))

    assert query(b"") == ""
    assert query(b"api-version=1&a=%FF") == "?api-version=1&a=%FF"
    for bad in (b"a=\xff", b"a b", b"a\r\nHost: x", b"a#b"):
        with pytest.raises(BadRequest) as caught:
            query(bad)
        assert caught.value.code == "invalid_query" and repr(bad)[2:-1] in caught.value.message


def test_query_strings_are_not_kept_with_the_replicas_targets() -> None:
    """One kept target per client-made query string would fill the client's memory."""
    client = UpstreamClient()
    for n in range(100):
        _, path = client._target(f"http://127.0.0.1:9/v1/completions?x={n}&y=%zz")
        assert path == f"/v1/completions?x={n}&y=%zz"
    assert client._target("http://127.0.0.1:9/v1/completions")[1] == "/v1/completions"
    assert list(client._targets) == ["http://127.0.0.1:9/v1/completions"]
