"""A non-streamed answer of an endpoint the gateway knows (completions, chat, responses,
generate) is one JSON value: one whose JSON, or whose compressed stream, ends short under
a clean length or chunked end is the replica's answer cut, as is a completion whose choice
has a null finish reason. Held whole before the client sees a byte, it is a failed try:
the next replica answers, else the client gets a 502 naming the replica; never a 200.
A pass-through answer is left to its transport."""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable

import httpx
import pytest

from gateway.errors import UpstreamError
from tests.support.foreign_raw import raw_replica
from tests.support.gateway_harness import Serve, metric, start_gateway
from tests.support.relayed_streams import relayed_whole
from tests.support.waiting import wait_until

_ANSWER = json.dumps({"id": "cmpl-1", "object": "text_completion", "created": 1,
                      "model": "m", "choices": [{"index": 0, "text": "hello " * 10,
                                                 "logprobs": None, "finish_reason": "length"}],
                      "usage": {"prompt_tokens": 3, "completion_tokens": 10,
                                "total_tokens": 13}}).encode()


def _chunked(body: bytes, encoding: str | None = None) -> bytes:
    """``body`` as a 200 in one chunk, the chunked body properly ended."""
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
    if encoding is not None:
        head += b"content-encoding: %s\r\n" % encoding.encode()
    return head + b"transfer-encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)


def _with_length(body: bytes) -> bytes:
    return (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
            % len(body) + body)


_PACKED = gzip.compress(_ANSWER * 20)
_CUT: dict[str, Callable[[], bytes]] = {
    "json_cut_chunked": lambda: _chunked(_ANSWER[:40]),
    "json_cut_length": lambda: _with_length(_ANSWER[:40]),
    "gzip_cut": lambda: _chunked(_PACKED[: len(_PACKED) // 2], "gzip"),
    "finish_null": lambda: _with_length(
        _ANSWER.replace(b'"finish_reason": "length"', b'"finish_reason": null')),
}


@pytest.mark.parametrize("cut", sorted(_CUT))
def test_a_cut_whole_answer_under_clean_framing_is_tried_on_the_next_replica(
        serve: Serve, cut: str) -> None:
    with raw_replica(_CUT[cut]) as broken, raw_replica(lambda: _with_length(_ANSWER)) as good:
        gw = start_gateway(serve, [("broken", broken), ("good", good)])
        wait_until(lambda: all(
            metric(gw, f'kvgate_replica_healthy{{replica="{rid}"}}') == 1.0
            for rid in ("broken", "good")), 10, "both replicas in")
        for _ in range(2):  # round robin: each replica first once
            answer = httpx.post(f"{gw.url}/v1/completions", timeout=10,
                                headers={"accept-encoding": "identity"},
                                json={"model": "m", "prompt": "hi", "max_tokens": 10})
            assert answer.status_code == 200, answer.text
            assert answer.headers["x-kvgate-replica"] == "good"
            assert answer.json() == json.loads(_ANSWER)
        retried = metric(gw, 'kvgate_retries_total{cause="broken",replica="broken"}')
        assert retried is not None and retried >= 1  # counted against the cut one


@pytest.mark.parametrize("cut", sorted(_CUT))
def test_a_cut_whole_answer_from_the_last_replica_is_a_502_naming_it(cut: str) -> None:
    with pytest.raises(UpstreamError, match="replica 'r' answered a cut body") as raised:
        relayed_whole(_CUT[cut](), 1 << 20)
    assert raised.value.status == 502


def test_a_pass_through_answer_is_left_to_its_transport() -> None:
    relayed = relayed_whole(_chunked(_ANSWER[:40]), 1 << 20, "/v1/embeddings")
    assert relayed.body == _ANSWER[:40] and relayed.finished
    assert relayed.ended == [("200", True)]


def test_a_whole_answer_parsed_for_its_end_still_reports_its_usage() -> None:
    relayed = relayed_whole(_chunked(_ANSWER), 1 << 20)
    assert relayed.body == _ANSWER and relayed.ended == [("200", True)]
    assert [(u.prompt_tokens, u.completion_tokens) for u in relayed.usage if u] == [(3, 10)]


def test_a_long_answer_cut_under_clean_chunks_is_left_unfinished_and_counted_failed() -> None:
    """Longer than ``buffer_bytes``, it is relayed as it comes: its cut shows where its
    body ends, which the client gets unfinished (the connection dropped)."""
    body = _ANSWER.replace(b"hello " * 10, b"hello " * 400)[:-60]
    relayed = relayed_whole(_chunked(body), 1024, first_write=1100)
    assert relayed.body == body
    assert not relayed.finished
    assert relayed.ended == [("502", False)]


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions", "/v1/responses",
                                  "/generate"])
@pytest.mark.parametrize("frame", ["length", "chunked"])
def test_an_error_answer_whose_body_is_no_json_is_relayed_as_the_replicas(
        path: str, frame: str) -> None:
    """A 400 is the replica's word on the request, whatever its body: one that is no JSON,
    in two reads, reaches the client whole as that 400, counted 400, no failure of the
    replica's."""
    body = b"bad request: the prompt is not what this server takes " * 3
    head = b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\n"
    raw = head + (b"content-length: %d\r\n\r\n%s" % (len(body), body) if frame == "length"
                  else b"transfer-encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n"
                  % (len(body), body))
    relayed = relayed_whole(raw, 1 << 20, path, first_write=10)
    assert relayed.body == body and relayed.finished
    assert relayed.ended == [("400", False)]
    assert relayed.request_failures == 0
