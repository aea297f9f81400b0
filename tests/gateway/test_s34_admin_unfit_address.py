"""A replica added on the admin API is refused by name, whatever the allow lists admit, at
an address no replica can have (the unspecified, broadcast and multicast ones), as a
discovered one is; an ordinary address in the lists still joins."""

from __future__ import annotations

import orjson
import pytest

from gateway.admin import create_admin_app
from gateway.config import parse_config
from gateway.state import build_state
from tests.support.admin_posts import TOKEN, post_replica


@pytest.mark.parametrize(("host", "what"), [
    ("0.0.0.0", "the unspecified address"),
    ("[::]", "the unspecified address"),
    ("255.255.255.255", "the broadcast address"),
    ("224.0.0.1", "a multicast address"),
    ("[ff02::1]", "a multicast address"),
])
async def test_an_address_no_replica_has_is_refused_by_name(host: str, what: str) -> None:
    state = build_state(parse_config({
        "replicas": [{"id": "a", "url": "http://127.0.0.1:9"}],
        "admin": {"token": TOKEN, "allow_networks": ["0.0.0.0/0", "::/0"]}}))
    app = create_admin_app(state, TOKEN)
    answer = await post_replica(app, orjson.dumps({"id": "z", "url": f"http://{host}:8000"}))
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["param"] == "url" and what in error["message"], error
    assert [s.id for s in state.fleet] == ["a"]
    joined = await post_replica(app, orjson.dumps({"id": "b", "url": "http://10.1.2.3:8000"}))
    assert joined.status_code in (200, 201), joined.text
    assert [s.id for s in state.fleet] == ["a", "b"]


async def test_a_kv_event_endpoint_at_such_an_address_is_refused_by_name() -> None:
    state = build_state(parse_config({
        "replicas": [{"id": "a", "url": "http://127.0.0.1:9"}],
        "admin": {"token": TOKEN, "allow_networks": ["0.0.0.0/0"]}}))
    app = create_admin_app(state, TOKEN)
    for key, endpoint in (("kv_events", "tcp://0.0.0.0:5557"),
                          ("kv_events_replay", "tcp://224.0.0.1:5558")):
        answer = await post_replica(app, orjson.dumps(
            {"id": "z", "url": "http://10.1.2.3:8000", key: endpoint}))
        assert answer.status_code == 400, answer.text
        error = answer.json()["error"]
        assert error["param"] == key and endpoint in error["message"], error
    assert [s.id for s in state.fleet] == ["a"]
