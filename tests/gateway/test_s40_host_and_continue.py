"""RFC edges of a request's head: an HTTP/1.1 request without exactly one ``Host`` is
answered 400 naming it (RFC 9112 3.2), before anything reaches a replica; an HTTP/1.0
request that says ``Expect: 100-continue`` gets no interim ``100 Continue`` (RFC 9110
10.1.1), only its answer."""

from __future__ import annotations

import json

import pytest

from tests.support.fake_replica import Behaviour, fake_replica
from tests.support.gateway_harness import Serve, start_gateway
from tests.support.raw_http import raw_answer

BODY = b'{"model":"sim-model","prompt":"hi","max_tokens":2}'
TAIL = b"Content-Type: application/json\r\nConnection: close\r\n" \
       b"Content-Length: %d\r\n\r\n%s" % (len(BODY), BODY)


def _gateway(serve: Serve) -> tuple[int, Behaviour]:
    rec = Behaviour("rec")
    gw = start_gateway(serve, [("r0", serve(fake_replica(rec)).url)],
                       scrape={"enabled": False})
    return gw.port, rec


@pytest.mark.parametrize("hosts, said", [
    (b"", "no Host header"),
    (b"Host: a\r\nHost: b\r\n", "2 Host headers"),
], ids=["none", "two"])
def test_http11_without_exactly_one_host_is_refused_400(serve: Serve, hosts: bytes,
                                                        said: str) -> None:
    port, rec = _gateway(serve)
    head, _, body = raw_answer(port, b"POST /v1/completions HTTP/1.1\r\n" + hosts
                               + TAIL).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400"), head
    error = json.loads(body)["error"]
    assert error["code"] == "invalid_host", error
    assert said in error["message"], error
    assert rec.received == []


def test_one_host_and_http10_without_host_are_served(serve: Serve) -> None:
    port, rec = _gateway(serve)
    for request in (b"POST /v1/completions HTTP/1.1\r\nHost: a\r\n" + TAIL,
                    b"POST /v1/completions HTTP/1.0\r\n" + TAIL):
        answer = raw_answer(port, request)
        assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
    assert len(rec.received) == 2


@pytest.mark.parametrize("head, interim", [
    (b"POST /v1/completions HTTP/1.0\r\n", b""),
    (b"POST /v1/completions HTTP/1.1\r\nHost: a\r\n", b"HTTP/1.1 100 Continue\r\n\r\n"),
], ids=["http10-none", "http11-continue"])
def test_an_interim_answer_only_to_http11_expecting_continue(serve: Serve, head: bytes,
                                                             interim: bytes) -> None:
    port, rec = _gateway(serve)
    answer = raw_answer(port, head + b"Expect: 100-continue\r\n" + TAIL)
    assert answer.startswith(interim + b"HTTP/1.1 200"), answer[:200]
    assert answer.count(b"100 Continue") == (1 if interim else 0)
    assert len(rec.received) == 1
