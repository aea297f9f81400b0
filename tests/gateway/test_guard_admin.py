"""The admin API opens to its token alone: not on the main listener, not without the
token, not at all where none is configured; every refusal in OpenAI's error shape."""

from __future__ import annotations

from typing import Any

import httpx

from gateway.admin import create_admin_app
from gateway.config import parse_config
from gateway.state import build_state
from tests.support.gateway_harness import ADMIN_TOKEN, Serve, start_gateway

SHAPE = {"message", "type", "param", "code"}


def _error(r: httpx.Response) -> dict[str, Any]:
    error: dict[str, Any] = r.json()["error"]
    assert set(error) == SHAPE, r.text
    return error


def test_admin_calls_need_the_token_on_the_admin_listener(serve: Serve) -> None:
    gw = start_gateway(serve, [("a", "http://127.0.0.1:9")])
    on_main = httpx.get(f"{gw.url}/admin/replicas",
                        headers={"authorization": f"Bearer {ADMIN_TOKEN}"})
    assert on_main.status_code == 404 and _error(on_main)["code"] == "not_found"
    for given in [None, "Bearer", f"Bearer {ADMIN_TOKEN}x", f"Basic {ADMIN_TOKEN}",
                  ADMIN_TOKEN, f"Bearer {ADMIN_TOKEN[:-1]}"]:
        headers = {} if given is None else {"authorization": given}
        r = httpx.get(f"{gw.admin}/admin/replicas", headers=headers)
        assert r.status_code == 401, (given, r.text)
        assert _error(r)["code"] == "invalid_admin_token" and ADMIN_TOKEN not in r.text
        added = httpx.post(f"{gw.admin}/admin/replicas", headers=headers,
                           json={"id": "b", "url": "http://127.0.0.1:10"})
        assert added.status_code == 401
    # the scheme is read in any case (RFC 9110), as client API keys' is
    for scheme in ["Bearer", "bearer", "BEARER"]:
        r = httpx.get(f"{gw.admin}/admin/replicas",
                      headers={"authorization": f"{scheme} {ADMIN_TOKEN}"})
        assert r.status_code == 200 and [x["id"] for x in r.json()["replicas"]] == ["a"]


def test_without_a_token_the_admin_api_is_off(serve: Serve) -> None:
    config = parse_config({"replicas": [{"id": "a", "url": "http://127.0.0.1:9"}]})
    admin = serve(create_admin_app(build_state(config)))
    for given in [{}, {"authorization": "Bearer"}, {"authorization": "Bearer None"}]:
        r = httpx.get(f"{admin.url}/admin/replicas", headers=given)
        assert r.status_code == 403 and _error(r)["code"] == "admin_off", r.text
