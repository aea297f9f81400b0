"""A replica of several data-parallel ranks added and removed through the admin API: its
ranks join together, and a removal while they join takes them all."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from tests.support.gateway_harness import AUTH, Gateway, Serve, start_gateway
from tests.support.waiting import wait_until

# the periodic health round out of the way: the probes a server sees are the joins' own
_JOIN_CHECKS_ONLY = {"interval_s": 60.0, "timeout_s": 5.0}


def _dp_server(health: Callable[[], Awaitable[int]]) -> Starlette:
    """A data-parallel server whose /health answers ``health()``'s status."""
    async def healthz(request: Request) -> Response:
        return PlainTextResponse("ok", status_code=await health())

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": "m", "object": "model"}]})

    return Starlette(routes=[Route("/health", healthz), Route("/v1/models", models)])


def _ids(gw: Gateway) -> list[str]:
    listed = httpx.get(f"{gw.admin}/admin/replicas", headers=AUTH).json()["replicas"]
    return sorted(r["id"] for r in listed)


def test_removing_a_replica_while_its_ranks_join_removes_them_all(serve: Serve) -> None:
    probes: list[int] = []
    released = threading.Event()

    async def held() -> int:  # each rank's first check waits until the test lets it go
        probes.append(1)
        await asyncio.to_thread(released.wait, 10)
        return 200

    front = serve(_dp_server(held))
    gw = start_gateway(serve, [], health=_JOIN_CHECKS_ONLY)
    answers: list[httpx.Response] = []
    adding = threading.Thread(target=lambda: answers.append(httpx.post(
        f"{gw.admin}/admin/replicas", headers=AUTH, timeout=20,
        json={"id": "dp", "url": front.url, "data_parallel_size": 3})))
    adding.start()
    try:
        wait_until(lambda: len(probes) >= 1, 10, "a rank's first health check")
        removed = httpx.delete(f"{gw.admin}/admin/replicas/dp", headers=AUTH)
    finally:
        released.set()
        adding.join(20)
    assert removed.json() == {"removed": "dp", "ranks": ["dp.dp0", "dp.dp1", "dp.dp2"]}
    assert _ids(gw) == []  # no rank joined after the replica was removed
    (added,) = answers
    assert added.status_code == 404, added.text  # not answered as added, nor a 500
    assert "'dp'" in added.json()["error"]["message"]


def test_the_ranks_of_an_added_replica_are_checked_by_one_probe(serve: Serve) -> None:
    probes: list[int] = []

    async def counted() -> int:
        probes.append(1)
        return 200

    front = serve(_dp_server(counted))
    gw = start_gateway(serve, [], health=_JOIN_CHECKS_ONLY)
    added = httpx.post(f"{gw.admin}/admin/replicas", headers=AUTH, timeout=30,
                       json={"id": "dp", "url": front.url, "data_parallel_size": 3})
    assert added.status_code == 201, added.text
    # one API process answers for its ranks: a rank a probe (three ranks' timeouts, one
    # after another, for a server that does not answer)
    assert [r["healthy"] for r in added.json()["ranks"]] == [True, True, True]
    assert len(probes) == 1


def test_a_replica_of_ranks_may_not_take_the_id_of_a_replica_of_one(serve: Serve) -> None:
    async def ok() -> int:
        return 200

    front = serve(_dp_server(ok))
    gw = start_gateway(serve, [("a", front.url)], health=_JOIN_CHECKS_ONLY)
    taken = httpx.post(f"{gw.admin}/admin/replicas", headers=AUTH,
                       json={"id": "a", "url": front.url, "data_parallel_size": 2})
    assert taken.status_code == 400, taken.text
    assert taken.json()["error"]["code"] == "duplicate_replica"
    assert "'a'" in taken.json()["error"]["message"]
    assert _ids(gw) == ["a"]  # DELETE /admin/replicas/a names one replica still
