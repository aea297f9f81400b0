"""``POST /admin/replicas`` refuses a body that is no replica with a 400 that names the
key and what it got, in a message of bounded length: a value of megabytes, or one nested
a thousand deep, was shown whole (its repr) or answered 500."""

from __future__ import annotations

import asyncio

import httpx
import orjson
import pytest

from tests.support.admin_posts import REPLICA_URL, admin_app, post_replica

_URL = REPLICA_URL
_DEEP = 1000  # levels of nesting (orjson reads up to 1,024)


def _added(body: bytes) -> httpx.Response:
    return asyncio.run(post_replica(admin_app(), body))


@pytest.mark.parametrize(("body", "named"), [
    (b'{"id": "b", "url": "%s", "weight": %s1%s}' % (_URL.encode(), b"[" * _DEEP,
                                                    b"]" * _DEEP),
     "replica.weight: expected a finite number, got an array of 1"),
    (orjson.dumps({"id": "b", "url": _URL, "kv_events": {"host": "x" * 2_000_000}}),
     "replica.kv_events: expected a string, got an object {'host'}"),
    (orjson.dumps([0] * 1_000_000), "a replica is a JSON object, got an array of 1000000"),
], ids=["deep", "object", "array"])
def test_a_nested_value_is_refused_naming_its_key(body: bytes, named: str) -> None:
    r = _added(body)
    assert r.status_code == 400, r.text[:300]
    error = r.json()["error"]
    assert error["code"] == "invalid_replica" and named in error["message"], error
    assert len(error["message"]) < 200


@pytest.mark.parametrize(("body", "named"), [
    (orjson.dumps({"id": "b", "url": _URL, "k" * 2_000_000: 1}), "unknown key 'kkk"),
    (orjson.dumps({"id": "b", "url": _URL, "kv_events": "http://" + "h" * 2_000_000}),
     "kv_events 'http://hhh"),
], ids=["key", "value"])
def test_an_error_about_a_long_string_is_cut_short(body: bytes, named: str) -> None:
    r = _added(body)
    assert r.status_code == 400, r.text[:300]
    error = r.json()["error"]
    assert error["code"] == "invalid_replica" and named in error["message"], \
        error["message"][:300]
    assert len(error["message"]) < 1100
