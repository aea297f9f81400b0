"""A stream whose ``[DONE]`` (or a Responses stream's last event) came right after a
piece of an event (a replica's write cut short, then its end) is a failed answer: the
client cannot read that event, and the gateway counts the request failed, not answered;
so is one whose keep-alive comments came between the piece and that last event."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from tests.support.counted_answers import chunked, one_counted
from tests.support.foreign_raw import raw_replica
from tests.support.gateway_harness import start_gateway

# an event that tells its choice's finish reason: a stream of it is not cut short for
# lack of one (the piece's judgement is what these tests read)
_CHUNK = (b'data: {"id":"x","object":"chat.completion.chunk","created":1,"model":"m",'
          b'"choices":[{"index":0,"delta":{"content":"It"},"finish_reason":"stop"}]}\n\n')
_PIECE = _CHUNK[:60]  # an event cut inside its JSON
_DONE = b"data: [DONE]\n\n"
_PING = b": keep-alive\n\n"
_DELTA = (b'event: response.output_text.delta\ndata: {"delta":"It","item_id":"msg_1",'
          b'"type":"response.output_text.delta"}\n\n')
_COMPLETED = (b'event: response.completed\ndata: {"response":{"id":"r","object":"response",'
              b'"status":"completed","output":[],"usage":{"input_tokens":3,'
              b'"output_tokens":1,"total_tokens":4}},"type":"response.completed"}\n\n')


_CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
_RESPONSES = {"model": "m", "input": "hi", "stream": True}


@pytest.mark.parametrize(("events", "path", "body", "status"), [
    # the piece an event of its own, then [DONE]
    ((_CHUNK, _PIECE + b"\n\n", _DONE), "/v1/chat/completions", _CHAT, "502"),
    # the piece and [DONE] run into one event (no blank line between them)
    ((_CHUNK, _PIECE + b"\n", _DONE), "/v1/chat/completions", _CHAT, "502"),
    ((_CHUNK, _PIECE, _DONE), "/v1/completions",
     {"model": "m", "prompt": "hi", "stream": True}, "502"),
    ((_CHUNK, _PIECE, _DONE), "/generate", {"text": "hi", "stream": True}, "502"),
    ((_DELTA, _DELTA[:50] + b"\n\n", _COMPLETED), "/v1/responses",
     {"model": "m", "input": "hi", "stream": True}, "502"),
    # whole streams stay answered
    ((_CHUNK, _CHUNK, _DONE), "/v1/chat/completions", _CHAT, "200"),
    ((b": keep-alive\n\n", _CHUNK, b": ping\n\n", _DONE), "/v1/chat/completions", _CHAT,
     "200"),
    ((_DONE,), "/generate", {"text": "hi", "stream": True}, "200"),
    ((_DELTA, _DELTA, _COMPLETED), "/v1/responses",
     {"model": "m", "input": "hi", "stream": True}, "200"),
    # keep-alive comments (events without data) between the piece and the last event: the
    # end is judged by the last two events that carry data
    ((_CHUNK, _PIECE + b"\n\n", _PING, _DONE), "/v1/chat/completions", _CHAT, "502"),
    ((_CHUNK, _PIECE + b"\n\n", _PING, _PING, _PING, _DONE), "/v1/chat/completions", _CHAT,
     "502"),
    ((_CHUNK, _PIECE + b"\r\n\r\n", _PING.replace(b"\n", b"\r\n"),
      _DONE.replace(b"\n", b"\r\n")), "/v1/chat/completions", _CHAT, "502"),
    ((_DELTA, _DELTA[:50] + b"\n\n", _PING, _COMPLETED), "/v1/responses", _RESPONSES, "502"),
    ((_CHUNK, _PING, _PING, _CHUNK, _PING, _DONE), "/v1/chat/completions", _CHAT, "200"),
    ((_PING, _PING, _DONE), "/generate", {"text": "hi", "stream": True}, "200"),
    ((_DELTA, _PING, _PING, _COMPLETED), "/v1/responses", _RESPONSES, "200"),
], ids=["piece_then_done", "piece_line_then_done", "completions", "generate", "responses",
        "whole", "comments", "done_alone", "responses_whole", "piece_comment",
        "piece_comments", "piece_comment_crlf", "responses_piece_comment",
        "whole_with_comments", "comments_alone", "responses_whole_comments"])
def test_a_last_event_after_a_piece_of_an_event_counts_failed(
        serve: Any, events: tuple[bytes, ...], path: str, body: dict[str, Any],
        status: str) -> None:
    answer = chunked(*events)
    with raw_replica(lambda: answer) as url:
        gw = start_gateway(serve, [("a", url)], max_attempts=1)
        r = httpx.post(f"{gw.url}{path}", timeout=10, json=body)
        assert r.status_code == 200 and r.content == b"".join(events)  # relayed as it came
        assert one_counted(gw) == {status: 1.0}


def test_the_openai_client_fails_such_a_stream_as_the_gateway_counts_it(serve: Any) -> None:
    answer = chunked(_CHUNK, _PIECE + b"\n\n", _DONE)
    with raw_replica(lambda: answer) as url:
        gw = start_gateway(serve, [("a", url)], max_attempts=1)
        with openai.OpenAI(base_url=f"{gw.url}/v1", api_key="k", max_retries=0) as client, \
                pytest.raises(json.JSONDecodeError):
            for _ in client.chat.completions.create(model="m", stream=True, messages=[
                    {"role": "user", "content": "hi"}]):
                pass
        assert one_counted(gw) == {"502": 1.0}
