"""Request tracing: OpenTelemetry spans for each proxied request, or nothing at all.

Configured under ``tracing`` (off by default; needs the ``otel`` extra)::

    tracing: {enabled: true, service_name: kvgate, exporter: otlp,
              endpoint: "http://collector:4318/v1/traces", sample_ratio: 1.0}

A traced request is one ``kvgate.request`` server span (a child of the client's
``traceparent`` when it sends one) with three children: ``kvgate.tokenize``,
``kvgate.route`` and ``kvgate.upstream``, whose context goes to the replica in the
``traceparent`` header. The spans are made by the gateway's own code, not by an ASGI
middleware, so they cover the proxy fast path too (which skips Starlette's middleware).

With tracing off, ``NO_TRACING.start`` returns :data:`NO_TRACE`, one module-level object
whose methods do nothing: no span is made, OpenTelemetry is not imported, and a request
pays a handful of empty method calls.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from prometheus_client.core import Metric

    from gateway.proxy import UpstreamStream
    from policies.base import Decision, RouteRequest


@dataclass(frozen=True, slots=True)
class TracingConfig:
    """``exporter``: ``otlp`` (OTLP over HTTP/protobuf to ``endpoint``, the full traces
    URL; unset, OpenTelemetry's ``OTEL_EXPORTER_OTLP_*`` variables or
    ``http://localhost:4318/v1/traces``) or ``console`` (spans printed as JSON on standard
    output). ``sample_ratio``: the share of new traces kept; a request that comes with a
    ``traceparent`` follows its caller's sampling decision once past its key check (one
    refused for its key or identity, 401 or 403, is a new trace like any other)."""

    enabled: bool = False
    service_name: str = "kvgate"
    exporter: Literal["otlp", "console"] = "otlp"
    endpoint: str | None = None
    sample_ratio: float = 1.0

    def validate(self) -> None:
        if not self.service_name:
            raise ValueError("service_name must not be empty")
        if not 0.0 <= self.sample_ratio <= 1.0:
            raise ValueError(f"sample_ratio must be within [0, 1], got {self.sample_ratio!r}")
        if self.endpoint is not None:
            parts = urlsplit(self.endpoint)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ValueError(f"endpoint {self.endpoint!r} is not an http(s) URL")
            try:
                port = parts.port
            except ValueError:  # not a number, or past 65535
                raise ValueError(f"endpoint {self.endpoint!r} has a bad port") from None
            if port == 0:
                raise ValueError(f"endpoint {self.endpoint!r} has port 0, which cannot be "
                                 "connected to")
        if self.enabled and importlib.util.find_spec("opentelemetry.sdk") is None:
            raise ValueError("enabled needs OpenTelemetry, which is not installed: "
                             "pip install 'kvgate[otel]'")


class RequestTrace:
    """One request's spans. This base class is the trace of an untraced request: every
    method does nothing (see :data:`NO_TRACE`)."""

    __slots__ = ()

    def tokenize(self) -> AbstractContextManager[object]:
        """The ``kvgate.tokenize`` span, open for the block."""
        return _NOTHING

    def tokenized(self, request: RouteRequest) -> None:
        """What tokenizing found (model, prompt tokens); called inside ``tokenize``."""

    def route(self) -> AbstractContextManager[object]:
        """The ``kvgate.route`` span (the policy's choice), open for the block."""
        return _NOTHING

    def routed(self, decision: Decision) -> None:
        """The decision (reason, ranked replicas); called inside ``route``."""

    def upstream(self, headers: dict[str, str]) -> None:
        """Opens the ``kvgate.upstream`` span and sets its ``traceparent`` in ``headers``
        (those forwarded to the replica)."""

    def answered(self, stream: UpstreamStream) -> None:
        """The answer ended (relayed whole, cut, or abandoned): ends every span."""

    def failed(self, exc: BaseException) -> None:
        """The request ended in an error before its answer began: ends every span."""

    def guard(self) -> AbstractContextManager[object]:
        """Calls ``failed`` if the block raises."""
        return _NOTHING


_NOTHING: AbstractContextManager[object] = nullcontext()
NO_TRACE = RequestTrace()


class Tracing(Protocol):
    """Where request traces come from: :data:`NO_TRACING`, or OpenTelemetry's
    (``gateway.otel_tracing``)."""

    def start(self, headers: Mapping[str, str], path: str) -> RequestTrace:
        """A trace for a request to ``path`` whose headers are ``headers``."""
        ...

    def open(self) -> None:
        """Starts exporting (the exporter's thread); called in the app's lifespan."""
        ...

    def close(self) -> None:
        """Exports what is left and stops."""
        ...

    def collect(self) -> Iterator[Metric]:
        """Its own figures, for ``/metrics`` (a Prometheus ``Collector``): the spans it
        lost."""
        ...


class _NoTracing:
    __slots__ = ()

    def start(self, headers: Mapping[str, str], path: str) -> RequestTrace:
        return NO_TRACE

    def open(self) -> None:
        pass

    def close(self) -> None:
        pass

    def collect(self) -> Iterator[Metric]:
        return iter(())


NO_TRACING: Tracing = _NoTracing()


def build_tracing(config: TracingConfig) -> Tracing:
    """The tracing ``config`` asks for; OpenTelemetry is imported only when it is on."""
    if not config.enabled:
        return NO_TRACING
    from gateway.otel_tracing import OtelTracing

    return OtelTracing(config)
