"""A pass-through request (embeddings, rerank, tokenize...) whose ``model`` is no
string is refused 400 with a message naming the value it sent, as the
completion endpoints name it, and counted under the pass-through route."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.support.fake_replica import Behaviour, fake_replica
from tests.support.gateway_harness import Serve, metric, start_gateway
from tests.support.waiting import wait_until


@pytest.mark.parametrize("path", ["/v1/embeddings", "/invocations"])
def test_a_model_that_is_no_string_is_named_in_the_refusal(serve: Serve, path: str) -> None:
    replica = Behaviour("a")
    gw = start_gateway(serve, [("a", serve(fake_replica(replica)).url)])
    wait_until(lambda: httpx.get(f"{gw.url}/ready").status_code == 200, 10, "a ready gateway")
    # (an empty name is the fleet's one model's, as vLLM reads it: served)
    for model, shown in ((5, "5"), (["e5-large"], "an array of 1"), ({"id": "x"}, "an object")):
        r = httpx.post(f"{gw.url}{path}", timeout=10,
                       content=json.dumps({"model": model, "input": "x"}))
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["param"] == "model" and shown in error["message"], error
    assert replica.received == []
    assert metric(gw, 'kvgate_requests_total{replica="none",route="passthrough",status="400"}'
                  ) == 3
