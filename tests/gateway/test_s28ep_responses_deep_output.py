"""A Responses ``function_call_output`` whose output is JSON nested deeper than the chat's
text of it can be written (254 levels; a request body may nest 1024) is the client's
error: answered 400 naming the item's output and counted, never a 500."""

from __future__ import annotations

import httpx

from tests.support.fake_replica import Behaviour, fake_replica
from tests.support.gateway_harness import Serve, metric, start_gateway
from tests.support.waiting import wait_until


def test_a_function_output_nested_too_deep_is_a_bad_request(serve: Serve) -> None:
    replica = Behaviour("a")
    gw = start_gateway(serve, [("a", serve(fake_replica(replica)).url)])
    wait_until(lambda: httpx.get(f"{gw.url}/ready").status_code == 200, 10, "a ready gateway")
    deep = "[" * 400 + "1" + "]" * 400
    body = (b'{"model": "sim-model", "input": [{"type": "function_call_output", '
            b'"call_id": "c1", "output": ' + deep.encode() + b"}]}")
    r = httpx.post(f"{gw.url}/v1/responses", content=body, timeout=10,
                   headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "input[0].output" and "input[0].output" in error["message"]
    assert replica.received == []
    assert metric(gw, 'kvgate_requests_total{replica="none",route="none",status="400"}') == 1
    assert metric(gw, 'kvgate_errors_total{kind="internal"}') == 0
    # an output nested as deep as can be written is still a tool message's text
    fine = body.replace(deep.encode(), b"[" * 200 + b"1" + b"]" * 200)
    assert httpx.post(f"{gw.url}/v1/responses", content=fine, timeout=10,
                      headers={"content-type": "application/json"}).status_code == 200
