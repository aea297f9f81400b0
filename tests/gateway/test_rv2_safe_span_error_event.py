"""A stream that the replica ends with an error event (a 200 whose answer failed) marks
the request's spans as failed, as a 5xx answer does: the spans said the failure's status
and no error."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from gateway.app import create_app
from gateway.config import parse_config
from gateway.otel_tracing import OtelTracing
from gateway.state import build_state
from tests.support.gateway_harness import Serve
from tests.support.waiting import wait_until

CHUNK = (b'data: {"id":"x","object":"text_completion","model":"sim-model",'
         b'"choices":[{"index":0,"text":"t","finish_reason":null}]}\n\n')


def _failing_replica(code: int) -> Starlette:
    """Streams one chunk, then an error event with ``code``, then ``[DONE]``."""

    async def complete(request: Request) -> Response:
        await request.body()

        async def events() -> AsyncIterator[bytes]:
            yield CHUNK
            yield (b'data: {"error":{"message":"engine failed","type":"InternalServerError",'
                   b'"param":null,"code":%d}}\n\n' % code)
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    async def health(request: Request) -> Response:
        return JSONResponse({})

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": "sim-model"}]})

    return Starlette(routes=[Route("/v1/completions", complete, methods=["POST"]),
                             Route("/health", health), Route("/v1/models", models)])


def _spans_of_a_stream(serve: Serve, code: int) -> dict[str, ReadableSpan]:
    replica = serve(_failing_replica(code))
    config = parse_config({"replicas": [{"id": "a", "url": replica.url}],
                           "policy": {"name": "round_robin"},
                           "health": {"interval_s": 0.2, "timeout_s": 0.5},
                           "tracing": {"enabled": True}})
    exporter = InMemorySpanExporter()
    tracing = OtelTracing(config.tracing, SimpleSpanProcessor(exporter))
    url = serve(create_app(config, build_state(config, tracing=tracing))).url
    with httpx.stream("POST", f"{url}/v1/completions", json={
            "model": "sim-model", "prompt": "x", "stream": True}) as r:
        assert r.status_code == 200
        body = b"".join(r.iter_bytes())
    assert b"engine failed" in body
    wait_until(lambda: len(exporter.get_finished_spans()) >= 4, 10, "4 finished spans")
    return {s.name: s for s in exporter.get_finished_spans()}


def test_a_stream_ended_by_a_server_error_event_marks_its_spans_failed(serve: Serve) -> None:
    spans = _spans_of_a_stream(serve, 500)
    for name in ("kvgate.request", "kvgate.upstream"):
        span = spans[name]
        assert span.attributes is not None
        assert span.attributes["http.response.status_code"] == 500, name
        assert span.status.status_code == StatusCode.ERROR, name


def test_a_stream_ended_by_a_client_error_event_is_no_server_error(serve: Serve) -> None:
    spans = _spans_of_a_stream(serve, 400)
    request = spans["kvgate.request"]
    assert request.attributes is not None
    assert request.attributes["http.response.status_code"] == 400
    assert request.status.status_code == StatusCode.UNSET
