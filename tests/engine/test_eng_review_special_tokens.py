"""vLLM's ``add_special_tokens`` asking for what the engine does not do (a completion's
prompt without the tokenizer's special tokens, a chat's rendering inside them) is refused
with a 400 naming the field, never ignored; its defaults, given or not, pass."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.engine_servers import LiveEngine, serve_engine

MODEL = "tiny-sim"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
COMPLETION = {"model": MODEL, "prompt": "hello there", "max_tokens": 1}


@pytest.fixture(scope="module")
def live() -> Iterator[LiveEngine]:
    yield from serve_engine(LiveEngine, MODEL)


@pytest.mark.parametrize(("path", "body", "status"), [
    ("/v1/completions", {**COMPLETION, "add_special_tokens": False}, 400),
    ("/v1/completions", {**COMPLETION, "add_special_tokens": True}, 200),
    ("/v1/completions", COMPLETION, 200),
    ("/v1/chat/completions", {**CHAT, "add_special_tokens": True}, 400),
    ("/v1/chat/completions", {**CHAT, "add_special_tokens": False}, 200),
    ("/tokenize", {"prompt": "hello there", "add_special_tokens": False}, 400),
    ("/tokenize", {"prompt": "hello there", "add_special_tokens": True}, 200),
    ("/tokenize", {"messages": CHAT["messages"], "add_special_tokens": True}, 400),
])
def test_add_special_tokens_other_than_the_routes_default_is_refused(
        live: LiveEngine, path: str, body: dict[str, Any], status: int) -> None:
    r = live.http.post(path, json=body)
    assert r.status_code == status, r.text
    if status == 400:
        error = r.json()["error"]
        assert error["param"] == "add_special_tokens"
        assert str(body["add_special_tokens"]).lower() in error["message"]
