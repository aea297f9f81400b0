"""Spans the tracing exporter loses are counted by cause, served as a Prometheus counter
and told in a warning: the SDK's batch processor dropped them without a count."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

from gateway.otel_tracing import OtelTracing
from gateway.tracing import TracingConfig
from kvwire.openai_schema import BadRequest

CONFIG = TracingConfig(enabled=True, service_name="kvgate-test")


@pytest.fixture(autouse=True)
def _no_timed_export(monkeypatch: pytest.MonkeyPatch) -> None:
    # the batch processor exports every 5 s: here only when closed
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "600000")


class _Refusing(InMemorySpanExporter):
    """A collector that answers every export with an error."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.FAILURE


def _requests(tracing: OtelTracing, count: int) -> None:
    """``count`` requests refused after their key check: one span each."""
    for n in range(count):
        tracing.start({}, "/v1/completions").failed(BadRequest(f"bad request {n}"))


def test_spans_past_the_waiting_ones_are_counted_served_and_told(
        caplog: pytest.LogCaptureFixture) -> None:
    exporter = InMemorySpanExporter()
    tracing = OtelTracing(CONFIG, exporter=exporter, max_waiting_spans=4)
    registry = CollectorRegistry()
    registry.register(tracing)
    tracing.open()
    _requests(tracing, 10)
    assert tracing.dropped_spans == {"queue_full": 6, "export_failed": 0, "closed": 0}
    assert registry.get_sample_value("kvgate_tracing_spans_dropped_total",
                                     {"cause": "queue_full"}) == 6
    with caplog.at_level(logging.WARNING, "kvgate.gateway"):
        tracing.close()
    assert len(exporter.get_finished_spans()) == 4  # the waiting ones, exported
    assert "6 spans dropped" in caplog.text


def test_spans_of_a_failed_export_and_after_close_are_counted(
        caplog: pytest.LogCaptureFixture) -> None:
    tracing = OtelTracing(CONFIG, exporter=_Refusing(), max_waiting_spans=8)
    tracing.open()
    _requests(tracing, 3)
    with caplog.at_level(logging.WARNING, "kvgate.gateway"):
        tracing.close()
        _requests(tracing, 2)  # a request that ends as the gateway stops
    assert tracing.dropped_spans == {"queue_full": 0, "export_failed": 3, "closed": 2}
    assert "3 spans dropped" in caplog.text


def test_a_bad_queue_size_is_refused_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "lots")
    with pytest.raises(ValueError, match="OTEL_BSP_MAX_QUEUE_SIZE='lots'"):
        OtelTracing(CONFIG)
