"""A 5xx counts against its replica only once another replica answered the request
(docs/errors-and-limits.md): a model's one replica that fails a request with a 500, again
and again, is not ejected by it (ejecting the only replica could not help: the model's
other requests would get 503s), and the client gets the replica's own status."""

from __future__ import annotations

import httpx

from tests.support.fake_replica import Behaviour, fake_replica
from tests.support.gateway_harness import Serve, metric, start_gateway

BODY = {"model": "sim-model", "prompt": "a prompt that breaks the engine", "max_tokens": 2}


def test_a_lone_replicas_5xx_is_not_counted_against_it(serve: Serve) -> None:
    only = Behaviour("only", status=500)
    gw = start_gateway(serve, [("only", serve(fake_replica(only)).url)])
    for _ in range(5):  # past request_failures_to_eject (3)
        r = httpx.post(f"{gw.url}/v1/completions", json=BODY)
        assert r.status_code == 500, r.text
    assert metric(gw, 'kvgate_replica_healthy{replica="only"}') == 1.0
    only.status = 200
    assert httpx.post(f"{gw.url}/v1/completions", json=BODY).status_code == 200
