"""A Responses stream cut mid-answer ends with an error event of the Responses API's own
shape (``event: error``, its data's ``type`` "error", ``code``, ``message``, ``param`` and
``sequence_number`` one past the last event the client got, where that is told), the
error object under ``error`` too (the openai client raises on it); a completion's or
chat's cut stream keeps its ``data: {"error": ...}`` event."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from tests.support.fake_replica import Behaviour, fake_replica
from tests.support.gateway_harness import Serve, start_gateway
from tests.support.relayed_streams import Relayed, relayed


def _named(kind: str, data: dict[str, Any], number: int | None) -> bytes:
    if number is not None:
        data = {**data, "sequence_number": number}
    return b"event: %s\ndata: %s\n\n" % (kind.encode(),
                                         json.dumps({**data, "type": kind}).encode())


def _events(numbered: bool) -> list[bytes]:
    return [_named("response.created", {"response": {"id": "r1", "status": "in_progress"}},
                   0 if numbered else None),
            *(_named("response.output_text.delta", {"delta": f"t{i} ", "item_id": "m1"},
                     i + 1 if numbered else None) for i in range(3))]


def _last_event(relay: Relayed) -> tuple[bytes, dict[str, Any]]:
    """The event line and data of the last event the client got."""
    body = b"".join(body for body, _, _ in relay.sent)
    last = body.rstrip(b"\n").rsplit(b"\n\n", 1)[-1]
    head, _, data = last.partition(b"\n")
    return head, json.loads(data.removeprefix(b"data: "))


@pytest.mark.parametrize(("numbered", "piece", "number"), [
    (True, False, 4),  # one past the last event's
    (True, True, 4),  # a piece of the next event held back: not the client's
    (False, False, None),  # the replica numbers none: left out
])
def test_a_cut_responses_stream_ends_with_a_responses_error_event(
        numbered: bool, piece: bool, number: int | None) -> None:
    writes = _events(numbered)
    if piece:
        writes.append(_named("response.output_text.delta", {"delta": "t9"}, 9)[:40])
    relay = relayed(writes, 0.01, None, "/v1/responses", several_choices=False)
    assert relay.ended == [False]
    head, data = _last_event(relay)
    assert head == b"event: error"
    assert data["type"] == "error" and data["code"] == "upstream_broken"
    assert data["param"] is None and "stopped mid-answer" in data["message"]
    assert data.get("sequence_number") == number
    assert data["error"]["code"] == "upstream_broken"


def test_a_cut_completion_stream_keeps_its_error_object_event() -> None:
    event = b'data: {"choices":[{"index":0,"text":"a","finish_reason":null}]}\n\n'
    relay = relayed([event], 0.01, None, "/v1/completions", several_choices=False)
    body = b"".join(body for body, _, _ in relay.sent)
    error = body[len(event):]
    assert error.startswith(b'data: {"error":')
    assert json.loads(error.removeprefix(b"data: "))["error"]["code"] == "upstream_broken"


def test_the_openai_client_raises_on_a_cut_responses_stream(serve: Serve) -> None:
    """Through a gateway: the stream the client reads ends with the Responses API's own
    error event, and the openai client raises on it (it would hand that event on as one
    more, were the error object not under ``error`` too)."""
    replica = Behaviour("r0", done=False, numbered=True)  # cut before its last event
    gw = start_gateway(serve, [("r0", serve(fake_replica(replica)).url)], max_attempts=1)
    request = {"model": "sim-model", "input": "x", "stream": True}
    with httpx.stream("POST", f"{gw.url}/v1/responses", json=request, timeout=10) as raw:
        body = raw.read()
    last = body.rstrip(b"\n").rsplit(b"\n\n", 1)[-1]
    head, _, data = last.partition(b"\n")
    assert head == b"event: error", body[-300:]
    error = json.loads(data.removeprefix(b"data: "))
    assert error["type"] == "error" and error["code"] == "upstream_broken"
    assert error["sequence_number"] == replica.chunks + 1  # one past the last delta's
    kinds: list[str] = []
    with openai.OpenAI(base_url=f"{gw.url}/v1", api_key="k", max_retries=0) as client, \
            pytest.raises(openai.APIError, match="stopped mid-answer"):
        for event in client.responses.create(**request):
            kinds.append(event.type)
    assert kinds == ["response.created"] + ["response.output_text.delta"] * replica.chunks
