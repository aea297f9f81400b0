"""``POST /admin/replicas`` takes a body up to ``max_body_bytes`` (16 MiB): a large one is
decoded and checked in a worker thread, as a served request's is (``parses_on_loop``),
and a small one on the event loop."""

from __future__ import annotations

import asyncio

import httpx
import orjson

from kvwire.request_edge import PARSE_ON_THREAD_BYTES
from tests.support.admin_posts import admin_app, post_replica
from tests.support.loop_check import calls_on_loop


def _added(body: bytes) -> tuple[int, httpx.Response]:
    """(orjson.loads calls on the event loop's thread, the answer) of posting ``body`` to
    a gateway's admin API, served in process on an event loop of its own."""
    app = admin_app()

    async def post() -> tuple[int, httpx.Response]:
        with calls_on_loop(orjson.loads) as calls:
            r = await post_replica(app, body)
        return calls[orjson.loads], r

    return asyncio.run(post())


def _replica(**extra: object) -> bytes:
    # a host outside the admin allowlist: refused once the body is read, with no
    # connection tried
    return orjson.dumps({"id": "b", "url": "http://10.9.9.9:8000", **extra})


def test_a_large_replica_body_is_parsed_off_the_event_loop() -> None:
    body = _replica(api_key="k" * (PARSE_ON_THREAD_BYTES + 1))
    on_loop, r = _added(body)
    assert r.status_code == 403 and r.json()["error"]["code"] == "replica_not_allowed", \
        r.text[:300]
    assert "'http://10.9.9.9:8000'" in r.json()["error"]["message"]  # it was parsed
    assert on_loop == 0


def test_a_small_replica_body_is_parsed_on_the_event_loop() -> None:
    on_loop, r = _added(_replica(api_key="k"))
    assert r.status_code == 403 and r.json()["error"]["code"] == "replica_not_allowed"
    assert on_loop == 1


def test_a_large_bad_body_is_refused_naming_the_fault_off_the_event_loop() -> None:
    on_loop, r = _added(b"{" + b" " * PARSE_ON_THREAD_BYTES + b'"id": "b",}')
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json", r.text
    assert on_loop == 0
