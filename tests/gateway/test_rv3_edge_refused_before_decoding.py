"""At its limit the gateway refuses a request (429 with Retry-After) once its body is read
and before it is decoded: the body was decoded (a large one on a thread, some 24 times
its bytes), checked, its model looked up (an unknown one asked of every replica) and
salted, all for a request that was then refused, at the moment the gateway had least to
spare."""

from __future__ import annotations

import threading

import httpx

from tests.support.fake_replica import Behaviour, fake_replica
from tests.support.gateway_harness import Serve, start_gateway
from tests.support.waiting import wait_until

BAD_BODIES = [b'{"model": "sim-model", "prompt": ',  # not JSON
              b'{"model": "no-such-model", "prompt": "hi"}']  # no replica serves it


def test_a_request_past_the_limit_is_refused_before_its_body_is_decoded(
        serve: Serve) -> None:
    held = Behaviour("r0", hold=threading.Event())
    gw = start_gateway(serve, [("r0", serve(fake_replica(held)).url)],
                       scrape={"enabled": False}, limits={"max_in_flight": 1})
    answers: list[httpx.Response] = []
    first = threading.Thread(target=lambda: answers.append(httpx.post(
        f"{gw.url}/v1/completions", json={"model": "sim-model", "prompt": "hi"},
        timeout=30)))
    first.start()
    try:
        wait_until(lambda: held.received, 10, "the first request to reach its replica")
        for path, body in [(p, b) for p in ("/v1/completions", "/invocations")
                           for b in BAD_BODIES]:
            refused = httpx.post(f"{gw.url}{path}", content=body, timeout=10,
                                 headers={"content-type": "application/json"})
            assert refused.status_code == 429, (path, body, refused.text)
            assert refused.json()["error"]["code"] == "gateway_overloaded"
            assert int(refused.headers["retry-after"]) >= 1
    finally:
        assert held.hold is not None
        held.hold.set()
        first.join(30)
    assert [a.status_code for a in answers] == [200]
    # with a place free, the same bodies get what is wrong with them
    assert [httpx.post(f"{gw.url}/v1/completions", content=body, timeout=10,
                       headers={"content-type": "application/json"}).status_code
            for body in BAD_BODIES] == [400, 404]
    assert len(held.received) == 1
