"""A Responses stream through the gateway: its usage read from its last event however
long that is, and its end told by its last event alone, not by what a response echoes."""

from __future__ import annotations

import json

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.support.fake_replica import Behaviour, fake_replica
from tests.support.gateway_harness import Serve, metric, start_gateway
from tests.support.waiting import wait_until


def test_a_long_streamed_response_counts_its_usage(serve: Serve) -> None:
    # its last event holds the whole response, its text longer than the stream's tail
    replica = Behaviour("r0", pad=4000)
    gw = start_gateway(serve, [("r0", serve(fake_replica(replica)).url)])
    r = httpx.post(f"{gw.url}/v1/responses", json={"model": "sim-model", "input": "x",
                                                   "stream": True})
    assert r.status_code == 200 and len(r.content) > 3 * 4000
    assert r.text.rstrip().endswith('"type": "response.completed"}')
    wait_until(lambda: metric(gw, 'kvgate_prompt_tokens_total{route="round_robin"}') == 10,
               5, "the response's input tokens counted")
    assert metric(gw, 'kvgate_cached_prompt_tokens_total{route="round_robin"}') == 4


def test_a_response_echoing_event_types_in_its_metadata_is_neither_failed_nor_whole(
        serve: Serve) -> None:
    # the response's metadata (echoed in every event's response) names event types
    replica = Behaviour("r0", done=False)  # the stream ends before its last event
    gw = start_gateway(serve, [("r0", serve(fake_replica(replica)).url)])
    metadata = {"type": "error", "kind": "response.completed", "also": "x"}
    body = {"model": "sim-model", "input": "x", "metadata": metadata}
    whole = httpx.post(f"{gw.url}/v1/responses", json=body)  # not streamed
    assert whole.status_code == 200 and whole.json()["metadata"] == metadata
    cut = httpx.post(f"{gw.url}/v1/responses", json={**body, "stream": True})
    # the client is told its stream was cut, and the cut is counted
    assert cut.text.rstrip().endswith('"code":"upstream_broken"}}')
    wait_until(lambda: metric(gw, 'kvgate_upstream_cuts_total{cause="cut_short",replica="r0"}')
               == 1, 5, "the cut counted")
    series = 'kvgate_requests_total{{replica="r0",route="round_robin",status="{}"}}'
    assert metric(gw, series.format(502)) == 1  # the cut stream alone failed
    assert metric(gw, series.format(200)) == 1


def _openai_ordered(cut_at: int | None) -> Starlette:
    """A replica writing OpenAI's order (each event's type first, no event lines), its
    last event, the whole response, cut ``cut_at`` bytes in (None: whole)."""
    response = {"id": "resp_1", "object": "response", "status": "completed",
                "output": [{"type": "message", "role": "assistant", "content": [
                    {"type": "output_text", "text": "y" * 3000}]}],
                "usage": {"input_tokens": 10, "output_tokens": 3}}

    async def respond(request: Request) -> Response:
        async def events():  # type: ignore[no-untyped-def]
            yield b'data: {"type":"response.created","sequence_number":0,"response":' \
                + json.dumps({**response, "output": [], "usage": None}).encode() + b"}\n\n"
            last = b'data: {"type":"response.completed","sequence_number":1,"response":' \
                + json.dumps(response).encode() + b"}\n\n"
            yield last[:cut_at]

        return StreamingResponse(events(), media_type="text/event-stream")

    async def health(request: Request) -> Response:
        return PlainTextResponse("ok")

    return Starlette(routes=[Route("/v1/responses", respond, methods=["POST"]),
                             Route("/health", health)])


def test_a_stream_cut_inside_its_last_event_was_cut(serve: Serve) -> None:
    gw = start_gateway(serve, [("whole", serve(_openai_ordered(None)).url),
                               ("cut", serve(_openai_ordered(200)).url)])
    bodies = {}
    for _ in range(2):  # round robin: one each
        r = httpx.post(f"{gw.url}/v1/responses", json={"model": "sim-model", "input": "x",
                                                       "stream": True})
        assert r.status_code == 200, r.text
        bodies[r.headers["x-kvgate-replica"]] = r.text
    assert bodies["whole"].endswith('"output_tokens": 3}}}\n\n')
    # the last event's type came, not the rest of it: the client is told of the cut
    assert bodies["cut"].rstrip().endswith('"code":"upstream_broken"}}')
    wait_until(lambda: metric(gw, 'kvgate_upstream_cuts_total{cause="cut_short",replica="cut"}')
               == 1, 5, "the cut counted")
