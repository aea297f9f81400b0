"""A request for a model no list names waits for the next round of listings (one a
second at most, shared by every request waiting): an adapter loaded just after a round
that a request for a misspelt model asked for is found by its first request, not refused
from lists older than it."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from tests.support.fake_replica import Behaviour, fake_replica
from tests.support.gateway_harness import Serve, start_gateway
from tests.support.waiting import wait_until


def _ids(url: str) -> list[str]:
    return [m["id"] for m in httpx.get(f"{url}/v1/models").json()["data"]]


def _counting(app: Any, paths: list[str]) -> Any:
    """``app`` noting each path it is asked for."""
    async def counted(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            paths.append(scope["path"])
        await app(scope, receive, send)
    return counted


def test_an_adapter_loaded_just_after_a_round_of_listings_is_found_by_its_first_request(
        serve: Serve) -> None:
    b = Behaviour("b")
    asked: list[str] = []
    gw = start_gateway(serve, [("b", serve(_counting(fake_replica(b), asked)).url)])
    wait_until(lambda: "sim-model" in _ids(gw.url), 10, "the replica's models")
    typo = httpx.post(f"{gw.url}/v1/completions", json={"model": "sim-modle", "prompt": "x"},
                      timeout=10)
    assert typo.status_code == 404  # it asked for the lists again: a round just ran
    b.adapters = 1  # an adapter loaded on the replica (vLLM's /v1/load_lora_adapter)
    r = httpx.post(f"{gw.url}/v1/completions", json={"model": "sim-model-lora-0",
                                                     "prompt": "x"}, timeout=10)
    assert r.status_code == 200, r.text[:300]  # the next round's lists, not the old ones


def test_requests_for_unknown_models_share_the_rounds_of_listings(serve: Serve) -> None:
    asked: list[str] = []
    gw = start_gateway(serve, [("b", serve(_counting(fake_replica(Behaviour("b")),
                                                     asked)).url)])
    wait_until(lambda: "sim-model" in _ids(gw.url), 10, "the replica's models")
    before = asked.count("/v1/models")

    async def burst() -> list[int]:
        async with httpx.AsyncClient(timeout=10) as client:
            answers = await asyncio.gather(*(
                client.post(f"{gw.url}/v1/completions",
                            json={"model": f"nope-{i}", "prompt": "x"}) for i in range(40)))
        return [a.status_code for a in answers]

    assert asyncio.run(burst()) == [404] * 40
    # one round each request may join, the one running or the next: never one apiece
    assert asked.count("/v1/models") - before <= 2, asked.count("/v1/models") - before
