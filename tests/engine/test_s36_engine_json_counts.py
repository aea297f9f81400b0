"""The engine refuses a body of more JSON arrays and objects, or keys, than a request may
hold (``check_json_counts``, before it is decoded: decoding millions of containers holds
the interpreter, and with it every stream the engine serves) with the gateway's 400s, on
the OpenAI, Responses and native routes; a body within the bounds is served."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import orjson
import pytest

from kvwire.request_edge import MAX_JSON_CONTAINERS, MAX_JSON_KEYS
from tests.support.engine_servers import LiveEngine, serve_engine

MODEL = "tiny-sim"


@pytest.fixture(scope="module")
def live() -> Iterator[LiveEngine]:
    yield from serve_engine(LiveEngine, MODEL)


def _post(live: LiveEngine, path: str, body: bytes) -> httpx.Response:
    return httpx.post(f"{live.url}{path}", content=body, timeout=60,
                      headers={"content-type": "application/json"})


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/responses", "/generate"])
def test_a_body_of_too_many_containers_is_refused(live: LiveEngine, path: str) -> None:
    body = orjson.dumps({"model": MODEL, "prompt": [[1]] * MAX_JSON_CONTAINERS,
                         "input": "x", "text": "x", "max_tokens": 1})
    r = _post(live, path, body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "too_many_json_containers", r.text


def test_a_body_of_too_many_keys_is_refused(live: LiveEngine) -> None:
    bias = {str(i): 0 for i in range(MAX_JSON_KEYS + 1)}
    r = _post(live, "/v1/completions", orjson.dumps(
        {"model": MODEL, "prompt": "hi", "max_tokens": 1, "logit_bias": bias}))
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "too_many_json_keys", r.text


def test_brackets_in_text_are_not_counted(live: LiveEngine) -> None:
    prompt = "[{" * MAX_JSON_CONTAINERS  # text: no container at all
    r = _post(live, "/v1/completions", orjson.dumps(
        {"model": MODEL, "prompt": prompt, "max_tokens": 1}))
    assert r.json().get("error", {}).get("code") not in (
        "too_many_json_containers", "too_many_json_keys"), r.text
