"""A stream that opens (200) with an error event, or a Responses stream with its failure,
is tried on the next replica, but the replica that sent it took the prompt (it failed on
it): the policy keeps that try, unlike one refused before the replica took the prompt."""

from __future__ import annotations

import json
import random

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Mount, Route

from tests.support.fake_replica import Behaviour, fake_replica
from tests.support.gateway_harness import AUTH, Serve, metric, start_gateway

_ERROR = b'data: {"error": {"message": "the engine failed", "type": "InternalServerError", ' \
    b'"param": null, "code": 500}}\n\ndata: [DONE]\n\n'
_FAILED = b"event: response.failed\ndata: " + json.dumps({
    "type": "response.failed", "sequence_number": 0, "response": {
        "id": "resp_bad", "object": "response", "status": "failed", "output": [],
        "error": {"code": "server_error", "message": "the engine failed"}}}).encode() + b"\n\n"


def _failing(served: list[int]) -> Starlette:
    """A replica whose every stream opens with its failure; its other endpoints a fake
    replica's."""

    async def respond(request: Request) -> Response:
        await request.body()
        served.append(1)
        first = _FAILED if request.url.path == "/v1/responses" else _ERROR

        async def events():  # type: ignore[no-untyped-def]
            yield first

        return StreamingResponse(events(), media_type="text/event-stream")

    return Starlette(routes=[Route("/v1/responses", respond, methods=["POST"]),
                             Route("/v1/completions", respond, methods=["POST"]),
                             Mount("/", fake_replica(Behaviour("bad")))])


def _prompt(seed: int) -> str:
    rng = random.Random(seed)
    return " ".join(f"w{rng.randrange(100_000)}" for _ in range(800))  # some 1.5k tokens


@pytest.mark.parametrize("endpoint", ["completions", "responses"])
def test_a_replica_that_failed_in_its_stream_keeps_the_prompt(serve: Serve,
                                                              endpoint: str) -> None:
    served: list[int] = []
    good = Behaviour("good")
    gw = start_gateway(serve, [("bad", serve(_failing(served)).url),
                               ("good", serve(fake_replica(good)).url)],
                       policy={"name": "cost"})
    # the policy ranks by the prompt's hashes: a few prompts until one is tried on "bad"
    for seed in range(24):
        text = _prompt(seed)
        body = {"model": "sim-model", "stream": True,
                **({"prompt": text} if endpoint == "completions" else {"input": text})}
        r = httpx.post(f"{gw.url}/v1/{endpoint}", json=body, timeout=10)
        assert r.status_code == 200 and r.headers["x-kvgate-replica"] == "good", r.text
        if served:
            break
    assert len(served) == 1, "no prompt was tried on the failing replica first"
    assert metric(gw, 'kvgate_retries_total{cause="5xx",replica="bad"}') == 1
    shown = httpx.post(f"{gw.admin}/admin/explain", headers=AUTH, timeout=10,
                       json={"model": "sim-model", "prompt": text}).json()
    held = shown["policy_state"]["model_tokens"]
    assert held.get("bad", 0) > 1000, held  # the bug: taken back, as if never sent
    assert held["good"] > 1000, held
