"""A Responses request whose input item names its role or a part's type with no string
(an array, an object) is the client's error: answered 400 naming the field, counted as a
refusal, never sent on."""

from __future__ import annotations

import httpx
import pytest

from tests.support.fake_replica import Behaviour, fake_replica
from tests.support.gateway_harness import Serve, metric, start_gateway
from tests.support.waiting import wait_until


@pytest.mark.parametrize("item, param", [
    ({"role": ["user"], "content": "x"}, "input[0].role"),
    ({"type": "message", "role": {"is": "user"}, "content": "x"}, "input[0].role"),
    ({"role": "user", "content": [{"type": ["input_text"], "text": "x"}]},
     "input[0].content[0].type"),
    ({"role": "user", "content": [{"type": {}, "text": "x"}]}, "input[0].content[0].type"),
    ({"type": ["message"], "role": "user", "content": "x"}, "input[0].type"),
])
def test_an_item_role_or_type_that_is_no_string_is_a_bad_request(
        serve: Serve, item: dict[str, object], param: str) -> None:
    replica = Behaviour("a")
    gw = start_gateway(serve, [("a", serve(fake_replica(replica)).url)])
    wait_until(lambda: httpx.get(f"{gw.url}/ready").status_code == 200, 10, "a ready gateway")
    r = httpx.post(f"{gw.url}/v1/responses", json={"model": "sim-model", "input": [item]},
                   timeout=10)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert param in error["message"]
    assert replica.received == []
    assert metric(gw, 'kvgate_requests_total{replica="none",route="none",status="400"}') == 1
    assert metric(gw, 'kvgate_errors_total{kind="internal"}') == 0
