"""Removing a replica the fleet does not hold is answered 404 naming the id by its start:
the answer repeated an id of any length (a 10 KB path segment) whole."""

from __future__ import annotations

import httpx

from tests.support.fake_replica import Behaviour, fake_replica
from tests.support.gateway_harness import AUTH, Serve, start_gateway


def test_an_unknown_replica_id_is_named_by_its_start(serve: Serve) -> None:
    gw = start_gateway(serve, [("a", serve(fake_replica(Behaviour("a"))).url)])
    for rid, named in (("nope", "'nope'"), ("x" * 10_000, "'xxxx")):
        r = httpx.delete(f"{gw.admin}/admin/replicas/{rid}", headers=AUTH, timeout=10)
        assert r.status_code == 404, r.text
        error = r.json()["error"]
        assert error["code"] == "replica_not_found" and named in error["message"]
        assert len(error["message"]) < 200, len(error["message"])
    assert httpx.get(f"{gw.admin}/admin/replicas", headers=AUTH).status_code == 200
