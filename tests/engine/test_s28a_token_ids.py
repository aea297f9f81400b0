"""vLLM's ``return_token_ids`` on the OpenAI routes: the prompt's ids and each choice's
output ids, whole or streamed (sim executor, seeded)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.engine_servers import LiveEngine, serve_engine

MODEL = "tiny-sim"
CHAT = [{"role": "user", "content": "name three colours"}]


@pytest.fixture(scope="module")
def live() -> Iterator[LiveEngine]:
    yield from serve_engine(LiveEngine, MODEL)


def _logprob_ids(tokens: list[str]) -> list[int]:
    return [int(t.removeprefix("token_id:")) for t in tokens]


def test_a_completion_answers_each_choices_prompt_and_output_ids(live: LiveEngine) -> None:
    out = live.client.completions.create(
        model=MODEL, prompt="the colour of", max_tokens=5, seed=3, n=2, logprobs=0,
        extra_body={"return_token_ids": True, "return_tokens_as_token_ids": True})
    prompt = live.http.post("/tokenize", json={"model": MODEL, "prompt": "the colour of"})
    for choice in out.choices:
        extra = choice.model_extra or {}
        assert extra["prompt_token_ids"] == prompt.json()["tokens"]
        assert extra["token_ids"] == _logprob_ids(choice.logprobs.tokens)  # type: ignore[union-attr]
        assert len(extra["token_ids"]) == 5
        decoded = live.http.post("/detokenize", json={"tokens": extra["token_ids"]})
        assert decoded.json()["prompt"] == choice.text
    # a stream: the prompt's ids in each choice's first chunk, the output ids in pieces
    chunks = live.stream("/v1/completions", {
        "model": MODEL, "prompt": "the colour of", "max_tokens": 5, "seed": 3, "n": 2,
        "return_token_ids": True})
    for i, whole in enumerate(out.choices):
        mine = [c["choices"][0] for c in chunks if c["choices"][0]["index"] == i]
        assert mine[0]["prompt_token_ids"] == prompt.json()["tokens"]
        assert all("prompt_token_ids" not in c for c in mine[1:])
        streamed = [t for c in mine for t in c["token_ids"]]
        assert streamed == (whole.model_extra or {})["token_ids"]
    plain = live.http.post("/v1/completions", json={"model": MODEL, "prompt": "x",
                                                     "max_tokens": 2}).json()
    assert "token_ids" not in plain["choices"][0]


def test_a_chat_answers_its_prompt_ids_at_the_top_and_each_choices_output_ids(
        live: LiveEngine) -> None:
    body: dict[str, Any] = {"model": MODEL, "messages": CHAT, "max_tokens": 6, "seed": 5,
                            "n": 2, "logprobs": True, "return_token_ids": True,
                            "return_tokens_as_token_ids": True}
    whole = live.http.post("/v1/chat/completions", json=body).json()
    prompt = live.http.post("/tokenize", json={"model": MODEL, "messages": CHAT})
    assert whole["prompt_token_ids"] == prompt.json()["tokens"]
    for choice in whole["choices"]:
        assert choice["token_ids"] == _logprob_ids(
            [entry["token"] for entry in choice["logprobs"]["content"]])
    chunks = live.stream("/v1/chat/completions",
                         {**body, "stream_options": {"include_usage": True}})
    assert chunks[0]["prompt_token_ids"] == prompt.json()["tokens"]
    assert all("prompt_token_ids" not in c for c in chunks[1:])
    for i, choice in enumerate(whole["choices"]):
        mine = [c["choices"][0] for c in chunks if c["choices"]
                and c["choices"][0]["index"] == i]
        assert [t for c in mine for t in c.get("token_ids", [])] == choice["token_ids"]
