"""SGLang's native ``POST /generate`` on the engine, over raw HTTP on a real uvicorn
server (sim executor with a tiny cost model, as ``test_server``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from engine.sim_executor import sim_token
from tests.support.engine_servers import LiveEngine, serve_engine
from tests.support.metrics import samples
from tests.support.waiting import wait_until

MODEL = "tiny-sim"
LONG = " ".join(f"article {i} of the charter names the parties." for i in range(30))


@pytest.fixture(scope="module")
def live() -> Iterator[LiveEngine]:
    yield from serve_engine(LiveEngine, MODEL)


def _generate(live: LiveEngine, body: dict[str, Any]) -> Any:
    r = live.http.post("/generate", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def _events(live: LiveEngine, body: dict[str, Any]) -> list[Any]:
    """The stream's events, decoded; the last is the literal ``[DONE]``."""
    with live.http.stream("POST", "/generate", json={**body, "stream": True}) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        raw = "".join(r.iter_text())
    frames = raw.split("\n\n")
    assert frames[-1] == "" and all(f.startswith("data: ") for f in frames[:-1])
    return [f[6:] if f == "data: [DONE]" else json.loads(f[6:]) for f in frames[:-1]]


def _completion(live: LiveEngine, prompt: str | list[int], max_tokens: int,
                **extra: Any) -> Any:
    return live.client.completions.create(model=MODEL, prompt=prompt, max_tokens=max_tokens,
                                          extra_body=extra or None)


def test_a_text_prompt_is_answered_as_sglang_answers_it(live: LiveEngine) -> None:
    out = _generate(live, {"text": "the native api", "rid": "native-1",
                           "sampling_params": {"max_new_tokens": 6, "temperature": 0}})
    assert set(out) == {"text", "output_ids", "meta_info"}
    meta = out["meta_info"]
    assert set(meta) == {"id", "finish_reason", "prompt_tokens", "completion_tokens",
                         "cached_tokens", "e2e_latency", "weight_version"}
    assert meta["id"] == "native-1"
    assert meta["weight_version"] == "default"
    assert meta["finish_reason"] == {"type": "length", "length": 6}
    assert meta["completion_tokens"] == len(out["output_ids"]) == 6
    assert meta["prompt_tokens"] == live.http.post(
        "/tokenize", json={"prompt": "the native api"}).json()["count"]
    assert meta["e2e_latency"] > 0
    # the same engine as the OpenAI routes: the same prompt, the same sim answer
    assert out["text"] == _completion(live, "the native api", 6).choices[0].text
    assert out["text"] == live.http.post(
        "/detokenize", json={"tokens": out["output_ids"]}).json()["prompt"]


def test_input_ids_and_the_default_of_128_new_tokens(live: LiveEngine) -> None:
    ids = [300 + i for i in range(9)]
    out = _generate(live, {"input_ids": ids, "model": MODEL,
                           "sampling_params": {"ignore_eos": True}})
    assert out["meta_info"]["prompt_tokens"] == 9
    assert out["meta_info"]["finish_reason"] == {"type": "length", "length": 128}
    assert len(out["output_ids"]) == 128
    assert out["text"] == _completion(live, ids, 128).choices[0].text


def test_a_repeat_reports_its_prefix_cache_hit_and_counts_in_the_metrics(
        live: LiveEngine) -> None:
    before = samples(live.http.get("/metrics").text)
    body = {"text": LONG, "sampling_params": {"max_new_tokens": 2}}
    first = _generate(live, body)["meta_info"]
    again = _generate(live, body)["meta_info"]
    n = first["prompt_tokens"]
    assert n > 100 and again["prompt_tokens"] == n
    assert first["cached_tokens"] == 0
    assert again["cached_tokens"] == (n - 1) // 4 * 4  # every full block but the last
    after = samples(live.http.get("/metrics").text)

    def grew(name: str) -> float:
        key = next(k for k in after if k[0] == name)
        return after[key] - before.get(key, 0.0)
    assert grew("vllm:prompt_tokens_total") == 2 * n
    assert grew("vllm:prefix_cache_hits_total") == again["cached_tokens"]
    assert grew("vllm:generation_tokens_total") == 4


def test_a_stream_carries_the_whole_text_so_far_and_ends_with_done(live: LiveEngine) -> None:
    body = {"text": "stream me", "rid": "s-1", "sampling_params": {"max_new_tokens": 5}}
    events = _events(live, body)
    assert events[-1] == "[DONE]"
    answers = events[:-1]
    assert len(answers) == 5  # one per token: each added text
    for i, event in enumerate(answers):
        meta = event["meta_info"]
        assert meta["id"] == "s-1"
        assert meta["completion_tokens"] == len(event["output_ids"]) == i + 1
        assert meta["prompt_tokens"] == answers[0]["meta_info"]["prompt_tokens"]
        if i:  # cumulative, not incremental
            assert event["text"].startswith(answers[i - 1]["text"])
            assert event["output_ids"][:i] == answers[i - 1]["output_ids"]
    assert [e["meta_info"]["finish_reason"] for e in answers[:-1]] == [None] * 4
    assert all("e2e_latency" not in e["meta_info"] for e in answers[:-1])
    last = answers[-1]
    assert last["meta_info"]["finish_reason"] == {"type": "length", "length": 5}
    whole = _generate(live, {**body, "rid": "s-2"})
    assert last["text"] == whole["text"] and last["output_ids"] == whole["output_ids"]
    paced = _events(live, {**body, "sampling_params": {"max_new_tokens": 5,
                                                       "stream_interval": 2}})
    # as SGLang: at output lengths 1, 1 + k, 1 + 2k ..., and the last
    assert [e["meta_info"]["completion_tokens"] for e in paced[:-1]] == [1, 3, 5]
    assert paced[-2]["text"] == last["text"]
    paced = _events(live, {**body, "sampling_params": {"max_new_tokens": 6,
                                                       "stream_interval": 4}})
    assert [e["meta_info"]["completion_tokens"] for e in paced[:-1]] == [1, 5, 6]


def test_stop_strings_and_stop_tokens_name_what_they_matched(live: LiveEngine) -> None:
    base = _generate(live, {"text": "stop test", "sampling_params": {
        "max_new_tokens": 12, "sampling_seed": 3}})
    stop = base["text"][6:9]
    cut = _generate(live, {"text": "stop test", "sampling_params": {
        "max_new_tokens": 12, "sampling_seed": 3, "stop": stop}})
    assert cut["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert cut["text"] == base["text"][: base["text"].index(stop)]
    kept = _generate(live, {"text": "stop test", "sampling_params": {
        "max_new_tokens": 12, "sampling_seed": 3, "stop": [stop], "no_stop_trim": True}})
    assert kept["text"] == base["text"][: base["text"].index(stop) + len(stop)]
    # a stop token ends the answer: its id is the last output id, its text left out
    executor = live.server.core.executor
    n_prompt = base["meta_info"]["prompt_tokens"]
    fourth = executor._lo + sim_token(3, n_prompt + 3, executor._span)
    by_token = _generate(live, {"text": "stop test", "sampling_params": {
        "max_new_tokens": 12, "sampling_seed": 3, "stop_token_ids": [fourth]}})
    assert by_token["meta_info"]["finish_reason"] == {"type": "stop", "matched": fourth}
    assert by_token["output_ids"] == base["output_ids"][:4]
    first3 = _generate(live, {"text": "stop test", "sampling_params": {
        "max_new_tokens": 3, "sampling_seed": 3}})
    assert by_token["text"] == first3["text"]


def test_a_batch_is_answered_with_a_list_in_order(live: LiveEngine) -> None:
    texts = ["batch one", "batch two, longer"]
    out = _generate(live, {"text": texts, "rid": "b", "sampling_params": {"max_new_tokens": 3}})
    assert [a["meta_info"]["id"] for a in out] == ["b_0", "b_1"]
    for text, answer in zip(texts, out, strict=True):
        assert answer["text"] == _completion(live, text, 3).choices[0].text
    ids = _generate(live, {"input_ids": [[300, 301], [302, 303, 304]], "rid": ["x", "y"],
                           "sampling_params": [{"max_new_tokens": 1}, {"max_new_tokens": 2}]})
    assert [(a["meta_info"]["id"], a["meta_info"]["completion_tokens"]) for a in ids] \
        == [("x", 1), ("y", 2)]


def test_zero_new_tokens_computes_the_prompt_alone(live: LiveEngine) -> None:
    prompt = "warm the cache " * 12
    out = _generate(live, {"text": prompt, "sampling_params": {"max_new_tokens": 0}})
    assert out["output_ids"] == [] and out["text"] == ""
    assert out["meta_info"]["finish_reason"] == {"type": "length", "length": 0}
    n = out["meta_info"]["prompt_tokens"]
    then = _generate(live, {"text": prompt, "sampling_params": {"max_new_tokens": 1}})
    assert then["meta_info"]["cached_tokens"] == (n - 1) // 4 * 4 > 0


def test_a_rid_in_flight_is_refused_and_a_stream_left_is_aborted() -> None:
    for engine in serve_engine(LiveEngine, MODEL):
        body = {"text": "long story", "rid": "dup", "stream": True,
                "sampling_params": {"max_new_tokens": 400, "ignore_eos": True}}
        with engine.http.stream("POST", "/generate", json=body) as r:
            lines = r.iter_lines()  # kept: a dropped iterator closes the connection
            assert next(lines).startswith("data: ")
            again = engine.http.post("/generate", json={**body, "stream": False})
            assert again.status_code == 400, again.text
            assert again.json()["error"]["param"] == "rid"
            assert not engine.server.core.stats.num_requests_aborted
        core = engine.server.core
        wait_until(lambda: core.stats.num_requests_aborted, 10,  # noqa: B023
                   "the engine to abort the request")
        assert core.stats.generation_tokens < 400
        # the id is free again once its request ended
        assert _generate(engine, {**body, "stream": False,
                                  "sampling_params": {"max_new_tokens": 1}})[
            "meta_info"]["id"] == "dup"


@pytest.mark.parametrize(("body", "param"), [
    ({}, "text"),
    ({"sampling_params": {"max_new_tokens": 2}}, "text"),
    ({"text": "x", "input_ids": [300]}, "input_ids"),
    ({"text": 5}, "text"),
    ({"text": ""}, "text"),
    ({"text": ["a", 5]}, "text"),
    ({"input_ids": "300 301"}, "input_ids"),
    ({"input_ids": []}, "input_ids"),
    ({"input_ids": [300, -1]}, "input_ids"),
    ({"input_ids": [300, 99999]}, "input_ids"),
    ({"input_ids": [[300], []]}, "input_ids"),
    ({"text": "x", "sampling_params": {"max_new_tokens": -1}}, "sampling_params.max_new_tokens"),
    ({"text": "x", "sampling_params": {"max_new_tokens": "many"}},
     "sampling_params.max_new_tokens"),
    ({"text": "x", "sampling_params": {"max_new_tokens": 600}}, "sampling_params.max_new_tokens"),
    ({"text": "x", "sampling_params": {"max_new_tokens": 2, "min_new_tokens": 5}},
     "sampling_params.min_new_tokens"),
    ({"text": "x", "sampling_params": {"top_p": 3}}, "sampling_params.top_p"),
    ({"text": "x", "sampling_params": {"temperature": -1}}, "sampling_params.temperature"),
    ({"text": "x", "sampling_params": {"stop": 5}}, "sampling_params.stop"),
    ({"text": "x", "sampling_params": {"n": 2}}, "sampling_params.n"),
    ({"text": "x", "sampling_params": {"regex": "a+"}}, "sampling_params.regex"),
    ({"text": "x", "sampling_params": {"json_schema": "{}"}}, "sampling_params.json_schema"),
    ({"text": "x", "sampling_params": {"skip_special_tokens": [1]}},
     "sampling_params.skip_special_tokens"),
    ({"text": "x", "sampling_params": {"custom_params": [1]}}, "sampling_params.custom_params"),
    ({"text": "x", "sampling_params": {"max_new_token": 3}}, "sampling_params.max_new_token"),
    ({"text": "x", "sampling_params": [{}]}, "sampling_params"),
    ({"text": ["a", "b"], "sampling_params": [{}, {"top_k": -7}]},
     "sampling_params[1].top_k"),
    ({"text": ["a", "b"], "sampling_params": [{}]}, "sampling_params"),
    ({"text": "x", "return_logprob": "yes"}, "return_logprob"),
    ({"text": "x", "return_logprob": True, "logprob_start_len": 0}, "logprob_start_len"),
    ({"text": "x", "return_logprob": True, "logprob_start_len": 99}, "logprob_start_len"),
    ({"text": "x", "return_logprob": True, "top_logprobs_num": -1}, "top_logprobs_num"),
    ({"text": ["a", "b"], "return_logprob": [True]}, "return_logprob"),
    ({"text": "x", "return_logprob": True, "token_ids_logprob": [300]}, "token_ids_logprob"),
    ({"text": "x", "return_entropy": True}, "return_entropy"),
    ({"text": "x", "custom_logit_processor": "{}"}, "custom_logit_processor"),
    ({"text": "x", "max_thinking_tokens": 5}, "max_thinking_tokens"),
    ({"text": "x", "image_data": "http://x/cat.png"}, "image_data"),
    ({"text": "x", "lora_path": "adapter"}, "lora_path"),
    ({"text": "x", "stream": "sometimes"}, "stream"),
    ({"text": ["a", "b"], "stream": True}, "stream"),
    ({"text": "x", "rid": 7}, "rid"),
    ({"text": ["a", "b"], "rid": ["same", "same"]}, "rid"),
    ({"text": ["a", "b"], "rid": ["one"]}, "rid"),
    ({"text": "x", "cache_salt": ""}, "cache_salt"),
    ({"text": "x" * 600}, "text"),
])
def test_bad_input_gets_a_400_naming_the_field(live: LiveEngine, body: dict,
                                               param: str) -> None:
    r = live.http.post("/generate", json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param, err
    assert err["type"] == "invalid_request_error"


def test_fields_asking_for_nothing_pass_and_an_unknown_model_is_not_found(
        live: LiveEngine) -> None:
    body = {"text": "x", "return_logprob": False, "logprob_start_len": 0,
            "top_logprobs_num": 0, "image_data": None, "routed_dp_rank": 0,
            "return_entropy": False, "return_prompt_token_ids": False, "token_ids_logprob": None,
            "log_metrics": True, "sampling_params": {"max_new_tokens": 1, "regex": None,
                                                     "skip_special_tokens": True,
                                                     "custom_params": {"k": 1}}}
    assert _generate(live, body)["meta_info"]["completion_tokens"] == 1
    r = live.http.post("/generate", json={"text": "x", "model": "other"})
    assert r.status_code == 404 and r.json()["error"]["param"] == "model"
    r = live.http.post("/generate", content=b'{"text": ')
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
