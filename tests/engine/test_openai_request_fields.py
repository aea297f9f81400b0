"""Request fields of the OpenAI routes that change what the engine does, honoured as vLLM
honours them (sim executor): how a chat is rendered, prompt truncation, token ids in log
probabilities, usage on every streamed chunk, token strings from ``/tokenize`` and
batched completion prompts."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.engine_servers import LiveEngine, serve_engine

MODEL = "tiny-sim"
STORY = [{"role": "user", "content": "tell a story"},
         {"role": "assistant", "content": "Once upon a"}]


@pytest.fixture(scope="module")
def live() -> Iterator[LiveEngine]:
    yield from serve_engine(LiveEngine, MODEL)


def _tokens(live: LiveEngine, body: dict[str, Any]) -> list[int]:
    r = live.http.post("/tokenize", json=body)
    assert r.status_code == 200, r.text
    tokens: list[int] = r.json()["tokens"]
    return tokens


def test_continue_final_message_leaves_the_assistant_turn_open(live: LiveEngine) -> None:
    tok = live.server.tokenizer
    open_turn = tok.encode("<|im_start|>user\ntell a story<|im_end|>\n"
                           "<|im_start|>assistant\nOnce upon a")
    asked = {"add_generation_prompt": False, "continue_final_message": True}
    assert _tokens(live, {"messages": STORY, **asked}) == open_turn
    out = live.client.chat.completions.create(model=MODEL, messages=STORY, max_tokens=2,
                                              extra_body=asked)
    assert out.usage is not None and out.usage.prompt_tokens == len(open_turn)
    # without the header of a new assistant turn, and with it (the default)
    closed = tok.encode(tok.render_chat(STORY, add_generation_prompt=False))
    assert _tokens(live, {"messages": STORY, "add_generation_prompt": False}) == closed
    assert _tokens(live, {"messages": STORY}) == tok.encode(tok.render_chat(STORY))


@pytest.mark.parametrize(("body", "said"), [
    ({"messages": STORY, "continue_final_message": True}, "cannot both be true"),
    ({"messages": STORY[:1], "continue_final_message": True, "add_generation_prompt": False},
     "got role 'user'"),
])
def test_a_final_message_that_cannot_be_continued_is_refused(
        live: LiveEngine, body: dict[str, Any], said: str) -> None:
    for path, extra in (("/v1/chat/completions", {"model": MODEL}), ("/tokenize", {})):
        r = live.http.post(path, json={**body, **extra})
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["param"] == "continue_final_message" and said in error["message"]
