"""Fields read the way the engine reads the others (vLLM's lax types): ``logprobs`` and
``top_logprobs`` on the chat, completions and Responses routes, and ``parallel_tool_calls``
on the chat and Responses routes; a value of a wrong type is a 400 naming the field and
the value, never accepted unread."""

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


def _chat(live: LiveEngine, **fields: Any) -> Any:
    return live.http.post("/v1/chat/completions", json={
        "model": MODEL, "messages": CHAT, "max_tokens": 2, **fields})


def _refused(r: Any, param: str, value: str) -> None:
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error", error
    assert param in error["message"] and value in error["message"], error


def test_log_probability_fields_are_read_as_vllm_reads_them(live: LiveEngine) -> None:
    for want, top in [("true", "2"), (1, 2.0), (True, "2")]:
        r = _chat(live, logprobs=want, top_logprobs=top)
        assert r.status_code == 200, r.text
        content = r.json()["choices"][0]["logprobs"]["content"]
        assert len(content) == 2 and all(len(c["top_logprobs"]) == 2 for c in content)
    r = _chat(live, logprobs="false")
    assert r.status_code == 200 and r.json()["choices"][0]["logprobs"] is None, r.text
    r = live.http.post("/v1/completions", json={"model": MODEL, "prompt": "x",
                                                 "max_tokens": 2, "logprobs": "1"})
    assert r.status_code == 200, r.text
    logprobs = r.json()["choices"][0]["logprobs"]
    assert len(logprobs["tokens"]) == 2 and len(logprobs["top_logprobs"]) == 2
    r = live.http.post("/v1/responses", json={"model": MODEL, "input": "x",
                                               "max_output_tokens": 2, "top_logprobs": "0"})
    assert r.status_code == 200, r.text


def test_log_probability_fields_of_a_wrong_type_are_refused_naming_them(
        live: LiveEngine) -> None:
    _refused(_chat(live, logprobs="maybe"), "logprobs", "maybe")
    _refused(_chat(live, logprobs=True, top_logprobs="two"), "top_logprobs", "two")
    _refused(_chat(live, logprobs=True, top_logprobs=2.5), "top_logprobs", "2.5")
    _refused(live.http.post("/v1/completions", json={
        "model": MODEL, "prompt": "x", "max_tokens": 2, "logprobs": "some"}),
        "logprobs", "some")
    _refused(live.http.post("/v1/responses", json={
        "model": MODEL, "input": "x", "top_logprobs": "none"}), "top_logprobs", "none")


def test_parallel_tool_calls_is_a_boolean_read_as_vllm_reads_it(live: LiveEngine) -> None:
    assert _chat(live, parallel_tool_calls="false").status_code == 200
    _refused(_chat(live, parallel_tool_calls="sometimes"), "parallel_tool_calls", "sometimes")
    _refused(_chat(live, parallel_tool_calls={"on": True}), "parallel_tool_calls", "on")
    r = live.http.post("/v1/responses", json={"model": MODEL, "input": "x",
                                               "max_output_tokens": 2,
                                               "parallel_tool_calls": "false"})
    assert r.status_code == 200 and r.json()["parallel_tool_calls"] is False, r.text
    r = live.http.post("/v1/responses", json={"model": MODEL, "input": "x",
                                               "max_output_tokens": 2})
    assert r.status_code == 200 and r.json()["parallel_tool_calls"] is True, r.text
    _refused(live.http.post("/v1/responses", json={
        "model": MODEL, "input": "x", "parallel_tool_calls": [1, 2]}),
        "parallel_tool_calls", "an array of 2")
