"""``unlisted_model``: a request naming a model no replica lists is refused 404 naming the
models served (``refuse``, the default; its message says how to pass it on), or, with
``pass``, sent with its body unchanged to the replicas of the fleet's one base model (they
answer the name as they would without the gateway: SGLang and TGI serve any name), routed
and counted as that model. A fleet of several models refuses it either way."""

from __future__ import annotations

import json

import httpx
import pytest

from gateway.config import ConfigError, parse_config
from tests.support.fake_replica import Behaviour, fake_replica
from tests.support.gateway_harness import Serve, start_gateway

ASK = {"model": "default", "prompt": "hi", "max_tokens": 2}


def _fleet(serve: Serve, unlisted: str, models: tuple[str, ...] = ("sim-model",)
           ) -> tuple[str, list[Behaviour]]:
    recs = [Behaviour(f"rec{i}", model=model) for i, model in enumerate(models)]
    gw = start_gateway(serve, [(f"r{i}", serve(fake_replica(rec)).url)
                               for i, rec in enumerate(recs)],
                       scrape={"enabled": False}, unlisted_model=unlisted)
    return gw.url, recs


def test_refused_by_default_naming_the_setting(serve: Serve) -> None:
    url, (rec,) = _fleet(serve, "refuse")
    answer = httpx.post(f"{url}/v1/completions", json=ASK, timeout=10)
    assert answer.status_code == 404
    error = answer.json()["error"]
    assert error["code"] == "model_not_found" and "available: sim-model" in error["message"]
    assert "unlisted_model: pass" in error["message"]
    assert rec.received == []


def test_passed_on_unchanged_to_the_one_base_models_replicas(serve: Serve) -> None:
    url, (rec,) = _fleet(serve, "pass")
    listed = rec.listed
    for stream in (False, True):
        answer = httpx.post(f"{url}/v1/completions", json={**ASK, "stream": stream},
                            timeout=10)
        assert answer.status_code == 200, answer.text
    assert [json.loads(raw)["model"] for raw in rec.received] == ["default", "default"]
    # without asking for the replicas' models again first: a round's wait each time
    assert rec.listed == listed
    # counted as the model it was routed as: a client's names make no new series
    page = httpx.get(f"{url}/metrics", timeout=10).text
    counts = [line for line in page.splitlines()
              if line.startswith("kvgate_request_duration_seconds_count{")
              and not line.endswith(" 0.0")]
    assert len(counts) == 1 and 'model="sim-model"' in counts[0] \
        and counts[0].endswith(" 2.0"), counts


def test_a_fleet_of_several_models_refuses_it_either_way(serve: Serve) -> None:
    url, recs = _fleet(serve, "pass", ("model-a", "model-b"))
    listed = [rec.listed for rec in recs]
    answer = httpx.post(f"{url}/v1/completions", json=ASK, timeout=10)
    assert answer.status_code == 404
    assert "unlisted_model" not in answer.json()["error"]["message"]
    assert sum(rec.listed for rec in recs) > sum(listed)  # looked for again first
    assert all(rec.received == [] for rec in recs)


def test_another_setting_is_refused_naming_it() -> None:
    with pytest.raises(ConfigError, match="unlisted_model must be 'pass' or 'refuse', got "
                                          "'serve'"):
        parse_config({"replicas": [{"id": "r0", "url": "http://127.0.0.1:1"}],
                      "unlisted_model": "serve"})
