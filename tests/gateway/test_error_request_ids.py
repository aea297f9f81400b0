"""Every answer the gateway makes itself, errors included, carries an ``X-Request-Id``: the
client's when sane, the one its replicas saw when it got that far, else a new one."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest

from gateway.admin import create_admin_app
from gateway.app import create_app
from gateway.config import parse_config
from gateway.state import build_state
from tests.support.fake_replica import Behaviour, fake_replica
from tests.support.servers import ThreadServer
from tests.support.waiting import wait_until

Serve = Callable[..., ThreadServer]
KEY = "client-key-0123456789abcdef"
ADMIN_TOKEN = "admin-token-0123456789"


def gateway(serve: Serve, replicas: list[tuple[str, str]], **extra: Any) -> ThreadServer:
    config = parse_config({
        "replicas": [{"id": rid, "url": url} for rid, url in replicas],
        "policy": {"name": "round_robin"},
        "health": {"interval_s": 0.2, "timeout_s": 0.5},
        "admin": {"token": ADMIN_TOKEN},
        **extra,
    })
    state = build_state(config)
    return serve(create_app(config, state), side=create_admin_app(state))


def assert_openai_error(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return dict(error)


@pytest.fixture
def one(serve: Serve) -> tuple[ThreadServer, Behaviour]:
    a = Behaviour("a")
    return gateway(serve, [("a", serve(fake_replica(a)).url)]), a


BAD_REQUESTS = [
    ("POST", "/v1/completions", b"{not json", 400),
    ("POST", "/v1/chat/completions", b'{"model": "sim-model", "messages": []}', 400),
    ("POST", "/v1/completions", b'{"model": "other", "prompt": "x"}', 404),
    ("POST", "/v1/embeddings", b'{"model": 5, "input": "x"}', 400),
    ("GET", "/v1/no/such/path", b"", 404),
    ("POST", "/v1/models", b"", 405),
]


@pytest.mark.parametrize(("method", "path", "body", "status"), BAD_REQUESTS)
def test_gateway_errors_echo_or_make_a_request_id(
        one: tuple[ThreadServer, Behaviour], method: str, path: str, body: bytes,
        status: int) -> None:
    gw, _ = one
    echoed = httpx.request(method, gw.url + path, content=body,
                           headers={"x-request-id": "client-7"})
    assert_openai_error(echoed, status)
    assert echoed.headers["x-request-id"] == "client-7"
    made = httpx.request(method, gw.url + path, content=body,
                         headers={"x-request-id": "not a sane\tid"})
    assert_openai_error(made, status)
    assert made.headers["x-request-id"].startswith("gw-")
    other = httpx.request(method, gw.url + path, content=body)
    assert other.headers["x-request-id"].startswith("gw-")
    assert other.headers["x-request-id"] != made.headers["x-request-id"]


def test_a_clients_id_is_kept_whatever_visible_characters_it_has(
        one: tuple[ThreadServer, Behaviour]) -> None:
    # tracing ids, base64 and braced UUIDs reach the replica and come back as sent; a
    # space or a control character (a log line split) or past 256 characters does not
    gw, replica = one
    chat = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}]}
    for given, kept in (("{6f1c}=a+b/c==", True), ("x" * 256, True), ("x" * 257, False),
                        ("two words", False), ("caf\u00e9".encode(), False)):
        r = httpx.post(f"{gw.url}/v1/chat/completions", json=chat,
                       headers={"x-request-id": given})
        assert r.status_code == 200, r.text
        assert (r.headers["x-request-id"] == given) is kept, given
        assert replica.headers[-1]["x-request-id"] == r.headers["x-request-id"]


@pytest.mark.parametrize("path", ["/v1/models", "/health", "/ready"])
def test_the_gateways_own_answers_carry_an_id(one: tuple[ThreadServer, Behaviour],
                                              path: str) -> None:
    gw, _ = one
    wait_until(lambda: httpx.get(f"{gw.url}/ready").status_code == 200, 10, "readiness")
    r = httpx.get(gw.url + path, headers={"x-request-id": "probe-1"})
    assert r.status_code == 200 and r.headers["x-request-id"] == "probe-1"
    assert httpx.get(gw.url + path).headers["x-request-id"].startswith("gw-")


def test_unknown_paths_get_an_openai_404(one: tuple[ThreadServer, Behaviour]) -> None:
    gw, _ = one
    client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.NotFoundError) as missing:
        client.get("/no/such/thing", cast_to=object)
    body = missing.value.body
    assert isinstance(body, dict) and body["code"] == "not_found"
    assert "/v1/no/such/thing" in body["message"]
    assert missing.value.response.headers["x-request-id"].startswith("gw-")


def test_a_replica_error_names_the_id_its_replicas_saw(serve: Serve) -> None:
    broken = Behaviour("broken", status=500)
    gw = gateway(serve, [("broken", serve(fake_replica(broken)).url)])
    r = httpx.post(f"{gw.url}/v1/completions", json={"model": "sim-model", "prompt": "x"})
    assert assert_openai_error(r, 500)["type"] == "upstream_error"
    assert broken.headers, "the replica was tried"
    assert r.headers["x-request-id"] == broken.headers[-1]["x-request-id"]


def test_401_and_429_carry_the_id(serve: Serve) -> None:
    a = Behaviour("a", chunks=2, release=threading.Event())
    gw = gateway(serve, [("a", serve(fake_replica(a)).url)],
                 auth={"api_keys": [{"key": KEY}]}, limits={"max_in_flight": 1})
    r = httpx.post(f"{gw.url}/v1/completions", json={"model": "sim-model", "prompt": "x"},
                   headers={"x-request-id": "no-key-1"})
    assert_openai_error(r, 401)
    assert r.headers["x-request-id"] == "no-key-1"
    auth = {"authorization": f"Bearer {KEY}"}
    with httpx.stream("POST", f"{gw.url}/v1/completions", headers=auth, json={
            "model": "sim-model", "prompt": "x", "stream": True}) as held:
        assert held.status_code == 200
        wait_until(lambda: len(a.received) == 1, 10, "the first request to reach the replica")
        r = httpx.post(f"{gw.url}/v1/completions", headers={**auth, "x-request-id": "busy-2"},
                       json={"model": "sim-model", "prompt": "y"})
        assert_openai_error(r, 429)
        assert r.headers["x-request-id"] == "busy-2"
        assert a.release is not None
        a.release.set()
        assert b"".join(held.iter_bytes()).endswith(b"data: [DONE]\n\n")


def test_admin_errors_carry_an_id(one: tuple[ThreadServer, Behaviour]) -> None:
    gw, _ = one
    r = httpx.get(f"{gw.side_url}/admin/replicas", headers={"x-request-id": "adm-1"})
    assert_openai_error(r, 401)
    assert r.headers["x-request-id"] == "adm-1"


def test_a_405_names_the_methods_and_models_carry_their_fields(
        one: tuple[ThreadServer, Behaviour]) -> None:
    gw, _ = one
    r = httpx.post(f"{gw.url}/v1/models")
    assert r.status_code == 405 and "GET" in r.headers["allow"]  # RFC 9110
    wait_until(lambda: httpx.get(f"{gw.url}/v1/models").json()["data"], 10, "models")
    client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="unused", max_retries=0)
    (model,) = client.models.list().data
    assert model.id == "sim-model" and isinstance(model.created, int) and model.created > 0
