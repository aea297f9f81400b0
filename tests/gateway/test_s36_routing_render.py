"""The gateway renders a chat only to route it, with its own tokenizer, which may not be the
replicas': its chat template's refusal of the messages is not the answer (the chat is
routed on the built-in layout and its replica judges it), while a chat malformed whatever
the template is still the gateway's 400. Its ``add_generation_prompt`` and
``continue_final_message`` are read as the engine (and vLLM) read them: "no", 0 and
"false" are false, "yes", 1 and "true" true."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from kvwire.chat_messages import ChatFormatError
from kvwire.chat_template import TemplateRefused
from kvwire.tokenizer import load_tokenizer
from kvwire.tokenizer_build import ASSET_DIR
from tests.support.engine_servers import LiveEngine, serve_engine
from tests.support.gateway_harness import AUTH, Gateway, Serve, start_gateway

MODEL = "chatml-sim"
# a template that takes user and assistant turns only, in alternation (Mistral's, Gemma's)
STRICT = ("{% for m in messages %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
          "{{ raise_exception('Conversation roles must alternate user/assistant') }}"
          "{% endif %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}")
SYSTEM_CHAT = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def engine() -> Iterator[LiveEngine]:
    run = serve_engine(LiveEngine, MODEL)  # the built-in ChatML layout: takes a system turn
    try:
        yield next(run)
    finally:
        run.close()


def _strict_tokenizer(directory: Path) -> Path:
    shutil.copy(ASSET_DIR / "tokenizer.json", directory / "tokenizer.json")
    (directory / "tokenizer_config.json").write_text(json.dumps({"chat_template": STRICT}))
    return directory


def _chat(gw: Gateway, messages: Any, **body: Any) -> httpx.Response:
    return httpx.post(f"{gw.url}/v1/chat/completions", timeout=30,
                      json={"model": MODEL, "max_tokens": 1, "messages": messages, **body})


def _explained(gw: Gateway, messages: Any, **body: Any) -> httpx.Response:
    return httpx.post(f"{gw.admin}/admin/explain", headers=AUTH, timeout=30,
                      json={"model": MODEL, "max_tokens": 1, "messages": messages, **body})


def test_a_chat_the_gateways_template_refuses_reaches_its_replica(
        serve: Serve, engine: LiveEngine, tmp_path: Path) -> None:
    # the template's refusal is its own kind of ChatFormatError: the engine's 400 stays
    with pytest.raises(TemplateRefused, match="roles must alternate") as refused:
        load_tokenizer(_strict_tokenizer(tmp_path)).render_chat(SYSTEM_CHAT)
    assert isinstance(refused.value, ChatFormatError)
    assert engine.http.post("/v1/chat/completions", json={
        "model": MODEL, "max_tokens": 1, "messages": SYSTEM_CHAT}).status_code == 200
    gw = start_gateway(serve, [("e0", engine.url)], policy={"name": "cost"},
                       tokenizer=str(tmp_path))
    for extra in ({}, {"stream": True},
                  {"continue_final_message": True, "add_generation_prompt": False}):
        messages = [*SYSTEM_CHAT, {"role": "assistant", "content": "Sure"}] \
            if "continue_final_message" in extra else SYSTEM_CHAT
        answer = _chat(gw, messages, **extra)
        assert answer.status_code == 200, (extra, answer.text)
        assert answer.headers["x-kvgate-replica"] == "e0"
    explained = _explained(gw, SYSTEM_CHAT)
    assert explained.status_code == 200, explained.text
    assert explained.json()["prompt_tokens"] > 0
    # a chat malformed whatever the template is still refused by the gateway itself
    for messages, param in (([{"content": "hi"}], "messages[0].role"),
                            ("hi", "messages")):
        answer = _chat(gw, messages)
        assert answer.status_code == 400, answer.text
        assert "x-kvgate-replica" not in answer.headers
        assert answer.json()["error"]["param"] == param, answer.text


@pytest.mark.parametrize(("fields", "same_as"), [
    ({"add_generation_prompt": "no"}, {"add_generation_prompt": False}),
    ({"add_generation_prompt": 0}, {"add_generation_prompt": False}),
    ({"add_generation_prompt": "true"}, {}),
    ({"continue_final_message": "yes", "add_generation_prompt": "false"},
     {"continue_final_message": True, "add_generation_prompt": False}),
    ({"continue_final_message": 1, "add_generation_prompt": 0},
     {"continue_final_message": True, "add_generation_prompt": False}),
])
def test_the_turn_fields_are_read_as_the_engine_reads_them(
        serve: Serve, engine: LiveEngine, fields: dict[str, Any],
        same_as: dict[str, Any]) -> None:
    # kv_events encodes the whole chat: the gateway's count is its whole rendered prompt
    gw = start_gateway(serve, [("e0", engine.url)], policy={"name": "kv_events"})
    chat = [{"role": "user", "content": "Write a haiku"},
            {"role": "assistant", "content": "Autumn moon"}]
    answer = _chat(gw, chat, **fields)
    assert answer.status_code == 200, answer.text
    served = answer.json()["usage"]["prompt_tokens"]
    assert _chat(gw, chat, **same_as).json()["usage"]["prompt_tokens"] == served
    routed = _explained(gw, chat, **fields)
    assert routed.status_code == 200, routed.text
    assert routed.json()["prompt_tokens"] == served, (fields, routed.json())
