"""A request body sent compressed (``Content-Encoding: gzip``) is refused with a 415 that
names the encoding and says what is accepted, before it reaches a replica (which reads
no compressed body either); it was a 400 that called the body invalid UTF-8."""

from __future__ import annotations

import gzip
import json
from typing import Any

import httpx
import pytest

from tests.support.fake_replica import Behaviour, fake_replica
from tests.support.gateway_harness import start_gateway

CHAT = json.dumps({"model": "sim-model",
                   "messages": [{"role": "user", "content": "hi"}]}).encode()
# a pass-through body (no messages, no prompt): relayed to the replica's own /invocations
POOLING = json.dumps({"model": "sim-model", "input": "hi"}).encode()


@pytest.mark.parametrize(("path", "body"), [("/v1/chat/completions", CHAT),
                                            ("/invocations", CHAT),
                                            ("/invocations", POOLING)])
def test_a_compressed_body_is_refused_naming_its_encoding(serve: Any, path: str,
                                                          body: bytes) -> None:
    b = Behaviour("a")
    gw = start_gateway(serve, [("a", serve(fake_replica(b)).url)])
    r = httpx.post(gw.url + path, content=gzip.compress(body), timeout=10,
                   headers={"content-type": "application/json", "content-encoding": "gzip"})
    assert r.status_code == 415, r.text
    assert r.headers["accept-encoding"] == "identity"
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["code"] == "unsupported_content_encoding"
    assert "'gzip'" in error["message"] and "uncompressed" in error["message"]
    assert b.received == []
    # the same body uncompressed, or marked as such, is served
    for headers in ({}, {"content-encoding": "identity"}):
        r = httpx.post(gw.url + path, content=body, headers=headers, timeout=10)
        assert r.status_code == 200, r.text
    assert b.received == [body, body]


def test_a_compressed_body_to_a_pass_through_route_is_refused(serve: Any) -> None:
    # it was decoded as it came: a 400 "not UTF-8 (byte 0x8b ...)"
    b = Behaviour("a")
    gw = start_gateway(serve, [("a", serve(fake_replica(b)).url)])
    r = httpx.post(gw.url + "/v1/embeddings", content=gzip.compress(POOLING), timeout=10,
                   headers={"content-type": "application/json", "content-encoding": "gzip"})
    assert r.status_code == 415, r.text
    assert r.json()["error"]["code"] == "unsupported_content_encoding"
    assert b.received == []
