"""A stream whose last event came right after a piece of an event is failed however many
keep-alive comments (events without data) came between the piece and that last event:
the end is judged by the last two events that carry data."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.support.counted_answers import chunked, one_counted
from tests.support.foreign_raw import raw_replica
from tests.support.gateway_harness import start_gateway

_CHUNK = (b'data: {"id":"x","object":"chat.completion.chunk","created":1,"model":"m",'
          b'"choices":[{"index":0,"delta":{"content":"It"},"finish_reason":null}]}\n\n')
_PIECE = _CHUNK[:60] + b"\n\n"  # an event cut inside its JSON
_PING = b": keep-alive\n\n"
_DONE = b"data: [DONE]\n\n"
_DELTA = (b'event: response.output_text.delta\ndata: {"delta":"It","item_id":"msg_1",'
          b'"type":"response.output_text.delta"}\n\n')
_COMPLETED = (b'event: response.completed\ndata: {"response":{"id":"r","object":"response",'
              b'"status":"completed","output":[],"usage":{"input_tokens":3,'
              b'"output_tokens":1,"total_tokens":4}},"type":"response.completed"}\n\n')
_CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
_RESPONSES = {"model": "m", "input": "hi", "stream": True}


@pytest.mark.parametrize(("events", "path", "body", "status"), [
    ((_CHUNK, _PIECE, _PING, _DONE), "/v1/chat/completions", _CHAT, "502"),
    ((_CHUNK, _PIECE, _PING, _PING, _PING, _DONE), "/v1/chat/completions", _CHAT, "502"),
    ((_CHUNK, _PIECE.replace(b"\n", b"\r\n"), _PING.replace(b"\n", b"\r\n"),
      _DONE.replace(b"\n", b"\r\n")), "/v1/chat/completions", _CHAT, "502"),
    ((_DELTA, _DELTA[:50] + b"\n\n", _PING, _COMPLETED), "/v1/responses", _RESPONSES,
     "502"),
    # whole streams with comments stay answered
    ((_CHUNK, _PING, _PING, _CHUNK, _PING, _DONE), "/v1/chat/completions", _CHAT, "200"),
    ((_PING, _PING, _DONE), "/v1/chat/completions", _CHAT, "200"),
    ((_DELTA, _PING, _PING, _COMPLETED), "/v1/responses", _RESPONSES, "200"),
], ids=["one_comment", "three_comments", "crlf", "responses", "whole", "comments_alone",
        "responses_whole"])
def test_a_piece_then_comments_then_the_last_event_counts_failed(
        serve: Any, events: tuple[bytes, ...], path: str, body: dict[str, Any],
        status: str) -> None:
    answer = chunked(*events)
    with raw_replica(lambda: answer) as url:
        gw = start_gateway(serve, [("a", url)], max_attempts=1)
        r = httpx.post(f"{gw.url}{path}", timeout=10, json=body)
        assert r.status_code == 200 and r.content == b"".join(events)  # relayed as it came
        assert one_counted(gw) == {status: 1.0}
