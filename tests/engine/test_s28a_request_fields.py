"""Request fields vLLM's OpenAI server answers or refuses that the engine must not ignore:
a request's own chat template and logits processors (refused by vLLM unless its server
was started to trust them)."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from tests.support.engine_servers import LiveEngine, serve_engine

MODEL = "tiny-sim"
CHAT = [{"role": "user", "content": "name three colours"}]


@pytest.fixture(scope="module")
def live() -> Iterator[LiveEngine]:
    yield from serve_engine(LiveEngine, MODEL)


def test_a_chat_template_given_with_the_request_is_refused_naming_it(live: LiveEngine) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        live.client.chat.completions.create(
            model=MODEL, messages=CHAT, max_tokens=2,  # type: ignore[arg-type]
            extra_body={"chat_template": "{{ messages[0]['content'] }}"})
    assert refused.value.body["param"] == "chat_template"  # type: ignore[index]
    assert "{{ messages[0]" in refused.value.body["message"]  # type: ignore[index]
    r = live.http.post("/tokenize", json={"model": MODEL, "messages": CHAT,
                                          "chat_template": "{{ 1 }}"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "chat_template"
    # null asks for the model's own, as does a completion's (no chat to render)
    plain = live.http.post("/v1/chat/completions", json={
        "model": MODEL, "messages": CHAT, "max_tokens": 2, "chat_template": None})
    assert plain.status_code == 200, plain.text
    completion = live.http.post("/v1/completions", json={
        "model": MODEL, "prompt": "x", "max_tokens": 2, "chat_template": "{{ 1 }}"})
    assert completion.status_code == 200, completion.text


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
def test_logits_processors_are_refused_naming_the_field(live: LiveEngine, route: str) -> None:
    body = {"model": MODEL, "max_tokens": 2, "prompt": "x", "messages": CHAT}
    r = live.http.post(route, json={**body, "logits_processors": ["my.module.Proc"]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "logits_processors"
    assert live.http.post(route, json={**body, "logits_processors": []}).status_code == 200
