"""A stream's ``[DONE]`` is read as SSE reads it, as the ``openai`` client does: written
``data:[DONE]`` (no space), with another field in its event (``id:``, ``retry:``), with
keep-alive comments after its event, or with a space after it, it ends the stream whole,
where it was taken for a stream cut short (an error event after it, a 502 counted, the
replica ejected after three). A whole answer that Python's ``json`` reads (``-Infinity``,
``NaN``, a byte order mark) is whole, not cut."""

from __future__ import annotations

import json

import httpx
import pytest

from gateway.errors import UpstreamError
from gateway.proxy import Usage
from tests.support.fake_replica import Behaviour, fake_replica
from tests.support.gateway_harness import Serve, start_gateway
from tests.support.relayed_streams import relayed, relayed_whole


def _event(text: str, finish: str | None, sep: bytes = b"data: ") -> bytes:
    return sep + json.dumps({
        "id": "cmpl-1", "object": "text_completion", "created": 1, "model": "m",
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
        if finish else None}).encode() + b"\n\n"


_EVENTS = _event("a", None) + _event("b", "stop")
_DONES = {
    "no-space": b"data:[DONE]\n\n",
    "id-after": b"data: [DONE]\nid: 7\n\n",
    "retry-before": b"retry: 15000\ndata: [DONE]\n\n",
    "comment-after": b"data: [DONE]\n\n: ping\n\n",
    "crlf-comment-after": b"data: [DONE]\r\n\r\n: ping\r\n\r\n",
    "space-after": b"data: [DONE] \n\n",
}


@pytest.mark.parametrize("several_choices", [False, True])
@pytest.mark.parametrize("done", list(_DONES.values()), ids=list(_DONES))
def test_a_done_written_otherwise_ends_the_stream_whole(done: bytes,
                                                        several_choices: bool) -> None:
    relay = relayed([_EVENTS, done], 0.01, None, "/v1/completions",
                    several_choices=several_choices)
    assert b"".join(body for body, _, _ in relay.sent) == _EVENTS + done
    assert relay.ended == [True]


def test_an_unfinished_choice_before_a_done_written_otherwise_is_still_cut() -> None:
    events = _event("a", None, b"data:") + _event("b", None, b"data:")
    relay = relayed([events, b"data:[DONE]\nid: 3\n\n"], 0.01, None, "/v1/completions",
                    several_choices=False)
    body = b"".join(body for body, _, _ in relay.sent)
    assert body.startswith(events) and b"[DONE]" not in body
    assert b"upstream_unfinished" in body[len(events):]
    assert relay.ended == [False]


def test_the_error_event_takes_the_place_of_the_done_before_a_comment_naming_it() -> None:
    events = _event("a", None) + _event("b", None)
    relay = relayed([events, b"data: [DONE]\n\n: [DONE]\n\n"], 0.01, None,
                    "/v1/completions", several_choices=False)
    body = b"".join(body for body, _, _ in relay.sent)
    assert body.startswith(events) and b"data: [DONE]" not in body, body
    assert b"upstream_unfinished" in body[len(events):]


def test_a_whole_answer_nested_past_any_parser_is_cut_not_a_crash() -> None:
    body = b"[" * 100_000 + b"NaN" + b"]" * 100_000
    raw = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d" \
          b"\r\n\r\n" % len(body) + body
    with pytest.raises(UpstreamError, match="answered a cut body"):  # not RecursionError
        relayed_whole(raw, 1 << 20)


def test_a_content_event_holding_done_text_is_no_done() -> None:
    events = _event("a", None) + _event("[DONE]", None)
    relay = relayed([events], 0.01, None, "/v1/completions", several_choices=False)
    assert relay.ended == [False]


@pytest.mark.parametrize("body", [
    b'\xef\xbb\xbf{"id":"c","object":"text_completion","choices":[{"index":0,"text":"x",'
    b'"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":1,'
    b'"total_tokens":6}}',
    b'{"id":"c","object":"text_completion","choices":[{"index":0,"text":"x",'
    b'"logprobs":{"token_logprobs":[-Infinity],"top_logprobs":[{"x":NaN}]},'
    b'"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":1,'
    b'"total_tokens":6}}',
], ids=["bom", "nan-infinity"])
def test_a_whole_answer_pythons_json_reads_is_whole(body: bytes) -> None:
    raw = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d" \
          b"\r\n\r\n" % len(body) + body
    relayed_answer = relayed_whole(raw, 1 << 20)
    assert relayed_answer.body == body
    assert relayed_answer.ended == [("200", True)]
    assert relayed_answer.usage == [Usage(5, 0, 1, cached_told=False)]
    assert relayed_answer.request_failures == 0


def test_streams_ending_so_keep_their_replica_and_count_whole(serve: Serve) -> None:
    rec = Behaviour("rec", done_event=b"data:[DONE]\nretry: 15000\n\n: ping\n\n")
    gw = start_gateway(serve, [("r0", serve(fake_replica(rec)).url)],
                       scrape={"enabled": False})
    for _ in range(4):  # three cut in a row ejected the replica
        with httpx.stream("POST", f"{gw.url}/v1/completions", timeout=20, json={
                "model": "sim-model", "prompt": "hi", "max_tokens": 3,
                "stream": True}) as answer:
            assert answer.status_code == 200
            body = answer.read()
        assert body.endswith(rec.done_event) and b"error" not in body
    metrics = httpx.get(f"{gw.url}/metrics", timeout=10).text
    served = [line for line in metrics.splitlines()
              if line.startswith("kvgate_requests_total{") and 'replica="r0"' in line
              and not line.endswith(" 0.0")]
    assert len(served) == 1 and 'status="200"' in served[0] and served[0].endswith(" 4.0"), \
        served
    assert len(rec.received) == 4
