"""A replica added through the admin API whose KV event endpoint another replica of the
live fleet already names is refused with a 400
naming both replicas and the endpoint: two replicas following one engine both mirrored
its cache. Once that replica leaves, the endpoint may be named again."""

from __future__ import annotations

import httpx

from tests.support.gateway_harness import AUTH, Gateway, Serve, start_gateway

FIRST = {"id": "r0", "url": "http://127.0.0.1:8101", "kv_events": "tcp://127.0.0.1:5557",
          "kv_events_replay": "tcp://127.0.0.1:5600"}


def _ids(gw: Gateway) -> list[str]:
    listed = httpx.get(f"{gw.admin}/admin/replicas", headers=AUTH).json()["replicas"]
    return sorted(r["id"] for r in listed)


def _refused(gw: Gateway, body: dict[str, object]) -> str:
    answer = httpx.post(f"{gw.admin}/admin/replicas", headers=AUTH, json=body)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["code"] == "invalid_replica" and error["type"] == "invalid_request_error"
    message: str = error["message"]
    return message


def test_an_added_replica_naming_another_replicas_endpoint_is_refused(serve: Serve) -> None:
    gw = start_gateway(serve, [])
    first = httpx.post(f"{gw.admin}/admin/replicas", headers=AUTH, json=FIRST)
    assert first.status_code == 201, first.text
    # its publish endpoint, as another's own
    message = _refused(gw, {"id": "a1", "url": "http://127.0.0.1:8102",
                            "kv_events": "tcp://127.0.0.1:5557"})
    assert message.startswith("replica a1 kv_events 'tcp://127.0.0.1:5557' is also replica "
                              "r0's kv_events: each replica's engine publishes on endpoints")
    # its replay endpoint, as another's publish one
    assert "replica a1 kv_events 'tcp://127.0.0.1:5600' is also replica r0's " \
        "kv_events_replay" in _refused(gw, {"id": "a1", "url": "http://127.0.0.1:8102",
                                            "kv_events": "tcp://127.0.0.1:5600"})
    # a rank of a replica of several meets another's endpoint
    added = httpx.post(f"{gw.admin}/admin/replicas", headers=AUTH, json={
        "id": "a1", "url": "http://127.0.0.1:8102", "kv_events": "tcp://127.0.0.1:6001"})
    assert added.status_code == 201, added.text
    assert "replica ds.dp1 kv_events 'tcp://127.0.0.1:6001' is also replica a1's " \
        "kv_events" in _refused(gw, {"id": "ds", "url": "http://127.0.0.1:8103",
                                     "kv_events": "tcp://127.0.0.1:6000",
                                     "data_parallel_size": 2})
    assert _ids(gw) == ["a1", "r0"]
    # once a1 left, its endpoint is free
    assert httpx.delete(f"{gw.admin}/admin/replicas/a1", headers=AUTH).status_code == 200
    again = httpx.post(f"{gw.admin}/admin/replicas", headers=AUTH, json={
        "id": "ds", "url": "http://127.0.0.1:8103", "kv_events": "tcp://127.0.0.1:6000",
        "data_parallel_size": 2})
    assert again.status_code == 201, again.text
    assert _ids(gw) == ["ds.dp0", "ds.dp1", "r0"]
