"""A replica whose /metrics page is in no dialect the gateway reads (a server of another
kind) shows no progress in its scrapes: its answers are waited for as an unscraped
replica's are, not given up after ``stall_s`` as a hung one's."""

from __future__ import annotations

import asyncio

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from tests.support.gateway_harness import AUTH, Gateway, Serve, start_gateway
from tests.support.waiting import wait_until

ANSWER_S = 1.0  # a whole (non-streamed) answer's time: longer than the gateway's stall_s


def other_server(answered: list[int]) -> Starlette:
    """An OpenAI-style server whose /metrics are its own (TGI's names)."""

    async def complete(request: Request) -> Response:
        await request.body()
        await asyncio.sleep(ANSWER_S)  # generating its whole answer
        answered.append(1)
        return JSONResponse({"id": "c", "object": "text_completion", "model": "m",
                             "choices": [{"index": 0, "text": "done",
                                          "finish_reason": "length"}],
                             "usage": {"prompt_tokens": 3, "completion_tokens": 1,
                                       "total_tokens": 4}})

    async def metrics(request: Request) -> Response:
        return PlainTextResponse("# TYPE tgi_queue_size gauge\ntgi_queue_size 0.0\n")

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": "m", "object": "model"}]})

    async def health(request: Request) -> Response:
        return Response(b"")

    return Starlette(routes=[Route("/v1/completions", complete, methods=["POST"]),
                             Route("/metrics", metrics), Route("/v1/models", models),
                             Route("/health", health)])


def _dialect(gw: Gateway) -> str | None:
    rows = httpx.get(f"{gw.admin}/admin/replicas", headers=AUTH).json()["replicas"]
    return rows[0].get("dialect") if rows else None


def test_a_slow_whole_answer_from_a_replica_of_unknown_metrics_is_waited_for(
        serve: Serve) -> None:
    answered: list[int] = []
    gw = start_gateway(serve, [("other", serve(other_server(answered)).url)],
                       timeouts={"stall_s": 0.3})
    wait_until(lambda: _dialect(gw) == "unknown", 10, "a scrape of the other server")
    r = httpx.post(f"{gw.url}/v1/completions", timeout=20,
                   json={"model": "m", "prompt": "x", "max_tokens": 1})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == "done"
    assert answered == [1]
