"""A completion or chat stream of one choice ends it with a finish reason before its
``[DONE]``, as vLLM and SGLang write it (then perhaps the usage, its choices empty). One
whose ``[DONE]`` came though no event told a finish reason was cut by its replica: the
gateway counts it failed (502) and the client gets an error event in place of that
``[DONE]``, however long its last events; where its writer tells no finish reasons it
passes, as it did. A stream of several choices that ends with one unfinished ends the
same way for the client."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import openai
import pytest

from gateway.proxy import answer_signs
from tests.support.chat_events import chat, event, usage
from tests.support.counted_answers import chunked, one_counted
from tests.support.foreign_raw import raw_replica
from tests.support.gateway_harness import start_gateway
from tests.support.relayed_streams import relayed

_DONE = b"data: [DONE]\n\n"
_PING = b": keep-alive\n\n"
_CHAT_PATH = "/v1/chat/completions"


def _text(text: str, finish: str | None = None) -> bytes:
    return event({"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "m",
                  "choices": [{"index": 0, "text": text, "logprobs": None,
                               "finish_reason": finish, "stop_reason": None}]})


_ROLE = chat({"role": "assistant", "content": ""})
_CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True,
         "stream_options": {"include_usage": True}}
_TEXT = {"model": "m", "prompt": "hi", "stream": True}


def _crlf(event: bytes) -> bytes:
    return event.replace(b"\n", b"\r\n")


def _error_code(content: bytes, head: bytes) -> str | None:
    """The code of the error event that follows ``head``, all that ``content`` holds
    past it (None when it holds no error event there)."""
    if not content.startswith(head) or not content.endswith(b"\n\n"):
        return None
    rest = content[len(head):]
    if not rest.startswith(b"data: {\"error\""):
        return None
    code: str = json.loads(rest.removeprefix(b"data: "))["error"]["code"]
    return code


@contextmanager
def _through_gateway(serve: Any, events: tuple[bytes, ...], path: str, body: dict[str, Any]
             ) -> Iterator[tuple[Any, httpx.Response]]:
    """A gateway of one try in front of a replica answering ``events`` (chunked), and its
    answer to ``body`` posted to ``path``, while the replica still runs."""
    answer = chunked(*events)
    with raw_replica(lambda: answer) as url:
        gw = start_gateway(serve, [("a", url)], max_attempts=1)
        yield gw, httpx.post(f"{gw.url}{path}", timeout=10, json=body)


@pytest.mark.parametrize(("events", "path", "body"), [
    ((_ROLE, chat({"content": "a"}), chat({"content": "b"}), usage(), _DONE),
     _CHAT_PATH, _CHAT),
    ((_ROLE, chat({"content": "a"}), _DONE), _CHAT_PATH, {**_CHAT, "n": 1}),
    ((_text("a"), _text("b"), _PING, _DONE), "/v1/completions", _TEXT),
    (tuple(map(_crlf, (_text("a"), _text("b"), _DONE))), "/v1/completions", _TEXT),
    # last events longer than the stream's kept tail: a usage event, a content event
    ((_ROLE, chat({"content": "a"}), usage(pad=9000), _DONE), _CHAT_PATH, _CHAT),
    ((_ROLE, chat({"content": "a" * 9000}), _DONE), _CHAT_PATH, _CHAT),
], ids=["chat", "chat_n_1", "text", "text_crlf", "long_usage", "long_content"])
def test_a_stream_of_one_choice_without_its_finish_reason_counts_failed(
        serve: Any, events: tuple[bytes, ...], path: str, body: dict[str, Any]) -> None:
    with _through_gateway(serve, events, path, body) as (gw, r):
        assert r.status_code == 200
        # every event came, but for [DONE]: an error event in its place
        assert _error_code(r.content, b"".join(events[:-1])) == "upstream_unfinished"
        assert b"[DONE]" not in r.content
        assert one_counted(gw) == {"502": 1.0}


@pytest.mark.parametrize(("events", "path", "body"), [
    # vLLM: the last token's event tells the finish reason, then the usage
    ((_ROLE, chat({"content": "a"}), chat({"content": "b"}, "stop"), usage(), _DONE),
     _CHAT_PATH, _CHAT),
    # SGLang: an event of the finish reason alone, keep-alive comments after it
    ((_ROLE, chat({"content": "a"}), chat({}, "length"), _PING, usage(), _PING, _DONE),
     _CHAT_PATH, _CHAT),
    # SGLang's hidden states (finish reason null) after the finish
    ((_ROLE, chat({"content": "a"}), chat({}, "stop"), chat({"hidden_states": []}),
      usage(), _DONE), _CHAT_PATH, _CHAT),
    ((_text("a"), _text("b", "length"), _DONE), "/v1/completions", _TEXT),
    # a tool call's index is no choice's
    ((_ROLE, chat({"tool_calls": [{"index": 1, "function": {"arguments": "}"}}]},
                  "tool_calls"), _DONE), _CHAT_PATH, _CHAT),
    # cannot be told, passed: a writer that tells no finish reason at all
    ((b'data: {"choices":[{"index":0,"text":"a"}]}\n\n', _DONE), "/v1/completions", _TEXT),
], ids=["vllm", "sglang", "sglang_hidden_states", "text", "tool_call", "no_finish_key"])
def test_a_stream_of_one_choice_that_finished_or_cannot_tell_is_answered(
        serve: Any, events: tuple[bytes, ...], path: str, body: dict[str, Any]) -> None:
    with _through_gateway(serve, events, path, body) as (gw, r):
        assert r.status_code == 200 and r.content == b"".join(events)  # relayed as it came
        assert one_counted(gw) == {"200": 1.0}


def test_the_openai_client_fails_a_stream_without_its_finish_reason(serve: Any) -> None:
    answer = chunked(_ROLE, chat({"content": "a"}), _DONE)
    with raw_replica(lambda: answer) as url:
        gw = start_gateway(serve, [("a", url)], max_attempts=1)
        got: list[str | None] = []
        with openai.OpenAI(base_url=f"{gw.url}/v1", api_key="k", max_retries=0) as client, \
                pytest.raises(openai.APIError, match="unfinished"):
            for chunk in client.chat.completions.create(model="m", stream=True, messages=[
                    {"role": "user", "content": "hi"}]):
                got.append(chunk.choices[0].delta.content)
        assert got == ["", "a"]  # its content came, then the error
        assert one_counted(gw) == {"502": 1.0}


@pytest.mark.parametrize(("writes", "end_apart_s", "code"), [
    # [DONE] in a write of its own, its blank line in the next
    ((_ROLE, chat({"content": "a"}), b"data: [DONE]", b"\n\n"), None, "upstream_unfinished"),
    # the body ends on [DONE] with no blank line after it: a [DONE] no client reads, so
    # the stream is cut there
    ((_ROLE, chat({"content": "a"}), b"data: [DONE]"), 0.05, "upstream_broken"),
    # [DONE] in one read with the events before it
    ((_ROLE + chat({"content": "a"}) + _DONE,), None, "upstream_unfinished"),
], ids=["split_blank_line", "no_blank_line", "one_read"])
def test_a_done_without_a_finish_reason_is_replaced_however_it_comes(
        writes: tuple[bytes, ...], end_apart_s: float | None, code: str) -> None:
    out = relayed(writes, 0.05, end_apart_s, _CHAT_PATH, several_choices=False)
    sent = b"".join(body for body, _, _ in out.sent)
    head = _ROLE + chat({"content": "a"})
    assert _error_code(sent, head) == code and b"[DONE]" not in sent
    assert out.ended == [False] and out.stream.outcome == "502"


@pytest.mark.parametrize("several", [False, True])
def test_a_stream_that_finished_is_relayed_whole_however_its_done_comes(
        several: bool) -> None:
    events = (_ROLE, chat({"content": "a"}), chat({"content": "b"}, "stop"), usage())
    out = relayed((*events, b"data: [DONE]", b"\n\n"), 0.05, None, _CHAT_PATH,
                  several_choices=several)
    assert b"".join(body for body, _, _ in out.sent) == b"".join(events) + _DONE
    assert out.ended == [True] and out.stream.outcome == "200"


def test_several_choices_with_one_unfinished_end_with_the_error_event() -> None:
    events = (chat({"content": "a"}), chat({"content": "b"}, index=1),
              chat({"content": ""}, "stop"), usage())
    out = relayed((*events, _DONE), 0.05, None, _CHAT_PATH, several_choices=True)
    sent = b"".join(body for body, _, _ in out.sent)
    assert _error_code(sent, b"".join(events)) == "upstream_unfinished"
    assert b"choice 1 (of 2)" in sent and out.ended == [False]
    # a request of one choice is not judged choice by choice: choice 0 finished
    one = relayed((*events, _DONE), 0.05, None, _CHAT_PATH, several_choices=False)
    assert one.ended == [True]


def test_only_completions_and_chat_are_judged_by_their_finish() -> None:
    for path in ("/v1/responses", "/generate", "/v1/embeddings"):
        signs = answer_signs(path, several_choices=False)
        assert not signs.last_finish and not signs.choices
    assert answer_signs("/v1/completions", several_choices=False).last_finish
    assert answer_signs(_CHAT_PATH, several_choices=True).choices
