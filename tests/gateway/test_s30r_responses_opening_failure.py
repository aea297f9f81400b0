"""A Responses stream that opens with its failure (an ``error`` or ``response.failed``
event, under a 200) has sent the client nothing yet: a server's failure is tried on the
next replica, as a chat stream opening with an error is; the request's own fault is
relayed as it came."""

from __future__ import annotations

import json

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Mount, Route

from tests.support.fake_replica import Behaviour, fake_replica
from tests.support.gateway_harness import Serve, metric, start_gateway, wait_for_metric


def _event(kind: str, data: dict[str, object]) -> bytes:
    return f"event: {kind}\ndata: {json.dumps({**data, 'type': kind})}\n\n".encode()


def _error(code: str) -> bytes:  # OpenAI's error event
    return _event("error", {"code": code, "message": "the engine failed", "param": None,
                            "sequence_number": 0})


def _failed(code: str) -> bytes:  # a failed response, as its first event
    return _event("response.failed", {"sequence_number": 0, "response": {
        "id": "resp_bad", "object": "response", "status": "failed", "output": [],
        "error": {"code": code, "message": "the engine failed"}}})


def _opens_with(first: bytes, served: list[int]) -> Starlette:
    """A replica whose every Responses stream is ``first`` alone (a 200); its other
    endpoints a fake replica's."""

    async def respond(request: Request) -> Response:
        await request.body()
        served.append(1)

        async def events():  # type: ignore[no-untyped-def]
            yield first

        return StreamingResponse(events(), media_type="text/event-stream")

    return Starlette(routes=[Route("/v1/responses", respond, methods=["POST"]),
                             Mount("/", fake_replica(Behaviour("bad")))])


def _stream(url: str) -> httpx.Response:
    return httpx.post(f"{url}/v1/responses", timeout=10,
                      json={"model": "sim-model", "input": "hi", "stream": True})


# vLLM's error event under a 200, as its chat streams send it
_VLLM_ERROR = b'data: {"error": {"message": "the engine failed", "type": "x", "code": 500}}\n\n'


@pytest.mark.parametrize("first", [_error("server_error"), _failed("server_error"),
                                   _error("vector_store_timeout"), _VLLM_ERROR])
def test_a_responses_stream_opening_with_a_server_failure_is_tried_elsewhere(
        serve: Serve, first: bytes) -> None:
    served: list[int] = []
    good = Behaviour("good")
    gw = start_gateway(serve, [("bad", serve(_opens_with(first, served)).url),
                               ("good", serve(fake_replica(good)).url)])
    for _ in range(2):  # round robin: one of them goes to the failing replica first
        r = _stream(gw.url)
        assert r.status_code == 200 and r.headers["x-kvgate-replica"] == "good"
        assert "response.completed" in r.text and "the engine failed" not in r.text
    assert served and good.responded == 2
    assert metric(gw, 'kvgate_retries_total{cause="5xx",replica="bad"}') == len(served)


def test_a_responses_stream_opening_with_the_requests_own_fault_is_relayed(
        serve: Serve) -> None:
    served: list[int] = []
    first = _error("invalid_prompt")
    good = Behaviour("good")
    gw = start_gateway(serve, [("bad", serve(_opens_with(first, served)).url),
                               ("good", serve(fake_replica(good)).url)])
    answers = [_stream(gw.url) for _ in range(2)]
    bad = [r for r in answers if r.headers["x-kvgate-replica"] == "bad"]
    assert len(bad) == 1 and bad[0].status_code == 200 and bad[0].content == first
    assert served == [1] and good.responded == 1
    # counted as the client's fault it is, as the access log tells it, not the replica's
    series = 'kvgate_requests_total{{replica="bad",route="round_robin",status="{}"}}'
    wait_for_metric(gw, series.format(400), 1)
    assert not metric(gw, series.format(502))
