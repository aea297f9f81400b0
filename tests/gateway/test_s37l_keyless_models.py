"""A replica whose ``/v1/models`` refuses the gateway (started with ``--api-key``, the
clients holding the key and the gateway forwarding their ``Authorization``) is listed and
routed under the model its ``/metrics`` name (vLLM's and SGLang's ``model_name`` label, on a
page served without a key), with the warning that asks for its ``api_key`` given once. A
page refused too, or naming no model, leaves it as before: no model known of it."""

from __future__ import annotations

import dataclasses
import logging

import httpx
import openai
import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from engine.server import EngineServer, build_app
from gateway.replica_metrics import ScrapedMetrics, parse_metrics
from kvwire.tokenizer import load_tokenizer
from tests.support.engine_servers import served_core
from tests.support.fake_replica import Behaviour, fake_replica
from tests.support.gateway_harness import Gateway, Serve, metric, start_gateway
from tests.support.waiting import wait_until

KEY = "replica-key-0123456789abcdef"
MODEL = "tiny-sim"
BEARER = {"authorization": f"Bearer {KEY}"}
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
WANTS_KEY = "the replica wants an API key"


def _keyed_engine(serve: Serve) -> str:
    """A tiny sim engine serving ``MODEL`` with ``KEY`` (every route but /health, /version
    and /metrics needs it): its URL."""
    srv = EngineServer(served_core(), load_tokenizer(None), model_name=MODEL,
                       sleep_modeled_time=True)
    return serve(build_app(srv, api_key=KEY)).url


def _listed(gw: Gateway) -> list[dict[str, object]]:
    data: list[dict[str, object]] = httpx.get(f"{gw.url}/v1/models", headers=BEARER,
                                              timeout=10).json()["data"]
    return data


def wait_for_metric_at_least(gw: Gateway, series: str, least: float) -> None:
    wait_until(lambda: (metric(gw, series) or 0.0) >= least, 10, f"{series} >= {least}")


def test_a_keyed_replica_is_listed_under_the_model_its_metrics_name(
        serve: Serve, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="kvgate.monitor")
    # its model list asked for again every 0.2 s: refused each time
    gw = start_gateway(serve, [("k", _keyed_engine(serve))], health={
        "interval_s": 0.2, "timeout_s": 2.0, "failures_to_eject": 1, "models_refresh_s": 0.2})
    wait_until(lambda: _listed(gw), 10, "the keyed replica's model to be listed")
    card = _listed(gw)
    assert [(c["id"], c["root"], c["parent"]) for c in card] == [(MODEL, MODEL, None)]
    assert "max_model_len" not in card[0]  # /v1/models would tell it; /metrics does not
    # vLLM's quickstart, through the gateway
    with openai.OpenAI(base_url=f"{gw.url}/v1", api_key=KEY, max_retries=0) as client:
        assert client.models.list().data[0].id == MODEL
    # a request naming no model is for the fleet's one model, as vLLM serves it
    answer = httpx.post(f"{gw.url}/v1/chat/completions", json=CHAT, headers=BEARER,
                        timeout=30)
    assert answer.status_code == 200, answer.text
    assert answer.json()["model"] == MODEL
    # the warning asking for its api_key, once, whatever the refusals that follow
    wait_for_metric_at_least(gw, 'kvgate_replica_auth_failures_total{replica="k"}', 4)
    assert [c["id"] for c in _listed(gw)] == [MODEL]
    warned = [r.getMessage() for r in caplog.records if WANTS_KEY in r.getMessage()]
    assert len(warned) == 1 and "replica k: /v1/models answered 401" in warned[0], warned
    told = [r.getMessage() for r in caplog.records if "its /metrics name" in r.getMessage()]
    assert len(told) == 1 and MODEL in told[0] and "api_key" in told[0], told


def test_a_keyed_replica_gets_its_models_requests_in_a_mixed_fleet(serve: Serve) -> None:
    other = Behaviour("o", model="sim-model")  # lists its model to the gateway
    gw = start_gateway(serve, [("k", _keyed_engine(serve)),
                               ("o", serve(fake_replica(other)).url)])
    wait_until(lambda: {c["id"] for c in _listed(gw)} == {MODEL, "sim-model"}, 10,
               "both replicas' models to be listed")
    for _ in range(3):
        answer = httpx.post(f"{gw.url}/v1/chat/completions", json={**CHAT, "model": MODEL},
                            headers=BEARER, timeout=30)
        assert answer.status_code == 200, answer.text
        assert answer.json()["model"] == MODEL
    assert other.received == []  # the other replica serves another model


def _keyless_replica(page: str, metrics_status: int = 200) -> tuple[Starlette, list[str]]:
    """A replica whose /v1/models and completions want a key the gateway lacks, its
    /metrics ``page`` open (or answering ``metrics_status``): its app, and the paths of
    the calls it answered."""
    calls: list[str] = []

    async def health(request: Request) -> Response:
        return PlainTextResponse("ok")

    async def models(request: Request) -> Response:
        calls.append(request.url.path)
        return JSONResponse({"error": {"message": "no key"}}, status_code=401)

    async def metrics(request: Request) -> Response:
        calls.append(request.url.path)
        return PlainTextResponse(page, status_code=metrics_status)

    async def chat(request: Request) -> Response:
        calls.append(request.url.path)
        if request.headers.get("authorization") != BEARER["authorization"]:
            return JSONResponse({"error": {"message": "no key"}}, status_code=401)
        body = orjson.loads(await request.body())
        return JSONResponse({"id": "c", "object": "chat.completion", "model": body["model"],
                             "choices": [{"index": 0, "finish_reason": "stop", "message": {
                                 "role": "assistant", "content": "ok"}}]})

    return Starlette(routes=[Route("/health", health), Route("/v1/models", models),
                             Route("/metrics", metrics),
                             Route("/v1/chat/completions", chat, methods=["POST"])]), calls


VLLM_PAGE = ("# TYPE vllm:num_requests_running gauge\n"
             'vllm:num_requests_running{engine="0",model_name="base"} 0.0\n')
LORA_PAGE = VLLM_PAGE + (
    "# TYPE vllm:lora_requests_info gauge\n"
    'vllm:lora_requests_info{max_lora="4",running_lora_adapters="",'
    'waiting_lora_adapters=""} 1.0\n')


def test_a_page_showing_adapters_sends_unnamed_models_there_too(serve: Serve) -> None:
    app, _ = _keyless_replica(LORA_PAGE)
    gw = start_gateway(serve, [("k", serve(app).url)])
    wait_until(lambda: _listed(gw), 10, "the replica's model to be listed")
    assert [c["id"] for c in _listed(gw)] == ["base"]
    # an adapter the page cannot name is not refused as unknown: the replica is asked
    answer = httpx.post(f"{gw.url}/v1/chat/completions", json={**CHAT, "model": "sql-lora"},
                        headers=BEARER, timeout=30)
    assert answer.status_code == 200, answer.text
    assert answer.json()["model"] == "sql-lora"


@pytest.mark.parametrize(("page", "status"), [
    (VLLM_PAGE, 401),  # /metrics wants the key too
    (VLLM_PAGE.replace('engine="0",model_name="base"', 'engine="0"'), 200),  # no name
], ids=["metrics-refused", "no-model-name"])
def test_no_model_named_on_an_open_page_leaves_none_known(serve: Serve, page: str,
                                                          status: int) -> None:
    app, calls = _keyless_replica(page, status)
    gw = start_gateway(serve, [("k", serve(app).url)])
    # one scrape is taken whole before the next is sent
    wait_until(lambda: calls.count("/metrics") >= 2, 10, "two scrapes of the replica")
    assert _listed(gw) == []


def test_the_served_names_are_read_from_either_dialect_and_cross_to_followers() -> None:
    sglang = parse_metrics(
        "# TYPE sglang:num_running_reqs gauge\n"
        'sglang:num_running_reqs{model_name="qwen",tp_rank="0",pp_rank="0"} 1.0\n'
        'sglang:num_running_reqs{model_name="qwen",tp_rank="1",pp_rank="0"} 1.0\n')
    assert (sglang.dialect, sglang.model_names, sglang.serves_adapters) == \
        ("sglang", ("qwen",), False)
    vllm = parse_metrics(LORA_PAGE)
    assert (vllm.dialect, vllm.model_names, vllm.serves_adapters) == ("vllm", ("base",), True)
    # a follower worker reads the leader's scrape back from JSON
    assert ScrapedMetrics(**orjson.loads(orjson.dumps(dataclasses.asdict(vllm)))) == vllm
