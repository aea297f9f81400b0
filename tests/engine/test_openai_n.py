"""``n`` > 1 on ``/v1/completions`` and ``/v1/chat/completions``: one engine request per
sequence on the same prompt, answered as vLLM answers (sim executor, seeded)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from engine.generate_params import MAX_N
from tests.support.engine_servers import LiveEngine, serve_engine

MODEL = "tiny-sim"
MESSAGES = [{"role": "user", "content": "name three colours"}]


@pytest.fixture(scope="module")
def live() -> Iterator[LiveEngine]:
    yield from serve_engine(LiveEngine, MODEL)


def test_n_completions_are_the_seeded_sequences_seed_plus_index(live: LiveEngine) -> None:
    out = live.client.completions.create(model=MODEL, prompt="the colour of", max_tokens=5,
                                         seed=4, n=3, logprobs=1)
    assert [c.index for c in out.choices] == [0, 1, 2]
    for i, choice in enumerate(out.choices):
        alone = live.client.completions.create(model=MODEL, prompt="the colour of",
                                               max_tokens=5, seed=4 + i, logprobs=1)
        assert choice.text == alone.choices[0].text
        assert choice.logprobs.tokens == alone.choices[0].logprobs.tokens
    assert len({c.text for c in out.choices}) == 3
    assert out.usage.prompt_tokens == alone.usage.prompt_tokens  # the prompt counted once
    assert out.usage.completion_tokens == 15
    assert live.server.core.num_running == 0


def test_unseeded_sampled_sequences_differ_and_greedy_ones_agree(live: LiveEngine) -> None:
    # as vLLM's: n sampled sequences are n draws; greedy ones are one answer n times
    def texts(**kw: Any) -> list[str]:
        out = live.client.completions.create(model=MODEL, prompt="the colour of",
                                             max_tokens=6, n=3, **kw)
        return [c.text for c in out.choices]

    sampled = texts()
    assert len(set(sampled)) == 3
    assert texts() == sampled  # the sim's draws are a function of the prompt
    assert len(set(texts(temperature=0))) == 1


def test_a_streamed_chat_of_n_choices_names_each_chunks_choice(live: LiveEngine) -> None:
    body: dict[str, Any] = {"model": MODEL, "messages": MESSAGES, "max_tokens": 6, "seed": 1,
                            "n": 2, "logprobs": True, "top_logprobs": 1}
    whole = live.http.post("/v1/chat/completions", json=body).json()
    datas = live.stream("/v1/chat/completions",
                        {**body, "stream_options": {"include_usage": True}})
    text = {0: "", 1: ""}
    content: dict[int, list[Any]] = {0: [], 1: []}
    for chunk in datas[:-1]:
        (choice,) = chunk["choices"]
        text[choice["index"]] += choice["delta"].get("content", "")
        if choice["logprobs"] is not None:
            content[choice["index"]] += choice["logprobs"]["content"]
    for i in (0, 1):
        assert text[i] == whole["choices"][i]["message"]["content"]
        assert content[i] == whole["choices"][i]["logprobs"]["content"]
    # the choices run at once and their chunks go out as they come, not one choice after
    # the other
    order = [chunk["choices"][0]["index"] for chunk in datas[:-1]]
    assert order.index(1) < len(order) - 1 - order[::-1].index(0), order
    usage = datas[-1]["usage"]
    assert datas[-1]["choices"] == [] and usage["completion_tokens"] == 12
    assert usage["prompt_tokens"] == whole["usage"]["prompt_tokens"]  # the prompt once


@pytest.mark.parametrize("n", [0, MAX_N + 1])
def test_n_out_of_range_is_refused(live: LiveEngine, n: int) -> None:
    r = live.http.post("/v1/completions", json={"model": MODEL, "prompt": "x", "n": n})
    assert r.status_code == 400 and r.json()["error"]["param"] == "n"
