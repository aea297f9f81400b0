"""OpenTelemetry spans of proxied requests, read from the SDK's in-memory exporter of a real
gateway served on loopback in front of real replicas."""

from __future__ import annotations

import gzip
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.app import create_app
from gateway.config import parse_config
from gateway.otel_tracing import OtelTracing
from gateway.state import build_state
from gateway.tracing import NO_TRACE, NO_TRACING, TracingConfig, build_tracing
from kvwire.openai_schema import Unauthorized
from policies.config import ConfigError
from tests.support.fake_replica import Behaviour, fake_replica
from tests.support.observe_replicas import unlisted_replica
from tests.support.processes import Processes
from tests.support.servers import ThreadServer, free_port
from tests.support.waiting import wait_until

Serve = Callable[..., ThreadServer]
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"


def traced_gateway(serve: Serve, replicas: list[tuple[str, str]], policy: str = "round_robin",
                   **tracing: Any) -> tuple[str, InMemorySpanExporter]:
    config = parse_config({
        "replicas": [{"id": rid, "url": url} for rid, url in replicas],
        "policy": {"name": policy},
        "health": {"interval_s": 0.2, "timeout_s": 0.5},
        "tracing": {"enabled": True, "service_name": "kvgate-test", **tracing},
    })
    exporter = InMemorySpanExporter()
    tracing = OtelTracing(config.tracing, SimpleSpanProcessor(exporter))
    server = serve(create_app(config, build_state(config, tracing=tracing)))
    return server.url, exporter


def finished(exporter: InMemorySpanExporter, count: int) -> dict[str, ReadableSpan]:
    wait_until(lambda: len(exporter.get_finished_spans()) >= count, 10,
               f"{count} finished spans")
    spans = exporter.get_finished_spans()
    assert len(spans) == count, [s.name for s in spans]
    return {s.name: s for s in spans}


def test_a_proxied_request_is_one_trace_continued_upstream(serve: Serve) -> None:
    a = Behaviour("a")
    url, exporter = traced_gateway(serve, [("a", serve(fake_replica(a)).url)])
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model="sim-model", messages=[{"role": "user", "content": "hello there"}],
        extra_headers={"traceparent": f"00-{TRACE_ID}-{CLIENT_SPAN}-01",
                       "x-request-id": "req-42"})
    assert raw.headers["x-kvgate-replica"] == "a"

    spans = finished(exporter, 4)
    request = spans["kvgate.request"]
    assert request.kind == SpanKind.SERVER
    assert request.resource.attributes["service.name"] == "kvgate-test"
    # the client's trace goes on: same trace id, the client's span as parent
    assert request.context is not None and request.parent is not None
    assert format(request.context.trace_id, "032x") == TRACE_ID
    assert format(request.parent.span_id, "016x") == CLIENT_SPAN
    for name in ("kvgate.tokenize", "kvgate.route", "kvgate.upstream"):
        child = spans[name]
        assert child.parent is not None and child.parent.span_id == request.context.span_id
        assert child.context is not None and child.context.trace_id == request.context.trace_id
    tokenize, route, upstream = (spans["kvgate.tokenize"], spans["kvgate.route"],
                                 spans["kvgate.upstream"])
    assert tokenize.end_time is not None and route.start_time is not None
    assert tokenize.end_time <= route.start_time
    assert tokenize.attributes is not None and route.attributes is not None
    assert tokenize.attributes["gen_ai.request.model"] == "sim-model"
    assert int(tokenize.attributes["kvgate.prompt_tokens"]) > 0  # type: ignore[arg-type]
    assert route.attributes["kvgate.route.reason"] == "round_robin"
    assert tuple(route.attributes["kvgate.route.ranked"]) == ("a",)  # type: ignore[arg-type]
    assert upstream.kind == SpanKind.CLIENT and upstream.attributes is not None
    assert upstream.attributes["kvgate.replica"] == "a"
    assert upstream.attributes["http.response.status_code"] == 200
    assert upstream.attributes["kvgate.request_id"] == "req-42"
    assert upstream.attributes["gen_ai.usage.input_tokens"] == 10
    assert request.attributes is not None
    assert request.attributes["kvgate.replica"] == "a"
    assert request.attributes["kvgate.route.reason"] == "round_robin"
    assert request.attributes["gen_ai.request.model"] == "sim-model"
    assert request.status.status_code == StatusCode.UNSET

    # the replica saw the upstream span as its parent, in the same trace
    assert upstream.context is not None
    sent = a.headers[-1]["traceparent"]
    assert sent == f"00-{TRACE_ID}-{format(upstream.context.span_id, '016x')}-01"


def test_a_stream_is_traced_to_its_end_and_a_new_trace_starts_without_traceparent(
        serve: Serve) -> None:
    a = Behaviour("a", chunks=4)
    url, exporter = traced_gateway(serve, [("a", serve(fake_replica(a)).url)])
    with httpx.stream("POST", f"{url}/v1/completions", json={
            "model": "sim-model", "prompt": "tell me", "stream": True}) as r:
        assert r.status_code == 200
        body = b"".join(r.iter_bytes())
    assert body.endswith(b"data: [DONE]\n\n")
    spans = finished(exporter, 4)
    request, upstream = spans["kvgate.request"], spans["kvgate.upstream"]
    assert request.parent is None  # a trace of its own
    assert upstream.end_time is not None and request.end_time is not None
    assert upstream.end_time <= request.end_time
    assert a.headers[-1]["traceparent"].split("-")[1] == format(
        request.context.trace_id, "032x")  # type: ignore[union-attr]


def test_tracestate_follows_the_trace_it_belongs_to(serve: Serve) -> None:
    a = Behaviour("a")
    url, exporter = traced_gateway(serve, [("a", serve(fake_replica(a)).url)])
    body = {"model": "sim-model", "prompt": "x"}
    httpx.post(f"{url}/v1/completions", json=body, headers={
        "traceparent": f"00-{TRACE_ID}-{CLIENT_SPAN}-01", "tracestate": "vendor=1"})
    assert a.headers[-1]["tracestate"] == "vendor=1"
    assert a.headers[-1]["traceparent"].split("-")[1] == TRACE_ID
    # a broken traceparent starts a new trace, and the state of the old one is dropped
    httpx.post(f"{url}/v1/completions", json=body, headers={
        "traceparent": "00-not-a-trace-01", "tracestate": "vendor=1"})
    assert "tracestate" not in a.headers[-1]
    assert a.headers[-1]["traceparent"].split("-")[1] != TRACE_ID
    assert len(a.headers[-1]["traceparent"]) == 55
    finished(exporter, 8)


def test_unsampled_traces_still_propagate_and_a_sampled_caller_wins(serve: Serve) -> None:
    a = Behaviour("a")
    url, exporter = traced_gateway(serve, [("a", serve(fake_replica(a)).url)],
                                   sample_ratio=0.0)
    body = {"model": "sim-model", "prompt": "x"}
    assert httpx.post(f"{url}/v1/completions", json=body).status_code == 200
    flags = int(a.headers[-1]["traceparent"].rsplit("-", 1)[1], 16)
    assert flags & 1 == 0  # the replica is told: not sampled
    httpx.post(f"{url}/v1/completions", json=body,
               headers={"traceparent": f"00-{TRACE_ID}-{CLIENT_SPAN}-01"})
    spans = finished(exporter, 4)  # only the caller's sampled trace was recorded
    assert {format(s.context.trace_id, "032x") for s in spans.values()  # type: ignore[union-attr]
            } == {TRACE_ID}


def test_a_client_without_a_valid_key_cannot_force_or_join_a_trace(serve: Serve) -> None:
    """A caller's sampled ``traceparent`` is followed only once its key is checked: a
    request refused for its key is sampled as a new trace, at ``sample_ratio``."""
    key = "sk-observe-" + "k" * 32
    a = Behaviour("a")
    config = parse_config({
        "replicas": [{"id": "a", "url": serve(fake_replica(a)).url}],
        "policy": {"name": "round_robin"},
        "auth": {"api_keys": [{"key": key, "tenant": "acme"}]},
        "tracing": {"enabled": True, "sample_ratio": 0.0}})
    exporter = InMemorySpanExporter()
    tracing = OtelTracing(config.tracing, SimpleSpanProcessor(exporter))
    url = serve(create_app(config, build_state(config, tracing=tracing))).url
    body = {"model": "sim-model", "prompt": "x"}
    sampled = {"traceparent": f"00-{TRACE_ID}-{CLIENT_SPAN}-01"}
    for path in ("/v1/completions", "/v1/embeddings"):
        for auth in ({}, {"authorization": "Bearer wrong"}):
            r = httpx.post(f"{url}{path}", json=body, headers={**sampled, **auth})
            assert r.status_code == 401
    r = httpx.post(f"{url}/v1/completions", json=body,
                   headers={**sampled, "authorization": f"Bearer {key}"})
    assert r.status_code == 200
    spans = finished(exporter, 4)  # only the keyed caller's trace
    assert {format(s.context.trace_id, "032x") for s in spans.values()  # type: ignore[union-attr]
            } == {TRACE_ID}

    # sampled as new traces, a refused request's span is a root of its own
    tracing = OtelTracing(TracingConfig(enabled=True), SimpleSpanProcessor(exporter))
    tracing.open()
    trace = tracing.start(sampled, "/v1/completions")
    trace.failed(Unauthorized("the API key is not valid", code="invalid_api_key"))
    (refused,) = [s for s in exporter.get_finished_spans()
                  if s.attributes is not None
                  and s.attributes.get("http.response.status_code") == 401]
    assert refused.parent is None and refused.context is not None
    assert format(refused.context.trace_id, "032x") != TRACE_ID


def test_a_long_model_name_is_cut_in_the_spans(serve: Serve) -> None:
    """A replica that lists no models: any model name is forwarded, and the client's
    2 MB name went whole into two span attributes, and to the collector."""
    replica = serve(unlisted_replica())
    url, exporter = traced_gateway(serve, [("r0", replica.url)])
    r = httpx.post(f"{url}/v1/completions", json={"model": "m" * 2_000_000, "prompt": "x"},
                   timeout=30)
    assert r.status_code == 200
    spans = finished(exporter, 4)
    for name in ("kvgate.request", "kvgate.tokenize"):
        attributes = spans[name].attributes
        assert attributes is not None
        assert attributes["gen_ai.request.model"] == "m" * 256, name


def test_the_console_exporter_prints_spans_when_it_stops(
        capsys: pytest.CaptureFixture[str]) -> None:
    tracing = build_tracing(TracingConfig(enabled=True, exporter="console",
                                          service_name="kvgate-console"))
    tracing.open()
    trace = tracing.start({}, "/v1/completions")
    with pytest.raises(RuntimeError), trace.guard():
        raise RuntimeError("boom")
    tracing.close()
    out = capsys.readouterr().out
    assert '"name": "kvgate.request"' in out and "kvgate-console" in out and "boom" in out


def test_failures_mark_the_spans(serve: Serve) -> None:
    broken = Behaviour("broken", status=500)
    url, exporter = traced_gateway(serve, [("broken", serve(fake_replica(broken)).url)])
    r = httpx.post(f"{url}/v1/completions", json={"model": "sim-model", "prompt": "x"})
    assert r.status_code == 500  # the replica's own
    spans = finished(exporter, 4)
    for name in ("kvgate.request", "kvgate.upstream"):
        span = spans[name]
        assert span.status.status_code == StatusCode.ERROR, name
        assert span.attributes is not None
        assert span.attributes["http.response.status_code"] == 500
    exporter.clear()
    # a client error is no server error: the span says what, without an error status
    r = httpx.post(f"{url}/v1/completions", content=b"{not json")
    assert r.status_code == 400
    (request,) = finished(exporter, 1).values()
    assert request.status.status_code == StatusCode.UNSET
    assert request.attributes is not None and request.attributes["error.type"] == "bad_request"


def test_passthrough_requests_are_traced_too(serve: Serve) -> None:
    a = Behaviour("a")
    url, exporter = traced_gateway(serve, [("a", serve(fake_replica(a)).url)])
    r = httpx.post(f"{url}/v1/embeddings", json={"model": "sim-model", "input": "x"})
    assert r.status_code == 404  # the fake replica serves no embeddings: its 404, relayed
    spans = finished(exporter, 2)
    assert set(spans) == {"kvgate.request", "kvgate.upstream"}
    assert spans["kvgate.upstream"].attributes["kvgate.replica"] == "a"  # type: ignore[index]


def test_tracing_off_is_one_shared_no_op_and_never_imports_opentelemetry() -> None:
    assert build_tracing(TracingConfig()) is NO_TRACING
    assert NO_TRACING.start({}, "/v1/completions") is NO_TRACE
    code = ("import sys\n"
            "from gateway.app import create_app\n"
            "from gateway.config import parse_config\n"
            "from gateway.state import build_state\n"
            "config = parse_config({'replicas': [{'id': 'a', 'url': 'http://127.0.0.1:9'}],"
            " 'policy': {'name': 'round_robin'}})\n"
            "create_app(config, build_state(config))\n"
            "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(("tracing", "named"), [
    ({"exporter": "jaeger"}, "tracing.exporter"),
    ({"sample_ratio": 1.5}, "sample_ratio"),
    ({"endpoint": "collector:4318"}, "endpoint"),
    ({"enabled": True, "service_name": ""}, "service_name"),
    ({"enabeld": True}, "enabeld"),
])
def test_bad_tracing_config_is_named(tracing: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        parse_config({"replicas": [], "tracing": tracing})


def test_a_gateway_process_exports_over_otlp_and_flushes_on_shutdown(
        serve: Serve, spawn: Processes, tmp_path: Path) -> None:
    """``kvgate serve`` with ``exporter: otlp`` posts its spans to a collector (here a
    loopback server decoding OTLP/HTTP protobuf), the last of them when it stops."""
    received: list[ExportTraceServiceRequest] = []

    async def collect(request: Request) -> Response:
        body = await request.body()
        if request.headers.get("content-encoding") == "gzip":
            body = gzip.decompress(body)
        received.append(ExportTraceServiceRequest.FromString(body))
        return Response(ExportTraceServiceResponse().SerializeToString(),
                        media_type="application/x-protobuf")

    collector = serve(Starlette(routes=[Route("/v1/traces", collect, methods=["POST"])]))
    replica = serve(fake_replica(Behaviour("a")))
    port = free_port()
    config = tmp_path / "gateway.yaml"
    config.write_text(yaml.safe_dump({
        "port": port, "policy": {"name": "round_robin"},
        "replicas": [{"id": "a", "url": replica.url}],
        "shutdown": {"grace_s": 0, "timeout_s": 5},
        "tracing": {"enabled": True, "service_name": "kvgate-otlp", "exporter": "otlp",
                    "endpoint": f"{collector.url}/v1/traces"},
    }))
    url = f"http://127.0.0.1:{port}"
    proc = spawn("serve", "--config", str(config), ready_url=f"{url}/ready")
    r = httpx.post(f"{url}/v1/completions", json={"model": "sim-model", "prompt": "hi"},
                   headers={"traceparent": f"00-{TRACE_ID}-{CLIENT_SPAN}-01"})
    assert r.status_code == 200
    proc.terminate()  # the batch is not due yet: shutting down sends it
    assert proc.wait(timeout=20) in (0, -signal.SIGTERM)  # uvicorn re-raises the signal

    spans = {}
    for export in received:
        for resource_spans in export.resource_spans:
            service = {a.key: a.value.string_value
                       for a in resource_spans.resource.attributes}["service.name"]
            assert service == "kvgate-otlp"
            for scope_spans in resource_spans.scope_spans:
                spans.update({s.name: s for s in scope_spans.spans})
    assert set(spans) == {"kvgate.request", "kvgate.tokenize", "kvgate.route",
                          "kvgate.upstream"}
    request = spans["kvgate.request"]
    assert request.trace_id.hex() == TRACE_ID and request.parent_span_id.hex() == CLIENT_SPAN
    assert all(spans[name].parent_span_id == request.span_id
               for name in ("kvgate.tokenize", "kvgate.route", "kvgate.upstream"))
