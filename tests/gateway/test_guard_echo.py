"""What a hostile body sends back: an error names a bad value by its start, never by
the whole of it (a body may hold megabytes of one string)."""

from __future__ import annotations

import httpx

from tests.support.fake_replica import Behaviour, fake_replica
from tests.support.gateway_harness import Serve, start_gateway
from tests.support.waiting import wait_until


def test_an_unknown_models_404_names_its_start_only(serve: Serve) -> None:
    replica = serve(fake_replica(Behaviour("a")))
    gw = start_gateway(serve, [("a", replica.url)])
    wait_until(lambda: httpx.get(f"{gw.url}/v1/models").json()["data"], 10, "models known")
    name = "m" * 1_000_000
    r = httpx.post(f"{gw.url}/v1/completions", json={"model": name, "prompt": "x"},
                   timeout=10)
    error = r.json()["error"]
    assert r.status_code == 404 and error["code"] == "model_not_found", r.text[:300]
    assert error["param"] == "model" and "available: sim-model" in error["message"]
    assert "m" * 256 in error["message"] and len(r.content) < 1000, len(r.content)


def test_a_503_before_any_model_is_known_names_the_models_start_only(serve: Serve) -> None:
    replica = serve(fake_replica(Behaviour("a", healthy=False)))  # no model known, none up
    gw = start_gateway(serve, [("a", replica.url)])
    name = "m" * 1_000_000
    for path, body in (("/v1/completions", {"model": name, "prompt": "x"}),
                       ("/v1/embeddings", {"model": name, "input": "x"})):
        r = httpx.post(f"{gw.url}{path}", json=body, timeout=10)
        assert r.status_code == 503, r.text[:300]
        assert r.json()["error"]["code"] == "no_healthy_replica"
        assert "m" * 256 in r.text and len(r.content) < 1000, (path, len(r.content))
