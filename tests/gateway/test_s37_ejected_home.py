"""A continuation of a stored response (``/v1/responses``) whose replica is out of routing
for a moment (its health checks failing) is a retryable 503, not a 404: no other replica
stores it, and no client retries a 404."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.support.engine_servers import LiveEngine
from tests.support.fake_replica import Behaviour, fake_replica
from tests.support.gateway_harness import AUTH, Gateway, Serve, start_gateway
from tests.support.tenant_responses import KEY_A, MODEL, post_response, tiny_engine
from tests.support.waiting import wait_until


@pytest.fixture(scope="module")
def engine() -> Iterator[LiveEngine]:
    yield from tiny_engine()


def _healthy(gw: Gateway, replica: str) -> bool:
    listed = httpx.get(f"{gw.admin}/admin/replicas", headers=AUTH).json()["replicas"]
    return {r["id"]: r["healthy"] for r in listed}[replica]


def test_a_continuation_whose_replica_is_ejected_is_retried_later(
        serve: Serve, engine: LiveEngine) -> None:
    home = Behaviour("a", model=MODEL)
    # ``a`` stores the response; the real engine ``e`` does not (it answers 404)
    gw = start_gateway(serve, [("a", serve(fake_replica(home)).url), ("e", engine.url)])
    with httpx.Client(base_url=gw.url, timeout=30) as client:
        first = next(r for r in (post_response(client, KEY_A, input="hi") for _ in range(2))
                     if r.headers["x-kvgate-replica"] == "a")
        stored = first.json()["id"]
        home.healthy = False
        wait_until(lambda: not _healthy(gw, "a"), 10, "replica a ejected")
        sent = len(home.received)
        for stream in (False, True):
            out = post_response(client, KEY_A, input="and?", previous_response_id=stored,
                                stream=stream)
            assert out.status_code == 503, out.text
            assert out.headers["x-should-retry"] == "true"
            assert int(out.headers["retry-after"]) >= 1
            error = out.json()["error"]
            assert error["param"] == "previous_response_id", error
            assert error["code"] == "response_replica_unavailable", error
            assert stored in error["message"], error
        assert len(home.received) == sent  # nothing was sent while it is out
        home.healthy = True
        wait_until(lambda: _healthy(gw, "a"), 10, "replica a readmitted")
        went_on = post_response(client, KEY_A, input="and?", previous_response_id=stored)
        assert went_on.status_code == 200, went_on.text
        assert went_on.headers["x-kvgate-replica"] == "a"
        # a replica gone from the fleet took its store with it: the others are asked,
        # and none stores it (a 404)
        home.healthy = False
        wait_until(lambda: not _healthy(gw, "a"), 10, "replica a ejected")
        assert httpx.delete(f"{gw.admin}/admin/replicas/a", headers=AUTH).status_code == 200
        gone = post_response(client, KEY_A, input="and?", previous_response_id=stored)
        assert gone.status_code == 404, gone.text
        assert gone.json()["error"]["param"] == "previous_response_id"
