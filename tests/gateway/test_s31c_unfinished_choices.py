"""A completion or chat stream of several choices (``n``) ends each choice with its own
finish reason, then (optionally) the usage, then ``[DONE]``, as vLLM and SGLang write it.
One whose choice came but never finished was cut, though its ``[DONE]`` came: the
gateway counts it failed (502), wherever in the stream the other choices ended, and
whatever events (the usage, keep-alive comments) follow them, and the client gets an
error event in place of its ``[DONE]``."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.support.counted_answers import chunked, one_counted
from tests.support.foreign_raw import raw_replica
from tests.support.gateway_harness import start_gateway

_DONE = b"data: [DONE]\n\n"
_PING = b": keep-alive\n\n"


def _event(value: dict[str, Any], spaced: bool = False) -> bytes:
    """An event as vLLM (pydantic's compact JSON) or another writer (json's spaces)
    writes it."""
    return b"data: " + json.dumps(value, separators=None if spaced else (",", ":")).encode() \
        + b"\n\n"


def _chat(index: int, delta: dict[str, Any], finish: str | None = None,
          spaced: bool = False) -> bytes:
    return _event({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1,
                   "model": "m", "choices": [{"index": index, "delta": delta,
                                              "logprobs": None, "finish_reason": finish}]},
                  spaced)


def _text(index: int, text: str, finish: str | None = None, spaced: bool = False) -> bytes:
    return _event({"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "m",
                   "choices": [{"index": index, "text": text, "logprobs": None,
                                "finish_reason": finish, "stop_reason": None}]}, spaced)


_USAGE = _event({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1,
                 "model": "m", "choices": [], "usage": {"prompt_tokens": 3,
                                                        "completion_tokens": 4,
                                                        "total_tokens": 7}})
_ROLE = {"role": "assistant", "content": ""}
# the last chunk of a tool call's choice: its tool call's own index is no choice's
_TOOL_END = _chat(0, {"tool_calls": [{"index": 1, "function": {"arguments": "}"}}]},
                  "tool_calls")

def _relayed(content: bytes, events: tuple[bytes, ...], status: str) -> bool:
    """Whether the client got ``events`` as they came (a whole answer), or (a failed one)
    all but the [DONE] event, then an error event in its place."""
    if status == "200":
        return content == b"".join(events)
    head = b"".join(events[:-1])
    error = json.loads(content[len(head):].removeprefix(b"data: "))["error"]
    return content.startswith(head) and error["code"] == "upstream_unfinished" \
        and b"[DONE]" not in content


_CHAT_BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "n": 2,
              "stream": True, "stream_options": {"include_usage": True}}
_TEXT_BODY = {"model": "m", "prompt": "hi", "n": 2, "stream": True}


@pytest.mark.parametrize(("events", "path", "status"), [
    # choice 1 never finished: the usage and a keep-alive comment follow choice 0's end
    ((_chat(0, _ROLE), _chat(1, _ROLE), _chat(0, {"content": "a"}),
      _chat(1, {"content": "b"}), _chat(0, {"content": ""}, "stop"), _USAGE, _PING, _DONE),
     "/v1/chat/completions", "502"),
    # choice 0 never finished, choice 1 did, long before the end
    ((_text(0, "a"), _text(1, "b", "length"), _text(0, "c"), _PING, _PING, _DONE),
     "/v1/completions", "502"),
    # another writer's JSON, with spaces
    ((_text(0, "a", spaced=True), _text(1, "b", spaced=True),
      _text(1, "c", "stop", spaced=True), _DONE), "/v1/completions", "502"),
    # whole: each choice finished, in any order, whatever follows
    ((_chat(0, _ROLE), _chat(1, _ROLE), _chat(1, {"content": "b"}, "stop"),
      _chat(0, {"content": "a"}), _chat(0, {"content": ""}, "length"), _USAGE, _PING,
      _DONE), "/v1/chat/completions", "200"),
    ((_text(0, "a", spaced=True), _text(1, "b", "stop", spaced=True),
      _text(0, "c", "stop", spaced=True), _DONE), "/v1/completions", "200"),
    # a tool call's index is not a choice's
    ((_chat(0, _ROLE), _TOOL_END, _USAGE, _DONE), "/v1/chat/completions", "200"),
], ids=["chat_second_unfinished", "text_first_unfinished", "spaced_unfinished",
        "chat_whole", "spaced_whole", "tool_call_index"])
def test_a_stream_with_a_choice_that_never_finished_counts_failed(
        serve: Any, events: tuple[bytes, ...], path: str, status: str) -> None:
    answer = chunked(*events)
    with raw_replica(lambda: answer) as url:
        gw = start_gateway(serve, [("a", url)], max_attempts=1)
        r = httpx.post(f"{gw.url}{path}", timeout=10,
                       json=_CHAT_BODY if "chat" in path else _TEXT_BODY)
        assert r.status_code == 200 and _relayed(r.content, events, status)
        assert one_counted(gw) == {status: 1.0}


def test_choices_are_judged_only_where_the_stream_tells_finish_reasons() -> None:
    from gateway.proxy import _Choices

    silent = _Choices()  # a writer that tells no finish reason: [DONE] alone judges it
    silent.note(_chat(0, {"content": "a"}) + _chat(1, {"content": "b"}))
    assert silent.unfinished() == []
    told = _Choices()
    told.note(_chat(0, {"content": "a"}) + _chat(2, {"content": "b"}))
    told.note(_chat(2, {"content": ""}, "stop") + _DONE)
    assert told.unfinished() == [0]
    told.note(_chat(0, {"content": ""}, "stop").replace(b"\n\n", b"\r\n\r\n"))
    assert told.unfinished() == []
    broken = _Choices()  # a finish event that does not parse where it is found
    broken.note(_chat(0, {"content": "a"}) + _chat(1, {"content": "b"}, "stop")[:-5])
    assert broken.unjudged and broken.unfinished() == []


@pytest.mark.parametrize(("body", "status"), [
    ({"model": "m", "prompt": "hi", "stream": True}, "200"),
    ({"model": "m", "prompt": "hi", "n": 1, "stream": True}, "200"),
    # a batch of two prompts has a choice each; n = 2 asks two of one prompt
    ({"model": "m", "prompt": ["hi", "ho"], "stream": True}, "502"),
    ({"model": "m", "prompt": "hi", "n": 2, "stream": True}, "502"),
], ids=["no_n", "n_1", "batch_of_2", "n_2"])
def test_a_request_of_one_choice_is_judged_by_its_done_alone(
        serve: Any, body: dict[str, Any], status: str) -> None:
    """Choices are judged one by one where the request asks several (its prompts times
    its n); a request of one is judged by its last events: a finish reason among them (a
    second choice's here) passes it (that second choice, unfinished, is no choice the
    request asked)."""
    events = (_text(0, "a"), _text(1, "b", "length"), _text(0, "c"), _DONE)
    answer = chunked(*events)
    with raw_replica(lambda: answer) as url:
        gw = start_gateway(serve, [("a", url)], max_attempts=1)
        r = httpx.post(f"{gw.url}/v1/completions", timeout=10, json=body)
        assert r.status_code == 200 and _relayed(r.content, events, status)
        assert one_counted(gw) == {status: 1.0}
