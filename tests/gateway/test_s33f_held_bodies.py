"""The request bodies a gateway holds are bounded in bytes until each request's answer
ends (``limits.max_held_body_bytes``), not only while they are received: past it a new
request gets 429 with ``Retry-After`` naming the setting, and every way out (answered,
failed, refused, client gone) gives its body's bytes back."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable

import httpx
import pytest

from gateway.config import ConfigError, parse_config
from gateway.workers import share_of
from tests.support.fake_replica import Behaviour, fake_replica
from tests.support.gateway_harness import Gateway, start_gateway
from tests.support.servers import ThreadServer
from tests.support.waiting import wait_until

Serve = Callable[..., ThreadServer]
LIMITS = {"max_held_body_bytes": 6000, "max_receiving_bytes": 100_000}


def body(size: int, model: str = "sim-model") -> bytes:
    """A completion request of exactly ``size`` bytes."""
    head = json.dumps({"model": model, "max_tokens": 1, "prompt": ""}).encode()
    out = head[:-2] + b"x" * (size - len(head)) + head[-2:]
    assert len(out) == size
    return out


def post(gw: Gateway, size: int, model: str = "sim-model", path: str = "/v1/completions",
         timeout: float = 10) -> httpx.Response:
    return httpx.post(gw.url + path, content=body(size, model), timeout=timeout,
                      headers={"content-type": "application/json"})


def room_for(gw: Gateway, size: int) -> bool:
    """Whether a body of ``size`` bytes would be held now: one for a model no replica
    serves is refused 404 once held, or 429 when there is no room for it."""
    status = post(gw, size, model="no-such-model").status_code
    assert status in (404, 429)
    return status == 404


def held_gateway(serve: Serve) -> tuple[Gateway, Behaviour]:
    b = Behaviour("r0", hold=threading.Event())
    gw = start_gateway(serve, [("r0", serve(fake_replica(b)).url)], max_body_bytes=4000,
                       limits=LIMITS)
    return gw, b


def test_a_body_stays_counted_until_its_answer_ends(serve: Serve) -> None:
    gw, b = held_gateway(serve)
    assert b.hold is not None
    answers: list[httpx.Response] = []
    first = threading.Thread(target=lambda: answers.append(post(gw, 3000)))
    first.start()
    try:
        # received whole long ago, still held by its request: waiting on its replica
        wait_until(lambda: len(b.received) == 1, 5, "the first request to reach r0")
        refused = post(gw, 3500)
        assert refused.status_code == 429
        assert refused.headers["retry-after"] == "1"
        error = refused.json()["error"]
        assert error["code"] == "gateway_overloaded"
        assert "limits.max_held_body_bytes" in error["message"] and "3000" in error["message"]
        assert room_for(gw, 2500)  # within what is left
        assert not room_for(gw, 3500)
    finally:
        b.hold.set()
        first.join()
    assert answers[0].status_code == 200
    assert room_for(gw, 3500)  # given back when its answer ended


def test_every_way_out_gives_the_bytes_back(serve: Serve) -> None:
    gw, b = held_gateway(serve)
    assert b.hold is not None
    # refused at the gateway (no such model, a malformed body), failed at the replica
    for _ in range(3):
        assert post(gw, 3500, model="no-such-model").status_code == 404
        bad = httpx.post(gw.url + "/v1/completions", content=b"{" + b" " * 3499,
                         headers={"content-type": "application/json"}, timeout=10)
        assert bad.status_code == 400
    b.status = 500
    for _ in range(2):  # (a third in a row would eject it)
        assert post(gw, 3500).status_code >= 500
    b.status = 200
    # the client gone while its request waits on the replica
    with pytest.raises(httpx.ReadTimeout):
        post(gw, 3500, timeout=0.5)
    wait_until(lambda: room_for(gw, 3500), 5, "the bytes of the request left to be given back")
    # served through /invocations, which reads the body twice: counted once
    b.hold.set()
    assert post(gw, 3500, path="/invocations").status_code == 200
    assert room_for(gw, 3500)


def test_the_limit_is_checked_and_split_between_workers() -> None:
    with pytest.raises(ConfigError, match=r"max_held_body_bytes \(1000\) must be at least"):
        parse_config({"max_body_bytes": 4000, "limits": {"max_held_body_bytes": 1000}})
    config = parse_config({"max_body_bytes": 4000,
                           "limits": {"max_held_body_bytes": 1_000_001}})
    assert share_of(config, 4).limits.max_held_body_bytes == 250_001
    assert share_of(config, 1000).limits.max_held_body_bytes == 4000  # one body at least
