"""Log probabilities on ``/v1/completions`` and ``/v1/chat/completions``, in vLLM's shapes,
against the official ``openai`` client and raw SSE (sim executor: every token's
log-probability is the uniform draw's, ``-log(span)``, its alternatives tied with it)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import pytest

from engine.openai_logprobs import MAX_LOGPROBS
from tests.support.engine_servers import LiveEngine, serve_engine

MODEL = "tiny-sim"
MESSAGES = [{"role": "user", "content": "name three colours"}]


@pytest.fixture(scope="module")
def live() -> Iterator[LiveEngine]:
    yield from serve_engine(LiveEngine, MODEL)


def _uniform(live: LiveEngine) -> float:
    return -math.log(live.server.core.executor._span)


def _events(live: LiveEngine, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    return live.stream(path, {**body, "model": MODEL})


def test_a_completion_lists_each_tokens_logprob_and_the_k_plus_one_candidates(
        live: LiveEngine) -> None:
    out = live.client.completions.create(model=MODEL, prompt="the colour of", max_tokens=6,
                                         seed=5, logprobs=2)
    lp = out.choices[0].logprobs
    assert lp is not None and out.usage is not None
    n = out.usage.completion_tokens
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == n == 6
    assert lp.token_logprobs == pytest.approx([_uniform(live)] * n)
    offsets = [0]
    for token, top in zip(lp.tokens, lp.top_logprobs, strict=True):
        assert token in top and 1 <= len(top) <= 3  # the sampled one, then the 2 likeliest
        offsets.append(offsets[-1] + len(token))
    assert lp.text_offset == offsets[:-1]
    alone = live.client.completions.create(model=MODEL, prompt="the colour of",
                                           max_tokens=6, seed=5, logprobs=0)
    assert alone.choices[0].text == out.choices[0].text
    assert [list(t) for t in alone.choices[0].logprobs.top_logprobs] \
        == [[t] for t in lp.tokens]
    plain = live.client.completions.create(model=MODEL, prompt="the colour of", max_tokens=2)
    assert plain.choices[0].logprobs is None


def test_a_chat_lists_each_tokens_logprob_bytes_and_top_k(live: LiveEngine) -> None:
    out = live.client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=5,
                                              seed=2, logprobs=True, top_logprobs=3)
    content = out.choices[0].logprobs.content
    assert len(content) == out.usage.completion_tokens == 5
    for entry in content:
        assert entry.logprob == pytest.approx(_uniform(live))
        assert entry.bytes == list(entry.token.encode())
        assert len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0].token == entry.token  # vLLM: the sampled one first
    bare = live.client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=5,
                                               seed=2, logprobs=True)
    assert [e.token for e in bare.choices[0].logprobs.content] == [e.token for e in content]
    assert all(e.top_logprobs == [] for e in bare.choices[0].logprobs.content)


@pytest.mark.parametrize("chat", [False, True])
def test_streamed_chunks_carry_the_logprobs_of_the_tokens_they_add(live: LiveEngine,
                                                                    chat: bool) -> None:
    if chat:
        path, body = "/v1/chat/completions", {"messages": MESSAGES, "logprobs": True,
                                              "top_logprobs": 2}
    else:
        path, body = "/v1/completions", {"prompt": "the colour of", "logprobs": 2}
    body = {**body, "max_tokens": 8, "seed": 9}
    whole = live.http.post(path, json={**body, "model": MODEL}).json()["choices"][0]
    chunks = [c["choices"][0] for c in _events(live, path, body)]
    if chat:
        assert chunks[0]["logprobs"] is None  # the role chunk
        entries = [e for c in chunks[1:] for e in c["logprobs"]["content"]]
        assert entries == whole["logprobs"]["content"]
        assert "".join(c["delta"].get("content", "") for c in chunks) \
            == whole["message"]["content"]
        return
    text = ""
    merged: dict[str, list[Any]] = {"tokens": [], "token_logprobs": [], "top_logprobs": [],
                                    "text_offset": []}
    for c in chunks:
        if c["logprobs"]["text_offset"]:  # counted from the text the chunks before sent
            assert c["logprobs"]["text_offset"][0] == len(text)
        for key in merged:
            merged[key] += c["logprobs"][key]
        text += c["text"]
    assert text == whole["text"]
    for key in ("tokens", "token_logprobs", "top_logprobs"):
        assert merged[key] == whole["logprobs"][key]


def test_tokens_a_stop_string_cut_keep_their_logprobs(live: LiveEngine) -> None:
    base = live.client.completions.create(model=MODEL, prompt="stop test", max_tokens=12,
                                          seed=3, logprobs=1).choices[0]
    stop = base.text[6:9]
    cut = live.client.completions.create(model=MODEL, prompt="stop test", max_tokens=12,
                                         seed=3, stop=[stop], logprobs=1)
    assert cut.choices[0].text == base.text[: base.text.index(stop)]
    tokens = cut.choices[0].logprobs.tokens
    # as vLLM: every generated token is listed, also those past the cut
    assert len(tokens) == cut.usage.completion_tokens
    assert len("".join(tokens)) >= len(cut.choices[0].text) + len(stop)
    assert tokens == base.logprobs.tokens[: len(tokens)]


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/completions", {"prompt": "x", "logprobs": MAX_LOGPROBS + 1}, "logprobs"),
    ("/v1/completions", {"prompt": "x", "logprobs": -1}, "logprobs"),
    ("/v1/completions", {"prompt": "x", "logprobs": True}, "logprobs"),
    ("/v1/completions", {"prompt": "x", "logprobs": 1, "echo": "maybe"}, "echo"),
    ("/v1/chat/completions", {"messages": MESSAGES, "top_logprobs": 2}, "top_logprobs"),
    ("/v1/chat/completions", {"messages": MESSAGES, "logprobs": True, "top_logprobs": 21},
     "top_logprobs"),
    # (1 and "true" read as true, as vLLM reads a boolean; 2 is none)
    ("/v1/chat/completions", {"messages": MESSAGES, "logprobs": 2}, "logprobs"),
])
def test_logprob_asks_out_of_range_are_refused(live: LiveEngine, path: str,
                                               body: dict[str, Any], param: str) -> None:
    r = live.http.post(path, json={**body, "model": MODEL, "max_tokens": 2})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
