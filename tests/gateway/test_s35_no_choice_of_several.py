"""A completion's or chat's answer with no choice at all carries nothing where the request
asked several choices (``n`` over one, or a batch of prompts), as where it asked one: a
whole answer whose ``choices`` is empty is a failed try (the next replica is tried; from
the last, a 502 naming it), a stream with no choice in any event ends with an
``upstream_empty`` error event in place of its ``[DONE]``. A request whose ``n`` a
replica may read as none (0) is not judged so."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.support.counted_answers import chunked, one_counted
from tests.support.foreign_raw import raw_replica
from tests.support.gateway_harness import start_gateway

_MESSAGES = [{"role": "user", "content": "hi"}]
_USAGE = {"prompt_tokens": 5, "completion_tokens": 0, "total_tokens": 5}


def _whole(body: dict[str, Any]) -> bytes:
    data = json.dumps(body).encode()
    return (f"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
            f"content-length: {len(data)}\r\n\r\n").encode() + data


def _event(choices: list[dict[str, Any]], **fields: Any) -> bytes:
    value = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m",
             "choices": choices, **fields}
    return b"data: " + json.dumps(value).encode() + b"\n\n"


_NO_CHOICE = _whole({"id": "x", "object": "chat.completion", "created": 0, "model": "m",
                     "choices": [], "usage": _USAGE})


@pytest.mark.parametrize("asks", [{"n": 2}, {"n": 3}])
def test_a_whole_answer_of_no_choice_to_several_asked_is_a_502(serve: Any,
                                                              asks: dict[str, Any]) -> None:
    with raw_replica(lambda: _NO_CHOICE) as url:
        gw = start_gateway(serve, [("a", url)])
        r = httpx.post(f"{gw.url}/v1/chat/completions",
                       json={"model": "m", "messages": _MESSAGES, **asks}, timeout=10)
        assert r.status_code == 502, r.text
        assert "replica 'a' answered 200 with no choice (its choices empty)" in \
            r.json()["error"]["message"]
        assert one_counted(gw) == {"502": 1.0}


def test_a_batch_answered_with_no_choice_is_a_502(serve: Any) -> None:
    answer = _whole({"id": "x", "object": "text_completion", "created": 0, "model": "m",
                     "choices": [], "usage": _USAGE})
    with raw_replica(lambda: answer) as url:
        gw = start_gateway(serve, [("a", url)])
        r = httpx.post(f"{gw.url}/v1/completions",
                       json={"model": "m", "prompt": ["one", "two"]}, timeout=10)
        assert r.status_code == 502, r.text


def test_n_zero_is_not_judged_by_its_choices(serve: Any) -> None:
    with raw_replica(lambda: _NO_CHOICE) as url:
        gw = start_gateway(serve, [("a", url)])
        r = httpx.post(f"{gw.url}/v1/chat/completions",
                       json={"model": "m", "messages": _MESSAGES, "n": 0}, timeout=10)
        assert r.status_code == 200 and r.json()["choices"] == []


@pytest.mark.parametrize(("events", "empty"), [
    ((_event([], usage=_USAGE), b"data: [DONE]\n\n"), True),
    ((b"data: [DONE]\n\n",), True),
    # choices whose first key is not their index: a choice came all the same
    ((_event([{"delta": {"content": "x"}, "index": 0, "finish_reason": "stop"},
              {"delta": {"content": "y"}, "index": 1, "finish_reason": "stop"}]),
      b"data: [DONE]\n\n"), False),
    ((_event([{"index": 0, "delta": {"content": "x"}, "finish_reason": "stop"}]),
      _event([{"index": 1, "delta": {"content": "y"}, "finish_reason": "stop"}]),
      b"data: [DONE]\n\n"), False),
], ids=["usage_only", "done_only", "index_not_first", "two_choices"])
def test_a_stream_of_several_asked_with_no_choice_is_failed(
        serve: Any, events: tuple[bytes, ...], empty: bool) -> None:
    answer = chunked(*events)
    with raw_replica(lambda: answer) as url:
        gw = start_gateway(serve, [("a", url)], max_attempts=1)
        r = httpx.post(f"{gw.url}/v1/chat/completions",
                       json={"model": "m", "messages": _MESSAGES, "n": 2, "stream": True},
                       timeout=10)
        assert r.status_code == 200  # the stream's head went out with its first event
        if not empty:
            assert r.content == b"".join(events)
            assert one_counted(gw) == {"200": 1.0}
            return
        head = b"".join(events[:-1])
        assert r.content.startswith(head) and b"[DONE]" not in r.content
        error = json.loads(r.content[len(head):].removeprefix(b"data: "))["error"]
        assert error["code"] == "upstream_empty"
        assert one_counted(gw) == {"502": 1.0}
