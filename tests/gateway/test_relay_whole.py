"""A non-streamed answer longer than ``buffer_bytes`` is relayed as it arrives, after the
client got its status line: what its bytes say (an abort, an error) and how its body ends
(cut with its connection) still decide how the answer is recorded, and a cut body reaches
the client unfinished, never as a whole one."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.proxy import Usage
from tests.support.relayed_streams import RelayedWhole, relayed_whole

_BUFFER = 1024  # the proxy's buffer_bytes: every answer below is longer
_TEXT = "word " * 600  # 3,000 bytes of content


def _answer(finish: str, text: str = _TEXT, **extra: Any) -> bytes:
    """A vLLM completion body (pydantic's compact JSON): its text, then its finish."""
    return json.dumps({"id": "cmpl-1", "object": "text_completion", "created": 1,
                       "model": "m", "choices": [{"index": 0, "text": text,
                                                  "logprobs": None, "finish_reason": finish}],
                       "usage": {"prompt_tokens": 5, "completion_tokens": 600,
                                 "total_tokens": 605}, **extra},
                      separators=(",", ":")).encode()


def _with_length(body: bytes, status: str = "200 OK") -> bytes:
    return (b"HTTP/1.1 %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
            % (status.encode(), len(body)) + body)


def _until_close(body: bytes) -> bytes:
    """An answer with neither a length nor chunks: the connection's close ends it."""
    return b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n" + body


def _relay(raw: bytes) -> RelayedWhole:
    """``raw`` written by a replica in two writes (its head and first KiB, then the rest)
    and the connection closed, relayed through the proxy to a client that stays."""
    return relayed_whole(raw, _BUFFER)


@pytest.mark.parametrize("frame", [_with_length, _until_close])
def test_a_long_whole_answer_is_relayed_whole_and_counted_answered(frame: Any) -> None:
    body = _answer("stop")
    relayed = _relay(frame(body))
    assert relayed.body == body and relayed.finished
    assert relayed.ended == [("200", True)]
    assert relayed.usage == [Usage(5, 0, 600, cached_told=False)]  # read where its body ends


def test_the_usage_of_a_whole_answer_past_a_mib_is_read_from_its_end() -> None:
    text = "word " * (1 << 18)  # past what the gateway keeps of a body (a MiB)
    body = _answer("stop", text)[:-1] + b',"prompt_token_ids":null}'
    body = body.replace(b'"total_tokens":605}', b'"total_tokens":605,'
                        b'"prompt_tokens_details":{"cached_tokens":3}}')
    generate = json.dumps({"text": text, "meta_info": {
        "id": "r", "finish_reason": {"type": "stop"}, "prompt_tokens": 7,
        "completion_tokens": 600, "cached_tokens": 4}}).encode()
    batch = json.dumps([json.loads(generate)] * 2).encode()
    assert [_relay(_with_length(b)).usage for b in (body, generate, batch)] == [
        [Usage(5, 3, 600)], [Usage(7, 4, 600)], [None]]  # a batch's is all its answers'


@pytest.mark.parametrize("frame", [_with_length, _until_close])
def test_a_long_whole_answer_the_replica_aborted_past_the_buffer_is_counted_failed(
        frame: Any) -> None:
    body = _answer("abort")
    assert body.index(b'"abort"') > _BUFFER  # told after the client got its status line
    relayed = _relay(frame(body))
    assert relayed.body == body  # relayed as the replica wrote it
    assert relayed.ended == [("502", False)]


def test_a_long_body_that_ends_with_its_connection_before_its_json_did_is_shown_cut() -> None:
    body = _answer("stop")
    relayed = _relay(_until_close(body[:-40]))
    assert relayed.body == body[:-40]
    assert not relayed.finished  # the server drops the connection: the client sees a cut
    assert relayed.ended == [("502", False)]


# (one the gateway holds whole is no answer: a failed try, never relayed)
def test_an_error_object_answered_with_a_200_is_counted_failed() -> None:
    error = {"error": {"message": "engine died: " + "x" * _BUFFER * 3,
                       "type": "InternalError", "param": None, "code": 500}}
    body = json.dumps(error, separators=(",", ":")).encode()
    relayed = _relay(_with_length(body))
    assert relayed.body == body and relayed.finished
    assert relayed.ended == [("502", False)]


def test_a_usage_that_counts_no_prompt_token_is_no_usage() -> None:
    """A prompt has a token at least: a replica that reports none does not count them,
    and its zero cached tokens would tell the policy of a miss."""
    body = json.dumps({"id": "cmpl-1", "object": "text_completion", "choices": [
        {"index": 0, "text": "ok", "finish_reason": "stop"}], "usage": {
        "prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}}).encode()
    assert _relay(_with_length(body)).usage == [None]
