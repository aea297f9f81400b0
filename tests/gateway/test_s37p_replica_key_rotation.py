"""A replica's ``api_key_file`` is read again when it changes (a rotated Kubernetes
Secret): at the monitor's checks, at most every ``KEY_RECHECK_S``, and at once when the
replica refuses the gateway's key. A replica that refuses the key the gateway holds for it
(401/403) is no answer to relay as if the client's own key were wrong: the try goes to the
next replica, the refusal is counted in ``kvgate_replica_auth_failures_total`` and said in
the replica's ``last_error``, and from the last replica the client gets a 502 saying the
replica refused the gateway's credentials."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import pytest
from aiohttp import web
from starlette.responses import JSONResponse

from gateway.admin import create_admin_app
from gateway.app import create_app
from gateway.config import HealthConfig, ReplicaConfig, ScrapeConfig, parse_config
from gateway.fleet import KEY_RECHECK_S, Fleet
from gateway.http_server import bounded_protocol
from gateway.monitor import Monitor
from gateway.state import build_state
from tests.support.fake_replica import Behaviour, fake_replica
from tests.support.gateway_harness import ADMIN_TOKEN, AUTH, Gateway, Serve, metric, start_gateway
from tests.support.servers import aiohttp_site

CLIENT_KEY = "client-key-0123456789abcdef"
CLIENT = {"authorization": f"Bearer {CLIENT_KEY}"}
OLD, NEW = "old-replica-key-0123456789", "new-replica-key-0123456789"
CHAT = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}]}


def _keyed(app: Any, want: list[str], guarded_paths: str = "/v1") -> Any:
    """``app`` behind vLLM's ``--api-key``: its /v1 paths (``guarded_paths``) refuse (401)
    any other key than ``want[0]``, which the test changes."""
    async def guarded(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"].startswith(guarded_paths):
            got = dict(scope["headers"]).get(b"authorization", b"")
            if got != f"Bearer {want[0]}".encode():
                refusal = JSONResponse({"error": {"message": "Unauthorized", "type": "x",
                                                  "param": None, "code": None}},
                                       status_code=401)
                await refusal(scope, receive, send)
                return
        await app(scope, receive, send)
    return guarded


def _gateway(serve: Serve, replicas: list[dict[str, Any]]) -> Gateway:
    return start_gateway(serve, replicas,
                         auth={"api_keys": [{"key": CLIENT_KEY, "tenant": "acme"}]})


def _last_error(gw: Gateway, rid: str) -> str | None:
    listed = httpx.get(f"{gw.admin}/admin/replicas", headers=AUTH).json()["replicas"]
    return next(r["last_error"] for r in listed if r["id"] == rid)


def test_a_rotated_key_file_is_read_again_and_a_refused_key_is_the_replicas_fault(
        serve: Serve, tmp_path: Path) -> None:
    key_file = tmp_path / "r0.key"
    key_file.write_text(OLD + "\n")
    want = [OLD]
    behaviour = Behaviour("r0")
    replica = serve(_keyed(fake_replica(behaviour), want))
    gw = _gateway(serve, [{"id": "r0", "url": replica.url, "api_key_file": str(key_file)}])
    chat = f"{gw.url}/v1/chat/completions"
    assert httpx.post(chat, json=CHAT, headers=CLIENT).status_code == 200
    assert behaviour.headers[-1]["authorization"] == f"Bearer {OLD}"

    # the replica takes another key; the gateway's file still holds the old one
    want[0] = NEW
    refused = httpx.post(chat, json=CHAT, headers=CLIENT)
    assert refused.status_code == 502, refused.text  # not the replica's 401, relayed
    error = refused.json()["error"]
    assert error["code"] == "upstream_auth_failed"
    assert "replica 'r0' refused the gateway's credentials" in error["message"]
    assert "the client's API key was not sent" in error["message"]
    assert (metric(gw, 'kvgate_replica_auth_failures_total{replica="r0"}') or 0) >= 1
    said = _last_error(gw, "r0")
    assert said is not None and "refused the gateway's key" in said, said
    assert "set api_key" not in said

    # the Secret is rotated: the next request after a refusal (or a check) sends the new key
    key_file.write_text(NEW + "\n")
    answers = [httpx.post(chat, json=CHAT, headers=CLIENT) for _ in range(2)]
    assert answers[-1].status_code == 200, answers[-1].text
    assert behaviour.headers[-1]["authorization"] == f"Bearer {NEW}"
    assert _last_error(gw, "r0") is None  # the refused key is no longer sent


def test_a_replica_refusing_the_gateways_key_sends_the_request_to_the_next(
        serve: Serve, tmp_path: Path) -> None:
    key_file = tmp_path / "key"
    key_file.write_text(OLD + "\n")
    a, b = Behaviour("a"), Behaviour("b")
    # a takes another key than the file's for completions (its model list is open, so it
    # is routed to); its refusals of proxied requests alone are counted
    ra = serve(_keyed(fake_replica(a), [NEW], "/v1/chat"))
    rb = serve(_keyed(fake_replica(b), [OLD]))
    gw = _gateway(serve, [{"id": "a", "url": ra.url, "api_key_file": str(key_file)},
                          {"id": "b", "url": rb.url, "api_key_file": str(key_file)}])
    statuses = [httpx.post(f"{gw.url}/v1/chat/completions", json=CHAT,
                           headers=CLIENT).status_code for _ in range(4)]
    assert statuses == [200] * 4
    assert len(b.received) == 4 and not a.received  # a refused it before the prompt
    assert (metric(gw, 'kvgate_replica_auth_failures_total{replica="a"}') or 0) >= 2
    assert "refused the gateway's key" in (_last_error(gw, "a") or "")
    assert metric(gw, 'kvgate_replica_auth_failures_total{replica="b"}') == 0


def test_a_clients_key_forwarded_and_refused_is_still_the_replicas_answer(
        serve: Serve) -> None:
    """Without a key of the gateway's for the replica, its 401 is about the client's key
    (forwarded): relayed as it came, and no refusal of the gateway's."""
    behaviour = Behaviour("r0")
    replica = serve(_keyed(fake_replica(behaviour), [NEW], "/v1/chat"))
    config = parse_config({
        "replicas": [{"id": "r0", "url": replica.url}],  # no client keys: forwarded
        "health": {"interval_s": 0.2, "timeout_s": 2.0},
        "admin": {"token": ADMIN_TOKEN, "allow_networks": ["127.0.0.0/8"]}})
    state = build_state(config)
    pair = serve(create_app(config, state), side=create_admin_app(state),
                 http=bounded_protocol(config, state.refused_by_server))
    answer = httpx.post(f"{pair.url}/v1/chat/completions", json=CHAT,
                        headers={"authorization": "Bearer wrong-client-key-0123"})
    assert answer.status_code == 401
    assert answer.json()["error"]["message"] == "Unauthorized"


def test_the_key_file_is_looked_at_every_few_seconds_and_kept_when_unreadable(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    key_file = tmp_path / "key"
    key_file.write_text(OLD + "\n")
    fleet = Fleet([ReplicaConfig(id="r0", url="http://127.0.0.1:1",
                                 api_key_file=str(key_file))])
    state = fleet.get("r0")
    assert state is not None and state.credentials == {"authorization": f"Bearer {OLD}"}
    assert state.recheck_key(now=100.0) is False  # looked at: unchanged
    key_file.write_text(NEW + "\n")
    assert state.recheck_key(now=100.0 + KEY_RECHECK_S / 2) is False  # not looked at yet
    assert state.credentials["authorization"] == f"Bearer {OLD}"
    assert state.recheck_key(now=100.0 + KEY_RECHECK_S) is True
    assert state.credentials["authorization"] == f"Bearer {NEW}"
    assert state.recheck_key(now=200.0) is False  # the same file: nothing read
    key_file.write_text(NEW + "\n\n")  # rewritten, the same key
    assert state.recheck_key(now=300.0) is False

    # emptied (mid-write), removed, then not a bearer token: the last key stays in use
    with caplog.at_level(logging.WARNING, logger="kvgate.fleet"):
        key_file.write_text("")
        assert state.recheck_key(now=400.0) is False
        key_file.unlink()
        assert state.recheck_key(refused=True) is False
    assert state.credentials["authorization"] == f"Bearer {NEW}"
    warned = [r.getMessage() for r in caplog.records if "cannot be read" in r.getMessage()]
    assert len(warned) == 1, warned  # one a minute per replica
    assert "replica r0" in warned[0] and str(key_file) in warned[0]
    assert NEW not in warned[0] and "holds no key" in warned[0]
    key_file.write_text("bad key\x01\n")
    assert state.recheck_key(refused=True) is False
    assert state.credentials["authorization"] == f"Bearer {NEW}"
    key_file.write_text(OLD + "\n")
    assert state.recheck_key(refused=True) is True
    assert state.credentials["authorization"] == f"Bearer {OLD}"


async def test_the_monitors_check_reads_a_rotated_key_file_before_its_calls(
        tmp_path: Path) -> None:
    key_file = tmp_path / "key"
    key_file.write_text(OLD + "\n")
    seen: list[str | None] = []

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="")

    async def models(request: web.Request) -> web.Response:
        seen.append(request.headers.get("authorization"))
        if request.headers.get("authorization") != f"Bearer {NEW}":
            return web.json_response({"error": {"message": "Unauthorized"}}, status=401)
        return web.json_response({"object": "list", "data": [{"id": "m"}]})

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    runner, port = await aiohttp_site(app)
    fleet = Fleet([ReplicaConfig(id="r0", url=f"http://127.0.0.1:{port}",
                                 api_key_file=str(key_file))])
    try:
        async with aiohttp.ClientSession() as session:
            monitor = Monitor(fleet, session, HealthConfig(timeout_s=5.0),
                              ScrapeConfig(timeout_s=5.0))
            state = fleet.get("r0")
            assert state is not None
            key_file.write_text(NEW + "\n")  # rotated after the replica was added
            await monitor.check_one(state)
            assert seen == [f"Bearer {NEW}"]
            assert state.models == ("m",) and state.auth_failures == 0
    finally:
        await runner.cleanup()
