"""What tracing and media parts cost the gateway per request, in process.

    python -m loadtests.bench_tracing [--json out.json]

``tracing_off_us``: the calls a proxied request makes on its trace with tracing off (the
module-level no-op); ``tracing_on_us``: the same with OpenTelemetry's SDK recording the
four spans into a batch processor whose exporter drops them (span making only, no
network). ``media_hash_ms_per_mib``: hashing an inline image into its placeholder (in the
tokenizer pool); ``media_check_ms_per_mib``: checking it without hashing (what runs on the
event loop).
"""

from __future__ import annotations

import argparse
import base64
import os
import timeit
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from gateway.tracing import NO_TRACING, Tracing, TracingConfig
from kvwire.chat_messages import normalize_messages
from loadtests.json_out import print_json
from policies.base import Decision, RouteRequest


class _Answer:
    """What ``RequestTrace.answered`` reads of an upstream stream."""

    replica, outcome, cut, status = "r0", "200", None, 200

    def usage(self) -> tuple[int, int]:
        return 6000, 4096


def _per_call_s(fn: Callable[[], object], number: int) -> float:
    return min(timeit.repeat(fn, number=number, repeat=5)) / number


def _traced_request(tracing: Tracing) -> Callable[[], None]:
    headers = {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
    request = RouteRequest(list(range(64)), 6000, model="bench")
    decision = Decision(("r0", "r1"), "affinity", 4096)
    answer: Any = _Answer()

    def one() -> None:
        trace = tracing.start(headers, "/v1/chat/completions")
        with trace.guard():
            with trace.tokenize():
                trace.tokenized(request)
            with trace.route():
                trace.routed(decision)
            trace.upstream({"x-request-id": "bench"})
        trace.answered(answer)

    return one


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)
    figures: dict[str, float] = {
        "tracing_off_us": round(1e6 * _per_call_s(_traced_request(NO_TRACING), 20_000), 3)}
    try:
        from opentelemetry.sdk.trace.export import (
            BatchSpanProcessor,
            SpanExporter,
            SpanExportResult,
        )

        from gateway.otel_tracing import OtelTracing
    except ImportError:
        print("OpenTelemetry is not installed (pip install 'kvgate[otel]'): "
              "tracing_on_us left out")
    else:
        class Drop(SpanExporter):
            def export(self, spans: Any) -> SpanExportResult:
                return SpanExportResult.SUCCESS

        on = OtelTracing(TracingConfig(enabled=True), BatchSpanProcessor(Drop()))
        on.open()
        figures["tracing_on_us"] = round(1e6 * _per_call_s(_traced_request(on), 500), 1)
        on.close()
    mib = 4
    url = "data:image/png;base64," + base64.b64encode(os.urandom(mib << 20)).decode()
    chat = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                         {"type": "text", "text": "What is it?"}]}]
    figures["media_hash_ms_per_mib"] = round(
        1e3 * _per_call_s(lambda: normalize_messages(chat), 5) / mib, 3)
    figures["media_check_ms_per_mib"] = round(
        1e3 * _per_call_s(lambda: normalize_messages(chat, hash_media=False), 200) / mib, 4)
    print_json(figures, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
