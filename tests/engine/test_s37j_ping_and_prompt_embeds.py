"""vLLM's answers where the engine differed: ``/ping`` (SageMaker's health check, GET or
POST) answers as ``/health``, open without the API key as on vLLM; a completion carrying
``prompt_embeds`` is refused with a 400 naming it (vLLM's, unless started with
``--enable-prompt-embeds``), never served with the embeddings dropped beside a prompt."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from engine.server import EngineServer, build_app
from kvwire.tokenizer import load_tokenizer
from tests.support.engine_servers import served_core
from tests.support.gateway_harness import Serve

KEY = "engine-key-0123456789abcdef"
MODEL = "tiny-sim"
KEYED = {"authorization": f"Bearer {KEY}"}


@pytest.fixture
def engine_url(serve: Serve) -> str:
    srv = EngineServer(served_core(), load_tokenizer(None), model_name=MODEL,
                       sleep_modeled_time=True)
    return serve(build_app(srv, api_key=KEY)).url


def test_ping_answers_as_health_without_the_key(engine_url: str) -> None:
    health = httpx.get(f"{engine_url}/health")
    assert health.status_code == 200
    for method in ("GET", "POST"):
        r = httpx.request(method, f"{engine_url}/ping")
        assert r.status_code == 200, (method, r.status_code, r.text)
    # the key is still asked of the routes that serve the model
    assert httpx.post(f"{engine_url}/v1/completions", json={
        "model": MODEL, "prompt": "x", "max_tokens": 1}).status_code == 401


@pytest.mark.parametrize("body", [
    {"prompt": "hello there", "prompt_embeds": "AAAAPw=="},  # beside a prompt: not dropped
    {"prompt_embeds": "AAAAPw=="},
    {"prompt_embeds": ["AAAAPw==", "AAAAQA=="]},
])
def test_prompt_embeds_are_refused_naming_them(engine_url: str, body: dict[str, Any]
                                               ) -> None:
    r = httpx.post(f"{engine_url}/v1/completions", headers=KEYED,
                   json={"model": MODEL, "max_tokens": 2, **body})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "prompt_embeds", error
    assert "--enable-prompt-embeds" in error["message"], error


def test_a_null_prompt_embeds_is_no_embeddings(engine_url: str) -> None:
    r = httpx.post(f"{engine_url}/v1/completions", headers=KEYED, json={
        "model": MODEL, "prompt": "hello there", "prompt_embeds": None, "max_tokens": 2})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["finish_reason"] == "length"
