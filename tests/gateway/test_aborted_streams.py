"""A stream the replica aborted (vLLM's ``finish_reason: "abort"``, SGLang ``/generate``'s
``{"type": "abort", "status_code": ...}``), then ``[DONE]``, is relayed as it came but
recorded as a failed answer: under an error status, out of the answered requests'
histograms, and not as the replica's progress."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.support.counted_answers import answered, chunked, counted
from tests.support.foreign_raw import raw_replica
from tests.support.gateway_harness import start_gateway


def _stream(*events: dict[str, Any]) -> bytes:
    """A streamed answer as the replica writes one: compact JSON events (pydantic's and
    orjson's), ``[DONE]``, in chunked encoding."""
    return chunked(*(b"data: " + json.dumps(e, separators=(",", ":")).encode() + b"\n\n"
                     for e in events), b"data: [DONE]\n\n")


def _chat_chunk(content: str, finish: str | None) -> dict[str, Any]:
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": {"content": content}, "logprobs": None,
                         "finish_reason": finish}]}


def _generate_event(text: str, finish: dict[str, Any] | None) -> dict[str, Any]:
    return {"text": text, "meta_info": {"id": "r", "finish_reason": finish,
                                        "prompt_tokens": 4, "completion_tokens": 1,
                                        "cached_tokens": 0}}


VLLM_ABORT = _stream(_chat_chunk("It", None), _chat_chunk(" sets", "abort"))
SGLANG_ABORT = _stream(_generate_event("It", None), _generate_event("It", {
    "type": "abort", "message": "Abort in waiting queue", "status_code": 503,
    "err_type": None}))
VLLM_WHOLE = _stream(_chat_chunk("It", None), _chat_chunk(" sets", "stop"))
SGLANG_WHOLE = _stream(_generate_event("It", None),
                       _generate_event("It sets", {"type": "length", "length": 2}))


def _counted(gw: Any) -> dict[str, float]:
    """kvgate_requests_total by status, and the answered requests' duration count."""
    return {**counted(gw), "answered": answered(gw)}


@pytest.mark.parametrize(("answer", "path", "body", "status"), [
    (VLLM_ABORT, "/v1/chat/completions",
     {"messages": [{"role": "user", "content": "hi"}]}, "502"),
    (SGLANG_ABORT, "/generate", {"text": "hi"}, "503"),
    (VLLM_WHOLE, "/v1/chat/completions",
     {"messages": [{"role": "user", "content": "hi"}]}, "200"),
    (SGLANG_WHOLE, "/generate", {"text": "hi"}, "200"),
])
def test_an_aborted_stream_is_recorded_as_failed(serve: Any, answer: bytes, path: str,
                                                 body: dict[str, Any], status: str) -> None:
    with raw_replica(lambda: answer) as url:
        gw = start_gateway(serve, [("a", url)])
        r = httpx.post(f"{gw.url}{path}", timeout=10,
                       json={"model": "m", "stream": True, **body})
        assert r.status_code == 200
        assert r.content.endswith(b"data: [DONE]\n\n")  # relayed as it came
        assert (b'"abort"' in r.content) == (status != "200")
        counted = {k: v for k, v in _counted(gw).items() if v}
        assert counted.get(status) == 1.0, counted
        assert counted.get("answered", 0.0) == (1.0 if status == "200" else 0.0), counted


def _whole(answer: dict[str, Any]) -> bytes:
    body = json.dumps(answer).encode()  # json's spacing: ", " and ": "
    return (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
            % len(body) + body)


@pytest.mark.parametrize(("finish", "status"), [("abort", "502"), ("stop", "200")])
def test_a_whole_answer_the_replica_aborted_is_recorded_as_failed(
        serve: Any, finish: str, status: str) -> None:
    answer = _whole({"id": "chatcmpl-1", "object": "chat.completion", "created": 1,
                     "model": "m", "choices": [{"index": 0, "finish_reason": finish,
                                                "message": {"role": "assistant",
                                                            "content": 'say "abort"'}}]})
    with raw_replica(lambda: answer) as url:
        gw = start_gateway(serve, [("a", url)])
        r = httpx.post(f"{gw.url}/v1/chat/completions", timeout=10, json={
            "model": "m", "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == finish
        counted = {k: v for k, v in _counted(gw).items() if v}
        assert counted.get(status) == 1.0, counted
        assert counted.get("answered", 0.0) == (1.0 if status == "200" else 0.0), counted
