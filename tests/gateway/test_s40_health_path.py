"""``health.path``: what a health check asks each replica for (``/health`` unless told): a
server whose health lives elsewhere (``/healthz``) is healthy and served through the
gateway, one whose told path is not found is not; a path no server could have is refused
naming it. A server without ``/health`` (404: Ollama's) is checked at ``/v1/models``."""

from __future__ import annotations

import re

import httpx
import pytest
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route

from gateway.config import ConfigError, parse_config
from tests.support.fake_replica import Behaviour, fake_replica
from tests.support.gateway_harness import AUTH, Serve, start_gateway


def _healthz_only(b: Behaviour) -> object:
    app = fake_replica(b)

    async def answer(request: Request) -> PlainTextResponse:
        ok = request.url.path == "/healthz"
        return PlainTextResponse("ok" if ok else "not found", 200 if ok else 404)
    app.router.routes[:0] = [Route("/health", answer), Route("/healthz", answer)]
    return app


@pytest.mark.parametrize("path, healthy", [("/healthz", True), ("/other", False)])
def test_replicas_are_checked_at_the_path_told(serve: Serve, path: str,
                                                healthy: bool) -> None:
    rec = Behaviour("rec")
    gw = start_gateway(serve, [("r0", serve(_healthz_only(rec)).url)],
                       health={"interval_s": 0.2, "timeout_s": 2.0, "failures_to_eject": 1,
                               "path": path})
    (state,) = httpx.get(f"{gw.admin}/admin/replicas", headers=AUTH,
                         timeout=10).json()["replicas"]
    assert state["healthy"] is healthy, state
    answer = httpx.post(f"{gw.url}/v1/completions", timeout=10, json={
        "model": "sim-model", "prompt": "hi", "max_tokens": 2})
    assert answer.status_code == (200 if healthy else 503), answer.text
    assert len(rec.received) == healthy


@pytest.mark.parametrize("path", ["health", "/a b", "/x\n", "/" + "x" * 256])
def test_a_path_no_server_could_have_is_refused_naming_it(path: str) -> None:
    said = re.escape(repr(path)[:20])
    with pytest.raises(ConfigError, match="health.path must be a path on the replica's "
                                          f"server that starts with /.*got {said}"):
        parse_config({"replicas": [{"id": "r0", "url": "http://127.0.0.1:1"}],
                      "health": {"path": path}})


def _without_health(b: Behaviour, models: int) -> object:
    """A server with no /health (Ollama's OpenAI endpoint): 404 there; its /v1/models
    answers ``models``."""
    app = fake_replica(b)

    async def answer(request: Request) -> PlainTextResponse:
        return PlainTextResponse("404 page not found", 404)

    async def listed(request: Request) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [{"id": b.model, "object": "model"}]},
                            models)
    app.router.routes[:0] = [Route("/health", answer), Route("/v1/models", listed)]
    return app


@pytest.mark.parametrize("models, healthy", [(200, True), (404, False)])
def test_a_server_without_health_is_checked_at_its_model_list(serve: Serve, models: int,
                                                              healthy: bool) -> None:
    rec = Behaviour("rec")
    gw = start_gateway(serve, [("r0", serve(_without_health(rec, models)).url)],
                       health={"interval_s": 0.2, "timeout_s": 2.0, "failures_to_eject": 1})
    (state,) = httpx.get(f"{gw.admin}/admin/replicas", headers=AUTH,
                         timeout=10).json()["replicas"]
    assert state["healthy"] is healthy, state
    if not healthy:  # both asks named
        assert "/health answered 404; GET " in state["last_error"], state
        assert "/v1/models answered 404" in state["last_error"], state
