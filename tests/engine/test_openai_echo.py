"""``echo`` and ``prompt_logprobs`` on the OpenAI routes, in vLLM's shapes, read the way
lm-evaluation-harness's ``local-completions`` reads them (the official ``openai`` client
and raw HTTP against the sim engine, whose log-probabilities all equal ``-log(span)``)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from itertools import accumulate
from typing import Any

import pytest

from tests.support.engine_servers import LiveEngine, serve_engine

MODEL = "tiny-sim"
PROMPT = "the colour of"
CONTINUED = [{"role": "user", "content": "hi"},
             {"role": "assistant", "content": "The answer is"}]


@pytest.fixture(scope="module")
def live() -> Iterator[LiveEngine]:
    yield from serve_engine(LiveEngine, MODEL)


def _uniform(live: LiveEngine) -> float:
    return -math.log(live.server.core.executor._span)


def _ids(live: LiveEngine, text: str) -> list[int]:
    return live.server.tokenizer.encode_many([text])[0]


def _post(live: LiveEngine, path: str, body: dict[str, Any]) -> dict[str, Any]:
    r = live.http.post(path, json={"model": MODEL, **body})
    assert r.status_code == 200, r.text
    return r.json()


def test_echo_lists_the_prompt_tokens_first_as_lm_eval_reads_them(live: LiveEngine) -> None:
    ids = _ids(live, PROMPT)
    out = live.client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=1,
                                         logprobs=1, echo=True, temperature=0)
    choice, n = out.choices[0], len(ids) + 1
    lp = choice.logprobs
    assert lp is not None and out.usage is not None
    assert (out.usage.prompt_tokens, out.usage.completion_tokens) == (len(ids), 1)
    assert choice.text.startswith(PROMPT) and len(choice.text) > len(PROMPT)
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == n
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert lp.token_logprobs[1:] == pytest.approx([_uniform(live)] * (n - 1))
    for token, top in zip(lp.tokens[1:], lp.top_logprobs[1:], strict=True):
        assert token in top and len(top) <= 2
    assert "".join(lp.tokens) == choice.text
    assert lp.text_offset == [0, *accumulate(len(t) for t in lp.tokens[:-1])]
    # lm-eval splits the context from the continuation where the offsets pass the prompt
    assert next(i for i, o in enumerate(lp.text_offset) if o >= len(PROMPT)) == len(ids)
    prompt_logprobs = choice.model_extra["prompt_logprobs"]
    assert prompt_logprobs[0] is None and len(prompt_logprobs) == len(ids)


def test_prompt_logprobs_name_each_prompt_token_then_its_alternatives(
        live: LiveEngine) -> None:
    prompt = [300, 301, 302, 303]
    choice = _post(live, "/v1/completions", {"prompt": prompt, "max_tokens": 2,
                                             "prompt_logprobs": 3})["choices"][0]
    assert choice["logprobs"] is None
    entries = choice["prompt_logprobs"]
    assert entries[0] is None and len(entries) == len(prompt)
    for token, entry in zip(prompt[1:], entries[1:], strict=True):
        assert next(iter(entry)) == str(token) and 3 <= len(entry) <= 4
        for key, value in entry.items():
            assert set(value) == {"logprob", "rank", "decoded_token"}
            assert value["logprob"] == pytest.approx(_uniform(live))
            assert value["decoded_token"] == live.server.tokenizer.decode([int(key)])
        ranks = [v["rank"] for v in entry.values()]
        assert ranks[1:] == sorted(ranks[1:]) and ranks[0] >= 1
    plain = _post(live, "/v1/completions", {"prompt": prompt, "max_tokens": 2})
    assert plain["choices"][0]["prompt_logprobs"] is None


def test_a_batch_of_token_id_prompts_echoes_each_prompt(live: LiveEngine) -> None:
    prompts = [[300, 301, 302], [400, 401]]
    out = live.client.completions.create(model=MODEL, prompt=prompts, max_tokens=2,
                                         logprobs=0, echo=True, seed=4)
    plain = live.client.completions.create(model=MODEL, prompt=prompts, max_tokens=2, seed=4)
    assert out.usage is not None and (out.usage.prompt_tokens, out.usage.completion_tokens) \
        == (5, 4)
    for choice, alone, ids in zip(out.choices, plain.choices, prompts, strict=True):
        head = live.server.tokenizer.decode(ids)
        assert choice.text == head + alone.text  # echo changes nothing generated
        lp = choice.logprobs
        assert lp.tokens[:len(ids)] == [live.server.tokenizer.decode([i]) for i in ids]
        assert len(lp.tokens) == len(ids) + 2 and lp.text_offset[0] == 0
        assert lp.token_logprobs[0] is None
        assert all(v is not None for v in lp.token_logprobs[1:])


def test_echo_with_max_tokens_0_answers_the_prompt_alone(live: LiveEngine) -> None:
    ids = _ids(live, PROMPT)
    out = live.client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=0,
                                         echo=True, logprobs=2)
    choice = out.choices[0]
    assert choice.text == PROMPT and choice.finish_reason == "length"
    assert len(choice.logprobs.tokens) == len(ids) and choice.logprobs.top_logprobs[0] is None
    assert out.usage.completion_tokens == 1  # as vLLM: one token ran, left out of the text
    r = live.http.post("/v1/completions", json={"model": MODEL, "prompt": PROMPT,
                                                "max_tokens": 0})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"


def test_a_streamed_echo_sends_the_prompt_with_the_first_chunk(live: LiveEngine) -> None:
    ids = _ids(live, PROMPT)
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 5, "seed": 2, "logprobs": 1,
            "echo": True}
    chunks = [c["choices"][0] for c in live.stream("/v1/completions", body) if c["choices"]]
    first = chunks[0]
    assert first["text"].startswith(PROMPT) and "prompt_logprobs" not in first
    assert first["logprobs"]["tokens"][:len(ids)] == \
        [live.server.tokenizer.decode([i]) for i in ids]
    assert first["logprobs"]["token_logprobs"][0] is None
    whole = _post(live, "/v1/completions", body)["choices"][0]
    assert "".join(c["text"] for c in chunks) == whole["text"]
    for key in ("tokens", "token_logprobs", "text_offset"):
        assert [x for c in chunks for x in c["logprobs"][key]] == whole["logprobs"][key]


def test_prompt_logprobs_after_a_cached_prefix_cover_every_position(
        live: LiveEngine) -> None:
    shared = list(range(600, 640))  # ten blocks of 4
    warm = _post(live, "/v1/completions", {"prompt": [*shared, 700], "max_tokens": 1})
    again = _post(live, "/v1/completions", {"prompt": [*shared, 701], "max_tokens": 1})
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 40, warm
    scored = _post(live, "/v1/completions", {"prompt": [*shared, 702, 703], "max_tokens": 1,
                                             "prompt_logprobs": 0})
    entries = scored["choices"][0]["prompt_logprobs"]
    assert len(entries) == 42 and entries[0] is None
    assert [next(iter(e)) for e in entries[1:]] == [str(t) for t in [*shared[1:], 702, 703]]
    assert scored["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    # it read no cached block, yet cached its own: a later request hits them
    fresh = list(range(800, 840))
    _post(live, "/v1/completions", {"prompt": [*fresh, 1], "max_tokens": 1,
                                    "prompt_logprobs": 0})
    after = _post(live, "/v1/completions", {"prompt": [*fresh, 2], "max_tokens": 1})
    assert after["usage"]["prompt_tokens_details"]["cached_tokens"] == 40


def test_prompt_logprobs_are_bounded_as_vllm_bounds_them(live: LiveEngine) -> None:
    refused = [
        ({"prompt": "x", "prompt_logprobs": 21}, "20"),
        ({"prompt": "x", "prompt_logprobs": -1}, "20"),  # the whole vocabulary
        ({"prompt": "x", "prompt_logprobs": -2}, "-2"),
        ({"prompt": "x", "prompt_logprobs": "many"}, "many"),
        ({"prompt": "x", "prompt_logprobs": 1, "stream": True}, "stream"),
        ({"messages": CONTINUED, "prompt_logprobs": 21}, "20"),
    ]
    for body, said in refused:
        path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
        r = live.http.post(path, json={"model": MODEL, "max_tokens": 2, **body})
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["param"] == "prompt_logprobs" and said in error["message"], error
    most = _post(live, "/v1/completions", {"prompt": [300, 301], "max_tokens": 1,
                                           "prompt_logprobs": 20})
    assert len(most["choices"][0]["prompt_logprobs"][1]) >= 20
    chunks = live.stream("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 2,
                                             "prompt_logprobs": 0})  # a stream may ask 0
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"])


def test_a_chat_echoes_a_last_message_of_the_answers_role(live: LiveEngine) -> None:
    turn = {"messages": CONTINUED, "add_generation_prompt": False,
            "continue_final_message": True, "max_tokens": 3, "seed": 1}
    plain = _post(live, "/v1/chat/completions", turn)
    echoed = _post(live, "/v1/chat/completions", {**turn, "echo": True, "prompt_logprobs": 1})
    content = plain["choices"][0]["message"]["content"]
    assert echoed["choices"][0]["message"]["content"] == "The answer is" + content
    entries = echoed["prompt_logprobs"]
    assert entries[0] is None and len(entries) == echoed["usage"]["prompt_tokens"]
    assert plain["prompt_logprobs"] is None
    chunks = live.stream("/v1/chat/completions", {"model": MODEL, **turn, "echo": True})
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert deltas[0]["role"] == "assistant" and deltas[1] == {"content": "The answer is"}
    assert "".join(d.get("content") or "" for d in deltas[2:]) == content
    # after a generation prompt the answer is the assistant's, the user's message is not
    asked = {"messages": CONTINUED[:1], "max_tokens": 3, "seed": 1}
    assert _post(live, "/v1/chat/completions", {**asked, "echo": True})["choices"] \
        == _post(live, "/v1/chat/completions", asked)["choices"]
