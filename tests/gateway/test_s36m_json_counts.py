"""The gateway counts a request body's arrays, objects and keys on its bytes before
decoding it, and refuses one past ``MAX_JSON_CONTAINERS`` or ``MAX_JSON_KEYS`` with a
400 naming the count and the limit (decoding millions of them held the event loop over a
second); a body at the limits is served, and brackets and colons inside strings are text.
An ``/invocations`` body is decoded once, for the route that serves it too."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import httpx
import orjson
import pytest

import kvwire.openai_schema
from kvwire.request_edge import MAX_JSON_CONTAINERS, MAX_JSON_KEYS
from tests.support.gateway_harness import AUTH, Serve, two_replicas


def _post(url: str, body: dict[str, Any]) -> httpx.Response:
    raw = json.dumps(body, separators=(",", ":")).encode()
    return httpx.post(url, content=raw, headers={"content-type": "application/json",
                                                 **AUTH}, timeout=30)


def _batch(extra: int) -> dict[str, Any]:
    """A completions batch of token-id prompts holding ``MAX_JSON_CONTAINERS + extra``
    containers: the body's object, its prompt array and one array per prompt."""
    return {"model": "sim-model", "prompt": [[1]] * (MAX_JSON_CONTAINERS - 2 + extra)}


def _biased(extra: int) -> dict[str, Any]:
    """A completion holding ``MAX_JSON_KEYS + extra`` keys (four its own, the rest
    ``logit_bias``'s)."""
    bias = {str(i): 1 for i in range(MAX_JSON_KEYS - 4 + extra)}
    return {"model": "sim-model", "prompt": "hi", "max_tokens": 1, "logit_bias": bias}


def _refused(r: httpx.Response, code: str, count: int, limit: int) -> None:
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["code"] == code
    assert error["type"] == "invalid_request_error"
    assert f"holds {count:,} JSON" in error["message"]
    assert f"the most accepted is {limit:,}" in error["message"]


def test_a_body_past_the_container_or_key_bound_is_refused_and_one_at_it_served(
        serve: Serve) -> None:
    gw, a, b = two_replicas(serve)
    assert _post(f"{gw.url}/v1/completions", _batch(0)).status_code == 200
    _refused(_post(f"{gw.url}/v1/completions", _batch(1)), "too_many_json_containers",
             MAX_JSON_CONTAINERS + 1, MAX_JSON_CONTAINERS)
    assert _post(f"{gw.url}/v1/completions", _biased(0)).status_code == 200
    _refused(_post(f"{gw.url}/v1/completions", _biased(1)), "too_many_json_keys",
             MAX_JSON_KEYS + 1, MAX_JSON_KEYS)
    # the other ways in: /invocations, a pass-through route, the admin API's explain
    _refused(_post(f"{gw.url}/invocations", _batch(1)), "too_many_json_containers",
             MAX_JSON_CONTAINERS + 1, MAX_JSON_CONTAINERS)
    _refused(_post(f"{gw.url}/v1/embeddings", {"model": "sim-model", "input": [[1]] * (
        MAX_JSON_CONTAINERS)}), "too_many_json_containers", MAX_JSON_CONTAINERS + 2,
        MAX_JSON_CONTAINERS)
    _refused(_post(f"{gw.admin}/admin/explain", _batch(1)), "too_many_json_containers",
             MAX_JSON_CONTAINERS + 1, MAX_JSON_CONTAINERS)
    assert len(a.received) + len(b.received) == 2  # the two bodies at the bounds


def test_brackets_and_colons_inside_strings_are_text(serve: Serve) -> None:
    gw, a, b = two_replicas(serve)
    text = '[{:"\\' * (MAX_JSON_KEYS + 1)  # quotes and backslashes escaped in JSON
    r = _post(f"{gw.url}/v1/completions", {"model": "sim-model", "prompt": text,
                                            "max_tokens": 1, "stop": [text]})
    assert r.status_code == 200, r.text
    assert len(a.received) + len(b.received) == 1


def test_an_invocations_body_is_decoded_once(serve: Serve,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    gw, a, b = two_replicas(serve)
    decoded: list[bytes] = []

    def loads(raw: bytes) -> Any:
        decoded.append(raw)
        return orjson.loads(raw)

    # every request body's decoding (``decode_json``), counted
    monkeypatch.setattr(kvwire.openai_schema, "orjson", SimpleNamespace(
        loads=loads, JSONDecodeError=orjson.JSONDecodeError))
    assert _post(f"{gw.url}/invocations", {"model": "sim-model", "prompt": "hi",
                                           "max_tokens": 1}).status_code == 200
    assert len(decoded) == 1
    assert _post(f"{gw.url}/invocations", {"model": "sim-model", "input": "hi"}
                 ).status_code == 200  # an embedding: passed through to /invocations
    assert len(decoded) == 2
    assert sorted(a.paths + b.paths) == ["/invocations", "/v1/completions"]
    # its checks, run apart from the decoding, still name an integer past 64 bits as sent
    r = _post(f"{gw.url}/invocations", {"model": "sim-model", "prompt": "hi",
                                        "max_tokens": 10**30})
    assert r.status_code == 400, r.text
    assert str(10**30) in r.json()["error"]["message"]
