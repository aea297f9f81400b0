"""A whole (non-streamed) Responses answer sent with 200 whose ``status`` says it failed
(or was cancelled) is relayed as it came and counted failed, as a stream's
``response.failed`` is: not an answered request."""

from __future__ import annotations

import httpx

from tests.support.fake_replica import Behaviour, fake_replica
from tests.support.gateway_harness import Serve, metric, start_gateway
from tests.support.waiting import wait_until


def test_a_whole_failed_response_counts_failed(serve: Serve) -> None:
    replica = Behaviour("r0")
    gw = start_gateway(serve, [("r0", serve(fake_replica(replica)).url)])
    ok = httpx.post(f"{gw.url}/v1/responses", json={"model": "sim-model", "input": "hi"})
    assert ok.status_code == 200 and ok.json()["status"] == "completed"
    replica.response_failed = True
    r = httpx.post(f"{gw.url}/v1/responses", json={"model": "sim-model", "input": "x"})
    assert r.status_code == 200 and r.json()["status"] == "failed"  # relayed as it came
    failed = 'kvgate_requests_total{replica="r0",route="round_robin",status="502"}'
    answered = 'kvgate_requests_total{replica="r0",route="round_robin",status="200"}'
    wait_until(lambda: metric(gw, failed) == 1, 5, "the failed response counted")
    assert metric(gw, answered) == 1  # the completed one alone
