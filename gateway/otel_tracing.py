"""Request traces made with OpenTelemetry's SDK (the ``otel`` extra); see
``gateway.tracing`` for the spans and their configuration.

The gateway keeps a tracer provider of its own (never the process-global one), so two
gateways in one process, or a host application's own tracing, do not collide. The
exporter's thread starts in the app's lifespan (``open``) and is flushed and stopped on
shutdown (``close``).

At most ``max_waiting_spans`` ended spans wait for the exporter (OpenTelemetry's
``OTEL_BSP_MAX_QUEUE_SIZE``, 2048 unset). A span that ends while that many wait (the
collector is slow or down), one that ends after ``close``, and the spans of an export
that failed are lost: counted in ``dropped_spans`` (by cause; ``collect`` serves them as
``kvgate_tracing_spans_dropped_total``), and a warning on ``kvgate.gateway`` says how many
after the exporter's next try.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING

from opentelemetry.context import Context
from opentelemetry.sdk.environment_variables import OTEL_BSP_MAX_QUEUE_SIZE
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer, set_span_in_context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from prometheus_client.core import CounterMetricFamily, Metric

from gateway.tracing import RequestTrace, TracingConfig
from kvwire.openai_schema import OpenAIError

if TYPE_CHECKING:
    from gateway.proxy import UpstreamStream
    from policies.base import Decision, RouteRequest

_PROPAGATOR = TraceContextTextMapPropagator()  # W3C traceparent / tracestate
_RANKED_SHOWN = 8  # replica ids a route span lists
# a span attribute's text is cut here: a model name comes from the client, unchecked while
# no replica lists its models (the gateway keeps a listed model's id to 256 characters)
_ATTRIBUTE_CHARS = 256
MAX_WAITING_SPANS = 2048  # OpenTelemetry's default queue of a batch span processor
_BATCH_SPANS = 512  # OpenTelemetry's default export batch
DROP_CAUSES = ("queue_full", "export_failed", "closed")
log = logging.getLogger("kvgate.gateway")


def _exporter(config: TracingConfig) -> SpanExporter:
    if config.exporter == "console":
        return ConsoleSpanExporter(service_name=config.service_name, out=sys.stdout)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter(endpoint=config.endpoint)


def _max_waiting_spans() -> int:
    text = os.environ.get(OTEL_BSP_MAX_QUEUE_SIZE)
    if text is None:
        return MAX_WAITING_SPANS
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"{OTEL_BSP_MAX_QUEUE_SIZE}={text!r} is not a positive integer")
    return value


class _CountedBatch(SpanProcessor):
    """A batch span processor over ``exporter`` that counts what it loses (``dropped``, by
    cause). The batch processor's own queue drops a span without a count when it is full:
    here a span waits only while fewer than ``max_waiting`` do (a span waits from its end
    until an export takes it), so that queue, as long, never fills."""

    def __init__(self, exporter: SpanExporter, max_waiting: int) -> None:
        self.dropped = dict.fromkeys(DROP_CAUSES, 0)
        self._max_waiting = max_waiting
        self._waiting = 0
        self._untold = 0  # spans dropped since the last warning
        self._closed = False
        self._lock = threading.Lock()
        self._batch = BatchSpanProcessor(  # a batch is 512 spans (OTEL_BSP_*), or fewer
            _Taking(exporter, self), max_queue_size=max_waiting,
            max_export_batch_size=max_waiting if max_waiting < _BATCH_SPANS else None)

    def on_end(self, span: ReadableSpan) -> None:
        if not (span.context and span.context.trace_flags.sampled):
            return  # the batch processor exports none of those
        with self._lock:
            cause = "closed" if self._closed else (
                "queue_full" if self._waiting >= self._max_waiting else None)
            if cause is not None:
                self.dropped[cause] += 1
                self._untold += 1
                return
            self._waiting += 1
            self._batch.on_end(span)  # under the lock: never after ``shutdown`` began

    def exporting(self, count: int) -> None:
        """An export takes ``count`` waiting spans (on the exporter's thread)."""
        with self._lock:
            self._waiting -= count

    def exported(self, count: int, ok: bool) -> None:
        """An export of ``count`` spans ended; a warning tells the spans lost since the
        last one (on the exporter's thread)."""
        with self._lock:
            if not ok:
                self.dropped["export_failed"] += count
                self._untold += count
            untold, self._untold = self._untold, 0
        if untold:
            log.warning("tracing: %d spans dropped (the exporter did not keep up, or failed)",
                        untold)

    def shutdown(self) -> None:
        with self._lock:
            self._closed = True
        self._batch.shutdown()
        with self._lock:  # what still waits is never exported (the shutdown timed out)
            self.dropped["closed"] += self._waiting
            untold, self._untold, self._waiting = self._untold + self._waiting, 0, 0
        if untold:
            log.warning("tracing: %d spans dropped (the exporter did not keep up, or failed)",
                        untold)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._batch.force_flush(timeout_millis)


class _Taking(SpanExporter):
    """``exporter``, telling ``counts`` of each export: the spans it takes from those
    waiting, and whether it sent them."""

    def __init__(self, exporter: SpanExporter, counts: _CountedBatch) -> None:
        self._exporter = exporter
        self._counts = counts

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self._counts.exporting(len(spans))
        result = SpanExportResult.FAILURE
        try:
            result = self._exporter.export(spans)
        finally:
            self._counts.exported(len(spans), result is SpanExportResult.SUCCESS)
        return result

    def shutdown(self) -> None:
        self._exporter.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._exporter.force_flush(timeout_millis)


class OtelTracing:
    """:class:`gateway.tracing.Tracing` with OpenTelemetry. Spans go to ``exporter``
    (default: the configured one) through a batch processor that counts what it drops, or
    to ``processor`` instead (tests pass a simple processor over an in-memory exporter);
    ``max_waiting_spans``: the spans that may wait for the exporter (default:
    ``OTEL_BSP_MAX_QUEUE_SIZE``, else 2048)."""

    def __init__(self, config: TracingConfig, processor: SpanProcessor | None = None,
                 exporter: SpanExporter | None = None, max_waiting_spans: int | None = None
                 ) -> None:
        self.config = config
        self._processor = processor
        self._exporter = exporter
        self._max_waiting = (_max_waiting_spans() if max_waiting_spans is None
                             else max_waiting_spans)
        self._counted: _CountedBatch | None = None
        self._provider = TracerProvider(
            resource=Resource.create({"service.name": config.service_name}),
            sampler=ParentBased(TraceIdRatioBased(config.sample_ratio)),
            span_limits=SpanLimits(max_span_attribute_length=_ATTRIBUTE_CHARS))
        self._tracer = self._provider.get_tracer("kvgate.gateway")
        self._opened = False

    def open(self) -> None:
        if not self._opened:
            self._opened = True
            if self._processor is None:
                self._processor = self._counted = _CountedBatch(
                    self._exporter or _exporter(self.config), self._max_waiting)
            self._provider.add_span_processor(self._processor)

    @property
    def dropped_spans(self) -> dict[str, int]:
        """Spans lost so far, by cause (``DROP_CAUSES``; none with a ``processor`` given)."""
        counted = self._counted
        return dict(counted.dropped) if counted is not None else dict.fromkeys(DROP_CAUSES, 0)

    def collect(self) -> Iterator[Metric]:
        """``dropped_spans`` as a Prometheus counter (a ``Collector``)."""
        family = CounterMetricFamily(
            "kvgate_tracing_spans_dropped", "Spans the tracing exporter lost: too many "
            "waited for it, the export failed, or the span ended after tracing stopped",
            labels=["cause"])
        for cause, count in self.dropped_spans.items():
            family.add_metric([cause], count)
        yield family

    def close(self) -> None:
        if self._opened:
            self._provider.shutdown()

    def start(self, headers: Mapping[str, str], path: str) -> RequestTrace:
        return _OtelTrace(self._tracer, headers, path)


class _OtelTrace(RequestTrace):
    """The request span is begun (dated from ``start``) when the request first gets past
    its key check (tokenize, route, upstream) or fails: only then is the caller's
    ``traceparent`` read and its sampling decision followed. A request refused for its key
    or identity (401, 403) starts a trace of its own, sampled at ``sample_ratio``: a
    client without a valid key can neither force spans to be recorded nor join a trace."""

    __slots__ = ("_begun_ns", "_context", "_ended", "_headers", "_path", "_request_span",
                 "_step", "_tracer", "_upstream")

    def __init__(self, tracer: Tracer, headers: Mapping[str, str], path: str) -> None:
        self._tracer = tracer
        self._headers: Mapping[str, str] | None = headers
        self._path = path
        self._begun_ns = time.time_ns()
        self._request_span: Span | None = None
        self._context: Context | None = None
        self._step: Span | None = None
        self._upstream: Span | None = None
        self._ended = False

    def _begin(self, follow_caller: bool = True) -> Span:
        """The request span, begun now if it was not (a child of the caller's context
        when ``follow_caller``)."""
        if self._request_span is None:
            headers, self._headers = self._headers, None
            parent = _PROPAGATOR.extract(headers) if follow_caller and headers else None
            self._request_span = self._tracer.start_span(
                "kvgate.request", context=parent, kind=SpanKind.SERVER,
                start_time=self._begun_ns,
                attributes={"http.request.method": "POST", "url.path": self._path})
            self._context = set_span_in_context(self._request_span)
        return self._request_span

    @property
    def _request(self) -> Span:
        return self._begin()

    @contextmanager
    def _child(self, name: str) -> Iterator[object]:
        self._begin()
        span = self._tracer.start_span(name, context=self._context)
        self._step = span
        try:
            yield span
        except BaseException as exc:
            _failed(span, exc)
            raise
        finally:
            self._step = None
            span.end()

    def tokenize(self) -> AbstractContextManager[object]:
        return self._child("kvgate.tokenize")

    def tokenized(self, request: RouteRequest) -> None:
        attributes = {"gen_ai.request.model": request.model,
                      "kvgate.prompt_tokens": request.prompt_tokens}
        if self._step is not None:
            self._step.set_attributes(attributes)
        self._request.set_attributes(attributes)

    def route(self) -> AbstractContextManager[object]:
        return self._child("kvgate.route")

    def routed(self, decision: Decision) -> None:
        if self._step is not None:
            self._step.set_attributes({
                "kvgate.route.reason": decision.reason,
                "kvgate.route.ranked": list(decision.ranked[:_RANKED_SHOWN]),
                "kvgate.route.matched_tokens": decision.matched_tokens})
        self._request.set_attribute("kvgate.route.reason", decision.reason)

    def upstream(self, headers: dict[str, str]) -> None:
        request_id = headers.get("x-request-id", "")
        self._request.set_attribute("kvgate.request_id", request_id)  # begins it
        self._upstream = self._tracer.start_span(
            "kvgate.upstream", context=self._context, kind=SpanKind.CLIENT,
            attributes={"kvgate.request_id": request_id})
        headers.pop("tracestate", None)  # the client's, replaced by the trace's own (if any)
        _PROPAGATOR.inject(headers, context=set_span_in_context(self._upstream))

    def answered(self, stream: UpstreamStream) -> None:
        if self._ended:
            return
        self._ended = True
        # the answer's own status: a 200 stream that a replica's error event ended is a
        # failure, with its event's code (as the access log and the metrics count it)
        status = int(stream.outcome)
        attributes: dict[str, str | int] = {
            "kvgate.replica": stream.replica, "http.response.status_code": status}
        usage = stream.usage()
        if usage is not None:
            attributes["gen_ai.usage.input_tokens"] = usage[0]
            attributes["kvgate.cached_tokens"] = usage[1]
        for span in (self._upstream, self._request):
            if span is None:
                continue
            span.set_attributes(attributes)
            if stream.cut is not None:
                span.set_status(Status(StatusCode.ERROR, f"answer cut ({stream.cut})"))
            elif status >= 500 or stream.status >= 500:
                span.set_status(Status(StatusCode.ERROR))
            span.end()

    @contextmanager
    def _guarded(self) -> Iterator[object]:
        try:
            yield self
        except BaseException as exc:
            self.failed(exc)
            raise

    def guard(self) -> AbstractContextManager[object]:
        return self._guarded()

    def failed(self, exc: BaseException) -> None:
        if self._ended:
            return
        self._ended = True
        refused = isinstance(exc, OpenAIError) and exc.status in (401, 403)
        request = self._begin(follow_caller=not refused)
        for span in (self._upstream, request):
            if span is not None:
                _failed(span, exc)
                span.end()


def _failed(span: Span, exc: BaseException) -> None:
    if isinstance(exc, OpenAIError):
        span.set_attribute("http.response.status_code", exc.status)
        if exc.status < 500:
            span.set_attribute("error.type", exc.kind)
            return  # the client's mistake (OpenTelemetry's rule for server spans)
    span.record_exception(exc)
    span.set_status(Status(StatusCode.ERROR, str(exc)[:200]))
