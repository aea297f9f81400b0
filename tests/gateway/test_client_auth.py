"""Client API keys name tenants and stay at the gateway; a replica's own API key is used
for every call to it, and a replica refusing the gateway says so."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from gateway.admin import create_admin_app
from gateway.app import create_app
from gateway.config import parse_config
from gateway.state import build_state
from gateway.tenancy import tenant_salt
from policies.config import ConfigError
from tests.support.fake_replica import Behaviour, fake_replica
from tests.support.servers import ThreadServer
from tests.support.waiting import wait_until

Serve = Callable[..., ThreadServer]
ACME_KEY = "acme-key-0123456789"
SECRET = "s" * 32
ADMIN = {"authorization": "Bearer admin-token-0123456789"}


def post(url: str, key: str | None = None, **headers: str) -> httpx.Response:
    if key is not None:
        headers["authorization"] = f"Bearer {key}"
    return httpx.post(f"{url}/v1/completions", headers=headers,
                      json={"model": "sim-model", "prompt": "x"})


def test_keys_admit_clients_and_name_their_tenant(serve: Serve,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # a Kubernetes Secret made from a file keeps the file's newline: the key is read without
    monkeypatch.setenv("GLOBEX_KEY", "globex-key-0123456789\n")
    rec = Behaviour("rec")
    config = parse_config({
        "replicas": [{"id": "r0", "url": serve(fake_replica(rec)).url}],
        "scrape": {"enabled": False}, "trusted_proxies": ["127.0.0.0/8"],
        "tenancy": {"isolate": True, "secret": SECRET},
        "auth": {"api_keys": [{"key": ACME_KEY, "tenant": "acme"},
                              {"key_env": "GLOBEX_KEY", "tenant": "globex"}]}})
    url = serve(create_app(config)).url
    missing, wrong = post(url), post(url, "not-a-key-0123456789")
    assert missing.status_code == wrong.status_code == 401
    assert missing.json()["error"]["code"] == "missing_api_key"
    assert wrong.json()["error"]["code"] == "invalid_api_key"
    assert rec.received == []
    # the key names the tenant; a tenant header cannot override it
    assert post(url, ACME_KEY, **{"x-kvgate-tenant": "globex"}).status_code == 200
    assert post(url, "globex-key-0123456789").status_code == 200
    salts = [json.loads(raw)["cache_salt"] for raw in rec.received]
    assert salts == [tenant_salt(SECRET.encode(), "acme", None),
                     tenant_salt(SECRET.encode(), "globex", None)]
    assert all("authorization" not in h for h in rec.headers)  # the key stays here
    # the replica is told the key's tenant, never the one the client claimed
    assert [h.get("x-kvgate-tenant") for h in rec.headers] == ["acme", "globex"]
    # every /v1 route asks for a key, the model list too
    assert httpx.get(f"{url}/v1/models").status_code == 401
    listed = httpx.get(f"{url}/v1/models", headers={"authorization": f"Bearer {ACME_KEY}"})
    assert listed.status_code == 200 and listed.json()["object"] == "list"


def test_short_or_unreadable_keys_are_refused_at_load() -> None:
    with pytest.raises(ConfigError, match="at least 16"):
        parse_config({"auth": {"api_keys": [{"key": "short"}]}})
    with pytest.raises(ConfigError, match="KVGATE_TEST_UNSET"):
        parse_config({"replicas": [{"id": "r", "url": "http://127.0.0.1:1",
                                    "api_key_env": "KVGATE_TEST_UNSET"}]})


def test_a_key_listed_twice_is_refused_naming_its_tenants_not_the_key() -> None:
    with pytest.raises(ConfigError, match=r"api_keys\[1\] \(tenant 'beta'\) has the same key "
                                          r"as api_keys\[0\] \(tenant 'acme'\)") as err:
        parse_config({"auth": {"api_keys": [{"key": ACME_KEY, "tenant": "acme"},
                                            {"key": ACME_KEY, "tenant": "beta"}]}})
    assert ACME_KEY not in str(err.value)


def keyed_replica(key: str) -> Any:
    """A replica that answers only calls carrying its key (as vLLM's --api-key does)."""
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        headers = dict(scope["headers"])
        path = scope["path"]
        allowed = path == "/health" or headers.get(b"authorization") == f"Bearer {key}".encode()
        body, status = b'{"error": "unauthorized"}', 401
        if allowed:
            status = 200
            body = {"/v1/models": b'{"object": "list", "data": [{"id": "sim-model"}]}',
                    "/metrics": b"vllm:num_requests_running 0\n",
                    "/health": b"ok"}.get(path, json.dumps({
                        "id": "x", "object": "text_completion", "created": 0,
                        "model": "sim-model", "choices": [{"index": 0, "text": "keyed",
                                                           "finish_reason": "stop"}]}).encode())
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": body})

    return app


def test_a_replica_key_is_used_and_a_missing_one_is_reported(serve: Serve) -> None:
    replica = serve(keyed_replica("replica-key-0123456789")).url

    def gateway(**replica_keys: str) -> tuple[str, str]:
        config = parse_config({
            "replicas": [{"id": "r0", "url": replica, **replica_keys}],
            "health": {"interval_s": 0.2}, "scrape": {"interval_s": 0.2},
            "admin": {"token": ADMIN["authorization"][7:]}})
        state = build_state(config)
        pair = serve(create_app(config, state), side=create_admin_app(state))
        return pair.url, pair.side_url

    url, _ = gateway(api_key="replica-key-0123456789")
    r = post(url, "client-key-is-passed-on-0")
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == "keyed"
    wait_until(lambda: httpx.get(f"{url}/v1/models").json()["data"], 5, "models to be known")

    url, admin = gateway()

    def last_error() -> str:
        (state,) = httpx.get(f"{admin}/admin/replicas", headers=ADMIN).json()["replicas"]
        return str(state["last_error"] or "")

    wait_until(lambda: "api_key" in last_error(), 5, "the refusal to be reported")
    assert "answered 401" in last_error()
    metrics = httpx.get(f"{url}/metrics").text
    line = next(m for m in metrics.splitlines()
                if m.startswith('kvgate_replica_auth_failures_total{replica="r0"}'))
    assert float(line.split()[-1]) >= 1


def test_invocations_asks_for_a_key_before_it_reads_the_body(serve: Serve) -> None:
    # it read (and parsed, on the event loop) a body of any size first: a client with no
    # key stalled every request with 16 MiB bodies
    config = parse_config({
        "replicas": [{"id": "r0", "url": serve(fake_replica(Behaviour("r0"))).url}],
        "scrape": {"enabled": False}, "limits": {"body_timeout_s": 5},
        "auth": {"api_keys": [{"key": ACME_KEY, "tenant": "acme"}]}})
    url = serve(create_app(config)).url
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=3) as conn:
        conn.sendall(b"POST /invocations HTTP/1.1\r\nhost: x\r\ncontent-type: application/"
                     b"json\r\ncontent-length: 1000000\r\n\r\n{")  # the rest never comes
        started = time.monotonic()
        head = conn.recv(65536)
    assert head.startswith(b"HTTP/1.1 401") and time.monotonic() - started < 2
    assert post(url, ACME_KEY).status_code == 200
