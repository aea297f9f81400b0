"""vLLM's request fields and routes beyond OpenAI's, on a real engine server (sim executor):
what the engine honours as vLLM does, what it refuses rather than ignore, and vLLM's
``/version`` and model check on ``/tokenize`` and ``/detokenize``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.engine_servers import LiveEngine, serve_engine

MODEL = "tiny-sim"
SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # ids 0, 1, 2


@pytest.fixture(scope="module")
def live() -> Iterator[LiveEngine]:
    # a sim whose every token is special
    yield from serve_engine(LiveEngine, MODEL, vocab=(0, 3))


def _ids(logprobs: dict[str, Any]) -> list[int]:
    return [int(t.removeprefix("token_id:")) for t in logprobs["tokens"]]


def test_skip_special_tokens_false_keeps_their_text(live: LiveEngine) -> None:
    body = {"model": MODEL, "prompt": "x", "max_tokens": 4, "seed": 1, "logprobs": 0,
            "return_tokens_as_token_ids": True}
    skipped = live.http.post("/v1/completions", json=body).json()["choices"][0]
    assert skipped["text"] == ""
    kept = live.http.post("/v1/completions",
                          json={**body, "skip_special_tokens": False,
                                "spaces_between_special_tokens": False}).json()["choices"][0]
    ids = _ids(kept["logprobs"])
    assert ids == _ids(skipped["logprobs"]) and len(ids) == 4
    assert kept["text"] == "".join(SPECIAL[t] for t in ids)
    # a chat's stream too
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
            "skip_special_tokens": False, "logprobs": True, "return_tokens_as_token_ids": True}
    chunks = live.stream("/v1/chat/completions", chat)
    choices = [c["choices"][0] for c in chunks]
    text = "".join(c["delta"].get("content") or "" for c in choices)
    ids = [int(e["token"].removeprefix("token_id:"))
           for c in choices if c["logprobs"] for e in c["logprobs"]["content"]]
    assert len(ids) == 3 and text == "".join(SPECIAL[t] for t in ids)


@pytest.mark.parametrize(("path", "extra", "param"), [
    ("/v1/completions", {"response_format": {"type": "json_object"}}, "response_format"),
    ("/v1/completions", {"use_beam_search": True}, "use_beam_search"),
    ("/v1/chat/completions", {"allowed_token_ids": [1]}, "allowed_token_ids"),
    ("/v1/completions", {"bad_words": ["x"]}, "bad_words"),
    ("/v1/completions", {"logprob_token_ids": [1]}, "logprob_token_ids"),
    ("/v1/chat/completions", {"priority": 1}, "priority"),
    ("/v1/completions", {"truncate_prompt_tokens": 1, "truncation_side": "right"},
     "truncation_side"),
])
def test_fields_restricting_the_output_are_refused_not_ignored(
        live: LiveEngine, path: str, extra: dict[str, Any], param: str) -> None:
    body = {"model": MODEL, "max_tokens": 2}
    body |= {"prompt": "x"} if path == "/v1/completions" else \
        {"messages": [{"role": "user", "content": "hi"}]}
    r = live.http.post(path, json={**body, **extra})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
    nothing = {"response_format": {"type": "text"}, "use_beam_search": False,
               "allowed_token_ids": None, "bad_words": [], "priority": 0,
               "truncation_side": "left"}
    assert live.http.post(path, json={**body, **nothing}).status_code == 200


def test_version_and_the_model_of_tokenize_and_detokenize(live: LiveEngine) -> None:
    version = live.http.get("/version")
    assert version.status_code == 200 and isinstance(version.json()["version"], str)
    ok = live.http.post("/tokenize", json={"model": MODEL, "prompt": "hi"})
    assert ok.status_code == 200
    assert live.http.post("/detokenize", json={"model": MODEL, "tokens": ok.json()["tokens"]}
                          ).json() == {"prompt": "hi"}
    for path, body in (("/tokenize", {"prompt": "hi"}), ("/detokenize", {"tokens": [300]})):
        r = live.http.post(path, json={**body, "model": "other"})
        assert r.status_code == 404, r.text
        assert r.json()["error"]["message"] == "The model `other` does not exist."


def test_models_card_has_vllms_fields(live: LiveEngine) -> None:
    card = live.http.get("/v1/models").json()["data"][0]
    assert set(card) == {"id", "object", "created", "owned_by", "root", "parent",
                         "max_model_len", "permission"}
    assert card["parent"] is None and card["max_model_len"] == 512
    assert card["permission"][0]["object"] == "model_permission"


def test_a_completions_null_max_tokens_runs_to_the_end_of_the_context(
        live: LiveEngine) -> None:
    body = {"model": MODEL, "prompt": list(range(300, 790)), "ignore_eos": True}
    unset = live.http.post("/v1/completions", json=body).json()
    assert unset["usage"]["completion_tokens"] == 16  # the default
    null = live.http.post("/v1/completions", json={**body, "max_tokens": None}).json()
    assert null["usage"]["completion_tokens"] == 512 - 490
    assert null["choices"][0]["finish_reason"] == "length"


def test_the_answer_is_named_by_the_clients_request_id(live: LiveEngine) -> None:
    body = {"model": MODEL, "prompt": "x", "max_tokens": 2, "n": 2}
    named = live.http.post("/v1/completions", json=body, headers={"X-Request-Id": "trace-7"})
    assert named.json()["id"] == "cmpl-trace-7"
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    with live.http.stream("POST", "/v1/chat/completions", json={**chat, "stream": True},
                          headers={"X-Request-Id": "trace-7"}) as held:
        # a second request of the same id while the first is open runs all the same
        again = live.http.post("/v1/chat/completions", json={**chat, "request_id": "b"},
                               headers={"X-Request-Id": "trace-7"})
        ids = {line for line in held.iter_lines() if line.startswith("data: {")}
    assert again.status_code == 200 and again.json()["id"] == "chatcmpl-trace-7"
    assert all('"id":"chatcmpl-trace-7"' in line for line in ids) and ids
    assert live.http.post("/v1/completions", json={**body, "request_id": "mine"}
                          ).json()["id"] == "cmpl-mine"
    plain = live.http.post("/v1/completions", json=body).json()["id"]
    assert plain.startswith("cmpl-") and len(plain) == 5 + 32


def test_stream_options_read_as_vllm_reads_them(live: LiveEngine) -> None:
    body = {"model": MODEL, "prompt": "x", "max_tokens": 2}
    off = live.stream("/v1/completions", {**body, "stream_options": {"include_usage": "false"}})
    assert all("usage" not in c for c in off) and all(c["choices"] for c in off)
    on = live.stream("/v1/completions", {**body, "stream_options": {"include_usage": "true"}})
    assert on[-1]["choices"] == [] and on[-1]["usage"]["completion_tokens"] == 2
    bad = live.http.post("/v1/completions", json={**body, "stream": True,
                                                  "stream_options": {"include_usage": "x"}})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "include_usage"
