"""A Responses answer echoes the request's fields as the engine read them (numbers where
they were sent as vLLM's lax strings), and its ``metadata`` must be an object of strings,
as vLLM's; anything else is a 400 naming the field and the value."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.engine_servers import LiveEngine, serve_engine

MODEL = "tiny-sim"


@pytest.fixture(scope="module")
def live() -> Iterator[LiveEngine]:
    yield from serve_engine(LiveEngine, MODEL)


def _respond(live: LiveEngine, **fields: Any) -> Any:
    return live.http.post("/v1/responses", json={"model": MODEL, "input": "x", **fields})


def test_a_response_echoes_the_sampling_fields_as_read(live: LiveEngine) -> None:
    for stream in (False, True):
        r = _respond(live, top_p="0.5", max_output_tokens="3", temperature="0.7",
                     stream=stream)
        assert r.status_code == 200, r.text
        if stream:  # the response the stream's last event carries
            last = [line for line in r.text.splitlines() if line.startswith("data: ")][-1]
            body = json.loads(last[6:])["response"]
        else:
            body = r.json()
        assert (body["top_p"], body["max_output_tokens"], body["temperature"]) == \
            (0.5, 3, 0.7), body
        assert body["usage"]["output_tokens"] == 3
    body = _respond(live, max_output_tokens=2).json()
    assert (body["top_p"], body["max_output_tokens"]) == (1.0, 2)
    assert _respond(live).json()["max_output_tokens"] is None


def test_metadata_must_be_an_object_of_strings(live: LiveEngine) -> None:
    r = _respond(live, max_output_tokens=2, metadata={"team": "search"})
    assert r.status_code == 200 and r.json()["metadata"] == {"team": "search"}, r.text
    for bad, shown in [("tag-1", "tag-1"), ([1, 2], "an array of 2"), ({"n": 7}, "7")]:
        r = _respond(live, max_output_tokens=2, metadata=bad)
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["param"] == "metadata" and shown in error["message"], error
