"""The gateway and the engine refuse a request for its bearer credential alike: the same
401 body for a missing or wrong API key, the same 400 for the header sent twice, and every
401 (the admin API's too) names the scheme that would admit it, ``WWW-Authenticate:
Bearer`` (RFC 6750)."""

from __future__ import annotations

from collections.abc import Callable

import httpx

from engine.server import EngineServer, build_app
from gateway.admin import create_admin_app
from gateway.app import create_app
from gateway.config import parse_config
from gateway.state import build_state
from kvwire.tokenizer import load_tokenizer
from tests.support.engine_servers import served_core
from tests.support.servers import ThreadServer

Serve = Callable[..., ThreadServer]
KEY = "bearer-key-0123456789abcdef"
ADMIN_TOKEN = "admin-token-0123456789"


def _refusals(url: str) -> list[httpx.Response]:
    """``/v1/models`` asked with no key, a wrong key, another scheme, and the header twice."""
    with httpx.Client(base_url=url, timeout=10) as http:
        return [http.get("/v1/models"),
                http.get("/v1/models", headers={"authorization": "Bearer wrong-key"}),
                http.get("/v1/models", headers={"authorization": f"Basic {KEY}"}),
                http.get("/v1/models", headers=[("authorization", f"Bearer {KEY}")] * 2)]


def test_the_gateway_and_the_engine_refuse_a_key_alike(serve: Serve) -> None:
    srv = EngineServer(served_core(), load_tokenizer(None), model_name="tiny-sim",
                       sleep_modeled_time=True)
    engine = serve(build_app(srv, api_key=KEY)).url
    config = parse_config({"replicas": [{"id": "e", "url": engine, "api_key": KEY}],
                           "scrape": {"enabled": False}, "admin": {"token": ADMIN_TOKEN},
                           "auth": {"api_keys": [{"key": KEY}]}})
    state = build_state(config)
    gateway = serve(create_app(config, state), side=create_admin_app(state))

    by_engine, by_gateway = _refusals(engine), _refusals(gateway.url)
    assert [r.status_code for r in by_engine] == [401, 401, 401, 400]
    assert [r.json()["error"]["code"] for r in by_engine] == [
        "missing_api_key", "invalid_api_key", "missing_api_key", "repeated_authorization"]
    for ours, theirs in zip(by_engine, by_gateway, strict=True):
        assert (theirs.status_code, theirs.json()) == (ours.status_code, ours.json())
        assert ours.headers.get("www-authenticate") == \
            theirs.headers.get("www-authenticate") == \
            ("Bearer" if ours.status_code == 401 else None), (ours.headers, theirs.headers)

    # the admin API's 401 names the scheme too
    admin = httpx.get(f"{gateway.side_url}/admin/replicas",
                      headers={"authorization": "Bearer not-the-admin-token"})
    assert admin.status_code == 401 and admin.headers["www-authenticate"] == "Bearer", \
        admin.headers
