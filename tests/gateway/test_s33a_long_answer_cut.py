"""A non-streamed completion or chat answer longer than ``buffer_bytes`` is relayed as it
comes, its 200 sent before its end is read. One that the replica cut under a clean length
or chunked end (a choice whose finish reason is null, or an encoded body whose compressed
stream ends short) is left unfinished for the client (the connection dropped) and counted
failed, as one whose JSON ends short is; a whole one ends cleanly, counted 200. Judged
whether the answer is past the part the gateway keeps of it or not, and wherever its reads
split it."""

from __future__ import annotations

import gzip
import json
import random
import zlib

import pytest

from tests.support.relayed_streams import relayed_whole

_BIG = 1 << 20  # the default buffer_bytes: the body is not kept whole past it


def _chat(content_chars: int, finish: str | None) -> bytes:
    return json.dumps({
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant",
                                             "content": "word " * (content_chars // 5)},
                     "logprobs": None, "finish_reason": finish, "stop_reason": None}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 9, "total_tokens": 12}}).encode()


def _text(choices: int, finish_of_last: str | None) -> bytes:
    """A completion of several choices, each 300 KB; only the last one's finish reason is
    ``finish_of_last``."""
    return json.dumps({
        "id": "cmpl-1", "object": "text_completion", "created": 1, "model": "m",
        "choices": [{"index": i, "text": "t" * 300_000, "logprobs": None,
                     "finish_reason": "length" if i < choices - 1 else finish_of_last}
                    for i in range(choices)],
        "usage": {"prompt_tokens": 3, "completion_tokens": 9, "total_tokens": 12}}).encode()


def _answer(body: bytes, frame: str, encoding: str | None = None) -> bytes:
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
    if encoding is not None:
        head += b"content-encoding: %s\r\n" % encoding.encode()
    if frame == "length":
        return head + b"content-length: %d\r\n\r\n" % len(body) + body
    return head + b"transfer-encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)


def _noise(size: int) -> bytes:
    """JSON that compresses little: its encoded form stays longer than a small buffer."""
    rand = random.Random(7)
    return json.dumps({"choices": [{"index": 0, "text": rand.randbytes(size).hex(),
                                    "finish_reason": "stop"}]}).encode()


def _packed(body: bytes, encoding: str) -> bytes:
    return gzip.compress(body) if encoding == "gzip" else zlib.compress(body)


def _first_write(body: bytes, frame: str, buffer_bytes: int, at: int | None) -> int:
    """The body bytes of the replica's first write: ``at`` (of ``body``), else enough to
    fill the gateway's buffer (a chunked body's first bytes are its chunk line)."""
    chunk_line = len(b"%x\r\n" % len(body)) if frame == "chunked" else 0
    return (buffer_bytes if at is None else at) + chunk_line


def _split_inside_key(body: bytes) -> int:
    """The first write's body bytes of a length-framed answer whose two reads split
    ``body``'s null finish reason inside its key."""
    return body.index(b'"finish_reason": null') + 6


@pytest.mark.parametrize(("body", "buffer_bytes", "first_write", "path"), [
    # the body past what the gateway keeps whole (one choice; its last of several)
    (_chat(1_500_000, None), _BIG, None, "/v1/chat/completions"),
    (_text(5, None), _BIG, None, "/v1/completions"),
    # a body the gateway keeps whole, past a smaller buffer
    (_chat(20_000, None), 1024, None, "/v1/chat/completions"),
    # reads split inside the key
    (_chat(20_000, None), 1024, _split_inside_key(_chat(20_000, None)),
     "/v1/chat/completions"),
], ids=["past_the_kept_part", "last_of_several", "kept", "split_in_the_key"])
@pytest.mark.parametrize("frame", ["length", "chunked"])
def test_a_long_answer_with_a_null_finish_reason_is_left_unfinished_and_counted_failed(
        body: bytes, buffer_bytes: int, first_write: int | None, path: str,
        frame: str) -> None:
    relayed = relayed_whole(_answer(body, frame), buffer_bytes, path,
                            _first_write(body, frame, buffer_bytes, first_write))
    assert relayed.body == body  # relayed as it came
    assert not relayed.finished  # ... and left unfinished: the client cannot take it whole
    assert relayed.ended == [("502", False)]
    assert relayed.request_failures == 1


def test_a_long_answer_whose_first_choice_is_unfinished_is_failed_too() -> None:
    body = json.loads(_text(5, "stop"))
    body["choices"][0]["finish_reason"] = None
    raw = json.dumps(body).encode()
    relayed = relayed_whole(_answer(raw, "length"), _BIG)
    assert relayed.body == raw and not relayed.finished
    assert relayed.ended == [("502", False)]


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
@pytest.mark.parametrize("frame", ["length", "chunked"])
@pytest.mark.parametrize(("buffer_bytes", "size"), [(1024, 20_000), (_BIG, 2_000_000)],
                         ids=["kept", "past_the_kept_part"])
def test_a_long_encoded_answer_whose_compressed_stream_ends_short_is_left_unfinished(
        encoding: str, frame: str, buffer_bytes: int, size: int) -> None:
    packed = _packed(_noise(size), encoding)
    cut = packed[:len(packed) * 3 // 4]
    assert len(cut) > buffer_bytes * 1.2
    relayed = relayed_whole(_answer(cut, frame, encoding), buffer_bytes, "/v1/completions",
                            _first_write(cut, frame, buffer_bytes, None))
    assert relayed.body == cut and not relayed.finished
    assert relayed.ended == [("502", False)]
    assert relayed.request_failures == 1


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_a_long_encoded_answer_that_ends_whole_is_answered(encoding: str) -> None:
    packed = _packed(_noise(20_000), encoding)
    relayed = relayed_whole(_answer(packed, "chunked", encoding), 1024, "/v1/completions",
                            _first_write(packed, "chunked", 1024, None))
    assert relayed.body == packed and relayed.finished
    assert relayed.ended == [("200", True)]


@pytest.mark.parametrize(("body", "buffer_bytes", "path"), [
    (_chat(1_500_000, "stop"), _BIG, "/v1/chat/completions"),
    (_text(5, "length"), _BIG, "/v1/completions"),
    (_chat(20_000, "length"), 1024, "/v1/chat/completions"),
], ids=["past_the_kept_part", "several", "kept"])
def test_a_long_answer_whose_choices_finished_is_answered(
        body: bytes, buffer_bytes: int, path: str) -> None:
    relayed = relayed_whole(_answer(body, "length"), buffer_bytes, path)
    assert relayed.body == body and relayed.finished
    assert relayed.ended == [("200", True)]
    assert relayed.request_failures == 0
