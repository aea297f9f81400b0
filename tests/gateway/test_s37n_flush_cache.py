"""``POST /flush_cache`` on the admin listener (SGLang's router's path, which RL trainers
call after a weight update) flushes every healthy replica's prefix cache, SGLang's
``/flush_cache`` or vLLM's ``/reset_prefix_cache``, and the policy forgets what it believed
the flushed replicas held; the main listener refuses it, saying where it is served."""

from __future__ import annotations

import random
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Mount, Route

from gateway.app import create_app
from gateway.config import parse_config
from gateway.state import build_state
from tests.support.fake_replica import Behaviour, fake_replica
from tests.support.gateway_harness import AUTH, Gateway, Serve, start_gateway
from tests.support.waiting import wait_until


def _replica(b: Behaviour, flushes: list[str], *paths: str) -> Starlette:
    """The fake replica, serving the cache flush at ``paths`` (recorded in ``flushes``)."""

    async def flush(request: Request) -> Response:
        flushes.append(request.url.path)
        return PlainTextResponse("Cache flushed.\n")

    return Starlette(routes=[*(Route(p, flush, methods=["POST"]) for p in paths),
                             Mount("", app=fake_replica(b))])


def _prompt(seed: int) -> str:
    rng = random.Random(seed)
    return " ".join(f"w{rng.randrange(100_000)}" for _ in range(800))  # some 1.5k tokens


def _explain(gw: Gateway, prompt: str) -> dict[str, Any]:
    r = httpx.post(f"{gw.admin}/admin/explain", headers=AUTH, timeout=10,
                   json={"model": "sim-model", "prompt": prompt})
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def _all_scraped(gw: Gateway, count: int) -> bool:
    rows = httpx.get(f"{gw.admin}/admin/replicas", headers=AUTH).json()["replicas"]
    return len(rows) == count and all(r["healthy"] and r["dialect"] for r in rows)


def test_flush_reaches_every_replica_and_empties_the_policys_model(serve: Serve) -> None:
    flushes: dict[str, list[str]] = {"a": [], "b": [], "c": []}
    apps = {"a": _replica(Behaviour("a"), flushes["a"], "/reset_prefix_cache"),  # vLLM's
            "b": _replica(Behaviour("b"), flushes["b"], "/flush_cache"),  # SGLang's
            "c": _replica(Behaviour("c"), flushes["c"])}  # vLLM without its dev mode
    gw = start_gateway(serve, [(rid, serve(app).url) for rid, app in apps.items()],
                       policy={"name": "cost"})
    wait_until(lambda: _all_scraped(gw, 3), 10, "every replica healthy and scraped")
    on: dict[str, str] = {}  # a prompt each replica answered
    for seed in range(60):  # the policy spreads new prompts: until each replica has one
        prompt = _prompt(seed)
        r = httpx.post(f"{gw.url}/v1/completions", timeout=10,
                       json={"model": "sim-model", "prompt": prompt})
        assert r.status_code == 200, r.text
        on.setdefault(r.headers["x-kvgate-replica"], prompt)
        if len(on) == 3:
            break
    assert sorted(on) == ["a", "b", "c"], sorted(on)
    shown = _explain(gw, on["a"])
    held = shown["policy_state"]["model_tokens"]
    assert all(held.get(rid, 0) > 0 for rid in "abc"), held
    assert shown["chosen"] == "a" and shown["matched_tokens"] > 1000, shown

    refused = httpx.post(f"{gw.admin}/flush_cache")  # no admin token
    assert refused.status_code == 401, refused.text
    assert refused.json()["error"]["code"] == "invalid_admin_token"
    on_main = httpx.post(f"{gw.url}/flush_cache", headers=AUTH)
    assert on_main.status_code == 403, on_main.text
    assert on_main.json()["error"]["code"] == "admin_listener_only"
    assert flushes == {"a": [], "b": [], "c": []}

    r = httpx.post(f"{gw.admin}/flush_cache", headers=AUTH, timeout=10)
    assert r.status_code == 502, r.text  # one replica could not flush
    body = r.json()
    assert body["status"] == "failed" and sorted(body["flushed"]) == ["a", "b"], body
    assert [f["replica"] for f in body["failed"]] == ["c"], body
    assert "VLLM_SERVER_DEV_MODE=1" in body["failed"][0]["error"], body
    # each server asked once, at its path (b's vLLM-dialect page sent the other first)
    assert flushes == {"a": ["/reset_prefix_cache"], "b": ["/flush_cache"], "c": []}
    shown = _explain(gw, on["a"])
    held = shown["policy_state"]["model_tokens"]
    assert held.get("a", 0) == 0 and held.get("b", 0) == 0 and held["c"] > 0, held
    assert all(s["matched_tokens"] == 0 for s in shown["scores"] if s["replica"] in "ab")
    assert _explain(gw, on["c"])["matched_tokens"] > 1000  # c's cache is believed kept


def test_all_flushed_is_a_200(serve: Serve) -> None:
    flushes: list[str] = []
    gw = start_gateway(serve, [("s", serve(_replica(Behaviour("s"), flushes,
                                                    "/flush_cache")).url)])
    wait_until(lambda: _all_scraped(gw, 1), 10, "the replica healthy and scraped")
    r = httpx.post(f"{gw.admin}/flush_cache", headers=AUTH, timeout=10)
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "success" and r.json()["flushed"] == ["s"]
    assert flushes == ["/flush_cache"]


def test_without_the_admin_api_flush_cache_is_refused_saying_how_to_enable_it(
        serve: Serve) -> None:
    flushes: list[str] = []
    replica = serve(_replica(Behaviour("a"), flushes, "/flush_cache"))
    config = parse_config({"replicas": [{"id": "a", "url": replica.url}]})
    gw = serve(create_app(config, build_state(config)))
    for method in ("GET", "POST"):
        r = httpx.request(method, f"{gw.url}/flush_cache")
        assert r.status_code == 403, r.text
        error = r.json()["error"]
        assert error["code"] == "admin_off" and "admin.token" in error["message"], error
    assert flushes == []
    # SGLang's router's check that a worker can generate: /ready's answer here
    wait_until(lambda: httpx.get(f"{gw.url}/health_generate").status_code == 200, 10,
               "/health_generate to answer 200 once the replica is healthy")
