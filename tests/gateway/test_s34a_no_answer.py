"""A replica's answer that is no answer is a failed try of that replica, never relayed: a
redirect (its ``Location`` would send a client that follows it, the openai client among
them, on to wherever the replica pointed, the prompt with it), and a success that carries
nothing (no body, an error object under a 200, a completion's or chat's ``choices``
empty where one choice was asked, a stream of one choice that ends with no choice at
all). The next replica is tried, as after a 5xx before any byte; from the last, the
client gets a 502 naming the replica and what it answered."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests.support.counted_answers import chunked, one_counted
from tests.support.fake_replica import Behaviour, fake_replica
from tests.support.foreign_raw import raw_replica
from tests.support.gateway_harness import metric, start_gateway

_CHAT = {"model": "m", "messages": [{"role": "user", "content": "my secret prompt"}],
         "max_tokens": 5}
_STEAL = "http://127.0.0.1:9/steal"
_RETRIED = 'kvgate_retries_total{cause="%s",replica="a"}'


def _answer(status: str, body: bytes = b"", content_type: str | None = "application/json",
            *extra: str) -> bytes:
    """A whole answer, its body under a content-length."""
    head = [f"HTTP/1.1 {status}", *extra, f"content-length: {len(body)}"]
    if content_type is not None:
        head.append(f"content-type: {content_type}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def _counted(answer: bytes, tried: list[bytes]) -> Callable[[], bytes]:
    """A raw replica's answer, noted in ``tried`` each time it is given."""
    def give() -> bytes:
        tried.append(answer)
        return answer

    return give


def _redirect(status: str) -> bytes:
    return _answer(status, b"", None, f"location: {_STEAL}")


def _chat_answer(**fields: Any) -> bytes:
    return json.dumps({"id": "x", "object": "chat.completion", "created": 0, "model": "m",
                       **fields}).encode()


_EMPTY: dict[str, tuple[bytes, str]] = {  # what a replica answered, what the 502 names
    "204": (_answer("204 No Content", b"", None), "answered 204 with no body"),
    "200_no_body": (_answer("200 OK", b"", None), "answered 200 with no body"),
    "error_object": (_answer("200 OK", json.dumps({"error": {
        "message": "oops", "type": "server_error", "param": None, "code": None}}).encode()),
        "answered 200 with an error object and no choice: oops"),
    "flat_error": (_answer("200 OK", json.dumps({
        "object": "error", "message": "engine dead", "type": "x", "code": 500}).encode()),
        "answered 200 with an error object and no choice: engine dead"),
    "no_choice": (_answer("200 OK", _chat_answer(choices=[], usage={
        "prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8})),
        "answered 200 with no choice (its choices empty)"),
}


@pytest.mark.parametrize("status", ["302 Found", "307 Temporary Redirect"])
def test_a_redirect_is_tried_on_the_next_replica_and_never_relayed(
        serve: Any, status: str) -> None:
    b = Behaviour("b", model="m")
    rb = serve(fake_replica(b))
    tried: list[bytes] = []  # the requests the redirecting replica answered
    with raw_replica(_counted(_redirect(status), tried)) as url:
        gw = start_gateway(serve, [("a", url), ("b", rb.url)])
        for _ in range(2):  # (round robin: at least one goes to ``a`` first)
            r = httpx.post(f"{gw.url}/v1/chat/completions", json=_CHAT, timeout=10)
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["message"]["content"] == "b ok"
            assert "location" not in r.headers and r.headers["x-kvgate-replica"] == "b"
        assert tried and metric(gw, _RETRIED % "3xx") == len(tried)
        assert len(b.received) == 2


@pytest.mark.parametrize(("status", "stream"), [
    ("307 Temporary Redirect", False), ("307 Temporary Redirect", True),
    ("302 Found", False),
    ("099 Odd", False),  # no HTTP status, though the parser reads it
])
def test_a_redirect_from_the_last_replica_is_a_502_naming_it(serve: Any, status: str,
                                                             stream: bool) -> None:
    with raw_replica(lambda: _redirect(status)) as url:
        gw = start_gateway(serve, [("a", url)])
        r = httpx.post(f"{gw.url}/v1/chat/completions", json={**_CHAT, "stream": stream},
                       timeout=10)
        assert r.status_code == 502 and "location" not in r.headers
        message = r.json()["error"]["message"]
        assert f"replica 'a' answered {int(status.split()[0])}, which is no answer" \
            in message and _STEAL not in message
        assert one_counted(gw) == {"502": 1.0}


@pytest.mark.parametrize("case", sorted(_EMPTY))
def test_an_answer_that_carries_nothing_is_tried_on_the_next_replica(
        serve: Any, case: str) -> None:
    b = Behaviour("b", model="m")
    rb = serve(fake_replica(b))
    tried: list[bytes] = []
    with raw_replica(_counted(_EMPTY[case][0], tried)) as url:
        gw = start_gateway(serve, [("a", url), ("b", rb.url)])
        for _ in range(2):
            r = httpx.post(f"{gw.url}/v1/chat/completions", json=_CHAT, timeout=10)
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["message"]["content"] == "b ok"
        assert tried and metric(gw, _RETRIED % "empty") == len(tried)


@pytest.mark.parametrize("case", sorted(_EMPTY))
def test_an_answer_that_carries_nothing_from_the_last_replica_is_a_502_naming_it(
        serve: Any, case: str) -> None:
    answer, told = _EMPTY[case]
    with raw_replica(lambda: answer) as url:
        gw = start_gateway(serve, [("a", url)])
        r = httpx.post(f"{gw.url}/v1/chat/completions", json=_CHAT, timeout=10)
        assert r.status_code == 502
        assert f"replica 'a' {told}" in r.json()["error"]["message"]
        assert one_counted(gw) == {"502": 1.0}


def test_a_known_endpoints_answer_without_a_body_is_a_502(serve: Any) -> None:
    with raw_replica(lambda: _answer("204 No Content", b"", None)) as url:
        gw = start_gateway(serve, [("a", url)])
        r = httpx.post(f"{gw.url}/v1/responses", json={"model": "m", "input": "hi"},
                       timeout=10)
        assert r.status_code == 502
        assert "replica 'a' answered 204 with no body" in r.json()["error"]["message"]


def _chunk(choices: list[dict[str, Any]], **fields: Any) -> bytes:
    value = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m",
             "choices": choices, **fields}
    return b"data: " + json.dumps(value).encode() + b"\n\n"


_USAGE = _chunk([], usage={"prompt_tokens": 5, "completion_tokens": 0, "total_tokens": 5})
_DONE = b"data: [DONE]\n\n"


@pytest.mark.parametrize(("events", "status"), [
    ((_USAGE, _DONE), "502"),  # no choice at all, only the usage
    ((_DONE,), "502"),  # nothing but [DONE]
    # a writer that tells no finish reason: its choice came, judged by its [DONE]
    ((_chunk([{"index": 0, "delta": {"content": "hi"}}]), _USAGE, _DONE), "200"),
], ids=["usage_only", "done_only", "choice_without_finish_key"])
def test_a_stream_of_one_choice_that_ends_with_no_choice_is_failed(
        serve: Any, events: tuple[bytes, ...], status: str) -> None:
    answer = chunked(*events)
    with raw_replica(lambda: answer) as url:
        gw = start_gateway(serve, [("a", url)], max_attempts=1)
        r = httpx.post(f"{gw.url}/v1/chat/completions", json={**_CHAT, "stream": True},
                       timeout=10)
        assert r.status_code == 200  # the stream's head went out with its first event
        if status == "200":
            assert r.content == b"".join(events)
        else:
            head = b"".join(events[:-1])
            assert r.content.startswith(head) and b"[DONE]" not in r.content
            error = json.loads(r.content[len(head):].removeprefix(b"data: "))["error"]
            assert error["code"] == "upstream_empty"
            assert "replica 'a' ended the answer with no choice at all" in error["message"]
        assert one_counted(gw) == {status: 1.0}
