"""Through a served engine whose model has a chat template: a history's tool call without
its id is refused with a 400 naming it (as vLLM refuses it), not rendered with the id
``None``; a Responses request's reasoning items reach the template as the reasoning of
the assistant turn they belong to (an encrypted one refused), not dropped; a request the
KV cache can never hold is a 400 naming the field at fault."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from kvwire.tokenizer import PromptTokenizer, load_tokenizer
from kvwire.tokenizer_build import ASSET_DIR
from tests.support.loop_check import served_engine

MODEL = "m"
# writes every field these fixes reach: a turn's reasoning, its calls and their ids
TEMPLATE = (
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n"
    "{%- if m.reasoning_content %}<think>{{ m.reasoning_content }}</think>{% endif %}"
    "{{ m.content }}{% for c in m.tool_calls or [] %}<call {{ c.id }}: {{ c.function.name }}>"
    "{% endfor %}<|im_end|>\n{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}")
CONTEXT_TOKENS = 512
CACHE_TOKENS = 32 * 4  # 32 blocks of 4: less than the context


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[httpx.Client,
                                                                        PromptTokenizer]]:
    """A client of the served engine, and the tokenizer it renders chats with."""
    folder = tmp_path_factory.mktemp("templated")
    shutil.copy(ASSET_DIR / "tokenizer.json", folder / "tokenizer.json")
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": TEMPLATE}))
    tok = load_tokenizer(folder)
    with served_engine(tok, MODEL, num_blocks=CACHE_TOKENS // 4, block_size=4,
                       vocab=(259, 4096), max_model_len=CONTEXT_TOKENS) as http:
        yield http, tok


def _call(**extra: Any) -> dict[str, Any]:
    return {"type": "function", "function": {"name": "lookup", "arguments": "{}"}, **extra}


@pytest.mark.parametrize("path", ["/tokenize", "/v1/chat/completions"])
@pytest.mark.parametrize("call", [_call(), _call(id=None)])
def test_a_tool_call_without_its_id_is_refused_naming_it(
        engine: tuple[httpx.Client, PromptTokenizer], path: str, call: dict[str, Any]) -> None:
    http, _ = engine
    chat = [{"role": "user", "content": "clause 7?"},
            {"role": "assistant", "content": None, "tool_calls": [_call(id="c1"), call]}]
    r = http.post(path, json={"model": MODEL, "messages": chat, "max_tokens": 1})
    assert r.status_code == 400, r.text  # it was rendered as "<call None: lookup>"
    error = r.json()["error"]
    assert error["param"] == "messages[1].tool_calls[1].id"
    assert "must be a string" in error["message"]
    named = [chat[0], {**chat[1], "tool_calls": [_call(id="c1")]}]
    good = http.post(path, json={"model": MODEL, "messages": named, "max_tokens": 1})
    assert good.status_code == 200, good.text


def test_a_reasoning_item_is_the_reasoning_of_its_assistant_turn(
        engine: tuple[httpx.Client, PromptTokenizer]) -> None:
    http, tok = engine
    items = [{"role": "user", "content": "clause 7?"},
             {"type": "reasoning", "id": "rs_1", "summary": [
                 {"type": "summary_text", "text": "look it up"}]},
             {"type": "function_call", "call_id": "c1", "name": "lookup", "arguments": "{}"},
             {"type": "function_call_output", "call_id": "c1", "output": "ninety days"}]
    r = http.post("/v1/responses", json={"model": MODEL, "input": items,
                                         "max_output_tokens": 1})
    assert r.status_code == 200, r.text
    # the chat vLLM makes of these items: the reasoning and the call are one turn
    chat = [{"role": "user", "content": "clause 7?"},
            {"role": "assistant", "content": "", "reasoning": "look it up",
             "tool_calls": [_call(id="c1")]},
            {"role": "tool", "tool_call_id": "c1", "content": "ninety days"}]
    text = tok.render_chat(chat)
    assert "<think>look it up</think><call c1: lookup>" in text
    assert r.json()["usage"]["input_tokens"] == len(tok.encode(text))
    # reasoning the engine cannot read is refused, naming it
    hidden = {"type": "reasoning", "id": "rs_2", "summary": [], "encrypted_content": "gAAA"}
    r = http.post("/v1/responses", json={"model": MODEL, "input": [items[0], hidden]})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "input[1].encrypted_content"


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                              "max_tokens": CACHE_TOKENS}, "max_tokens"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                              "max_completion_tokens": CACHE_TOKENS}, "max_completion_tokens"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "word " * 200}],
                              "max_tokens": 1}, "messages"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": CACHE_TOKENS}, "max_tokens"),
    ("/v1/completions", {"prompt": "word " * 200, "max_tokens": 1}, "prompt"),
    ("/v1/responses", {"input": "hi", "max_output_tokens": CACHE_TOKENS},
     "max_output_tokens"),
    ("/v1/responses", {"input": "word " * 200, "max_output_tokens": 1}, "input"),
    ("/generate", {"text": "hi", "sampling_params": {"max_new_tokens": CACHE_TOKENS}},
     "sampling_params.max_new_tokens"),
    ("/generate", {"text": "word " * 200, "sampling_params": {"max_new_tokens": 1}}, "text"),
])
def test_a_request_the_kv_cache_cannot_hold_names_its_field(
        engine: tuple[httpx.Client, PromptTokenizer], path: str, body: dict[str, Any],
        param: str) -> None:
    http, _ = engine
    r = http.post(path, json={"model": MODEL, **body})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert "KV cache" in error["message"], error  # within the context, past the cache
    assert error["param"] == param, error
