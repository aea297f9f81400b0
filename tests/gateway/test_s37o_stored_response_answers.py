"""What the gateway relays of a replica's answer on a stored response's routes
(``GET /v1/responses/{id}`` and the others): a redirect is neither followed (it could point
anywhere, the tenant header with it) nor relayed, and an answer past ``answer_bound`` is a
502 naming the replica, never held whole."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Route

from gateway.config import parse_config
from gateway.stored_responses import answer_bound
from tests.support.gateway_harness import start_gateway
from tests.support.servers import ThreadServer
from tests.support.waiting import wait_until

Serve = Callable[..., ThreadServer]
BOUND = 64 * 1024  # the gateway's max_body_bytes and buffer_bytes below
TENANT_HEADER = "x-kvgate-tenant"


def _elsewhere(seen: list[dict[str, str]]) -> Starlette:
    """Any other service a redirect may name: records what reaches it."""
    async def hit(request: Request) -> Response:
        seen.append(dict(request.headers))
        return JSONResponse({"id": "resp_1", "secret": "internal only"})
    return Starlette(routes=[Route("/internal-only", hit)])


def _replica(elsewhere: str) -> Starlette:
    async def stored(request: Request) -> Response:
        rid = request.path_params["rid"]
        if rid == "resp_moved":
            return RedirectResponse(f"{elsewhere}/internal-only", status_code=302)
        if rid == "resp_long":  # with a content-length past the bound
            return Response(b"x" * (BOUND + 1), media_type="application/json")
        if rid == "resp_endless":  # chunked, no length: past the bound as it is read

            async def chunks() -> AsyncIterator[bytes]:
                for _ in range(BOUND // 4096 + 2):
                    yield b"y" * 4096
            return StreamingResponse(chunks(), media_type="application/json")
        if rid == "resp_fits":
            return Response(b'{"id": "resp_fits", "pad": "' + b"z" * (BOUND - 64) + b'"}',
                            media_type="application/json")
        return JSONResponse({"error": {"message": "not found"}}, status_code=404)

    async def health(request: Request) -> Response:
        return Response(b"")

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": "m", "object": "model"}]})

    return Starlette(routes=[Route("/v1/responses/{rid}", stored, methods=["GET", "DELETE"]),
                             Route("/health", health), Route("/v1/models", models)])


def _gateway(serve: Serve) -> tuple[str, list[dict[str, str]]]:
    seen: list[dict[str, str]] = []
    elsewhere = serve(_elsewhere(seen))
    replica = serve(_replica(elsewhere.url))
    gw = start_gateway(serve, [("r0", replica.url)], max_body_bytes=BOUND,
                       timeouts={"buffer_bytes": BOUND})
    wait_until(lambda: httpx.get(f"{gw.url}/ready").status_code == 200, 10, "ready")
    return gw.url, seen


def _get(url: str, rid: str, method: str = "GET") -> httpx.Response:
    return httpx.request(method, f"{url}/v1/responses/{rid}",
                         headers={TENANT_HEADER: "acme"}, follow_redirects=False)


def test_a_replicas_redirect_is_neither_followed_nor_relayed(serve: Serve) -> None:
    url, seen = _gateway(serve)
    for method in ("GET", "DELETE"):
        got = _get(url, "resp_moved", method)
        assert got.status_code == 502, got.text
        assert "location" not in got.headers
        error = got.json()["error"]
        assert "'r0' answered 302" in error["message"]
        assert "redirect is not followed" in error["message"]
        assert "internal only" not in got.text
    assert seen == []  # nothing reached the address the replica named


def test_an_answer_past_the_bound_is_a_502_naming_the_replica(serve: Serve) -> None:
    url, _ = _gateway(serve)
    for rid in ("resp_long", "resp_endless"):
        got = _get(url, rid)
        assert got.status_code == 502, (rid, got.text[:200])
        message = got.json()["error"]["message"]
        assert f"replica 'r0' answered more than {BOUND} bytes" in message, message
    fits = _get(url, "resp_fits")  # one within it is relayed as it came
    assert fits.status_code == 200 and fits.json()["id"] == "resp_fits"
    assert _get(url, "resp_none").status_code == 404


def test_the_bound_is_the_larger_of_the_held_answer_and_a_request_body() -> None:
    def bound(**config: Any) -> int:
        return answer_bound(parse_config({"replicas": [], **config}))
    assert bound() == 16 << 20  # max_body_bytes' default, over buffer_bytes'
    assert bound(max_body_bytes=1024, timeouts={"buffer_bytes": 4096}) == 4096
