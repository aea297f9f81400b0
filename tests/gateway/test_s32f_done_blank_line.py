"""A server-sent event ends at its blank line: a client (the openai one included) never
dispatches one without it. A stream whose body ends on ``data: [DONE]`` (or a Responses
stream's last event) without that blank line never told the client its end: it is cut,
ends with the gateway's error event after its whole events (the piece is not sent: the
client would read the two as one event), and is counted failed. A [DONE] whose blank
line comes in a later read is whole."""

from __future__ import annotations

import json

import pytest

from tests.support.relayed_streams import Relayed, relayed


def _event(text: str, finish: str | None) -> bytes:
    return b"data: %s\n\n" % json.dumps({
        "id": "cmpl-1", "object": "text_completion", "created": 1, "model": "m",
        "choices": [{"index": 0, "text": text, "logprobs": None,
                     "finish_reason": finish}]}).encode()


_EVENTS = _event("a", None) + _event("b", "length")
_DONE = b"data: [DONE]"


def _sent(relay: Relayed) -> bytes:
    return b"".join(body for body, _, _ in relay.sent)


def _assert_cut(relay: Relayed, whole_events: bytes) -> None:
    body = _sent(relay)
    assert body.startswith(whole_events)
    error = body[len(whole_events):]
    assert error.startswith((b"data: ", b"event: ")) and error.endswith(b"\n\n")
    assert b"upstream_broken" in error and b"[DONE]" not in body
    assert relay.sent[-1][1] is False  # the client's body ends (after the error event)
    assert relay.ended == [False]


@pytest.mark.parametrize("several_choices", [False, True])
@pytest.mark.parametrize("writes, end_apart_s", [
    ([_EVENTS + _DONE], None),  # all in one read, the body's end with it
    ([_EVENTS, _DONE], None),  # [DONE] in a read of its own, the end with it
    ([_EVENTS, _DONE], 0.05),  # ... and the end later
    ([_EVENTS, _DONE + b"\n"], None),  # one line end: no blank line
    ([_EVENTS, _DONE + b"\n"], 0.05),
])
def test_a_done_without_its_blank_line_is_cut(writes: list[bytes], end_apart_s: float | None,
                                              several_choices: bool) -> None:
    relay = relayed(writes, 0.01, end_apart_s, "/v1/completions",
                    several_choices=several_choices)
    _assert_cut(relay, _EVENTS)


@pytest.mark.parametrize("ends", [[b"\n\n"], [b"\n", b"\n"], [b"\r\n\r\n"]])
def test_a_done_whose_blank_line_comes_in_a_later_read_is_whole(ends: list[bytes]) -> None:
    relay = relayed([_EVENTS, _DONE, *ends], 0.01, None, "/v1/completions",
                    several_choices=False)
    assert _sent(relay) == _EVENTS + _DONE + b"".join(ends)
    assert relay.sent[-1][1] is False
    assert relay.ended == [True]


def test_a_responses_last_event_without_its_blank_line_is_cut() -> None:
    def named(kind: str, data: dict[str, object]) -> bytes:
        return b"event: %s\ndata: %s" % (kind.encode(),
                                          json.dumps({**data, "type": kind}).encode())

    events = named("response.created", {"response": {"id": "r1", "status": "in_progress"}}) \
        + b"\n\n" + named("response.output_text.delta", {"delta": "hi"}) + b"\n\n"
    last = named("response.completed", {"response": {"id": "r1", "status": "completed"}})
    relay = relayed([events, last], 0.01, None, "/v1/responses", several_choices=False)
    _assert_cut(relay, events)
    assert b"response.completed" not in _sent(relay)
