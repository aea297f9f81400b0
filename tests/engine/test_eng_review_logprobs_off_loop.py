"""A whole answer naming the log probabilities of a long prompt (an eval harness's echoed
prompt, ``prompt_logprobs``) is rendered in a worker thread: the event loop, and every
stream it serves, stays free meanwhile; a short one is rendered on the loop."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from kvwire.tokenizer import load_tokenizer
from tests.support.loop_check import LoopNoting, served_engine

MODEL = "tiny-sim"
PROMPT = list(range(300, 2800))  # 2,500 distinct ids: each decoded once per answer


@pytest.fixture
def served() -> Iterator[tuple[httpx.Client, LoopNoting]]:
    tok = LoopNoting(load_tokenizer(None), "decode")
    with served_engine(tok, MODEL, num_blocks=1024, block_size=4, vocab=(259, 4096),
                       max_model_len=4096) as http:
        yield http, tok


@pytest.mark.parametrize("body", [
    {"echo": True, "max_tokens": 0, "logprobs": 1},  # lm-eval's loglikelihood request
    {"prompt_logprobs": 5, "max_tokens": 1},
])
def test_a_long_prompts_log_probabilities_are_rendered_off_the_event_loop(
        served: tuple[httpx.Client, LoopNoting], body: dict[str, Any]) -> None:
    http, tok = served
    tok.on_loop.clear()
    r = http.post("/v1/completions", json={"model": MODEL, "prompt": PROMPT, **body})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    if body.get("echo"):
        assert len(choice["logprobs"]["tokens"]) == len(PROMPT)
        assert choice["logprobs"]["token_logprobs"][0] is None
    else:
        assert len(choice["prompt_logprobs"]) == len(PROMPT)
    off = tok.on_loop.count(False)
    assert off >= len(PROMPT), off  # every prompt token's text, in the worker thread
    assert tok.on_loop.count(True) <= 4, tok.on_loop.count(True)  # the answer's own text


def test_a_short_answers_log_probabilities_are_rendered_on_the_loop(
        served: tuple[httpx.Client, LoopNoting]) -> None:
    http, tok = served
    tok.on_loop.clear()
    r = http.post("/v1/completions", json={"model": MODEL, "prompt": PROMPT[:8], "echo": True,
                                           "max_tokens": 2, "logprobs": 1})
    assert r.status_code == 200, r.text
    assert len(r.json()["choices"][0]["logprobs"]["tokens"]) == 8 + 2
    assert tok.on_loop and all(tok.on_loop)


def test_a_streamed_chunk_echoing_a_long_prompt_is_rendered_off_the_event_loop(
        served: tuple[httpx.Client, LoopNoting]) -> None:
    http, tok = served
    tok.on_loop.clear()
    r = http.post("/v1/completions", json={"model": MODEL, "prompt": PROMPT, "echo": True,
                                           "max_tokens": 3, "logprobs": 1, "stream": True})
    assert r.status_code == 200, r.text
    chunks = [json.loads(line[6:]) for line in r.text.splitlines()
              if line.startswith("data: {")]
    tokens = [t for c in chunks for t in c["choices"][0]["logprobs"]["tokens"]]
    assert len(tokens) == len(PROMPT) + 3
    assert tok.on_loop.count(False) >= len(PROMPT)
    assert tok.on_loop.count(True) <= 12, tok.on_loop.count(True)  # the 3 answer tokens'
