"""The series of every error kind and of every status a request can be refused with before
any replica answers exist at zero from the start, so ``increase()`` sees their first
increment (a series born at 1 shows no increase)."""

from __future__ import annotations

from collections.abc import Iterator

import gateway.admin
import gateway.app  # every error the gateway answers with, imported
from gateway.config import ReplicaConfig
from gateway.fleet import Fleet
from gateway.metrics import GatewayMetrics
from kvwire.openai_schema import OpenAIError

REASONS = ("cache_match", "spill")


def _errors(cls: type[OpenAIError]) -> Iterator[type[OpenAIError]]:
    for sub in cls.__subclasses__():
        yield sub
        yield from _errors(sub)


def test_every_error_kind_has_its_series_from_the_start() -> None:
    metrics = GatewayMetrics(Fleet([]), REASONS)
    # what ErrorBoundary counts: each error's kind, a Starlette HTTPException's "http"
    kinds = {cls.kind for cls in _errors(OpenAIError)} | {OpenAIError.kind, "http"}
    assert gateway.admin.AdminOff.kind in kinds
    missing = [kind for kind in sorted(kinds) if metrics.registry.get_sample_value(
        "kvgate_errors_total", {"kind": kind}) is None]
    assert missing == []


def test_refusals_before_any_replica_have_their_series_from_the_start() -> None:
    metrics = GatewayMetrics(Fleet([]), REASONS)
    # 401: a wrong client key; 502 and 504: every replica tried failed before its first
    # byte (counted under the route's reason, no replica)
    missing = [(route, status) for route in ("none", *REASONS)
               for status in ("401", "502", "503", "504")
               if route != "none" or status not in ("502", "504")
               if metrics.registry.get_sample_value("kvgate_requests_total", {
                   "replica": "none", "route": route, "status": status}) is None]
    assert missing == []


def test_pass_through_requests_have_their_series_from_the_start() -> None:
    metrics = GatewayMetrics(Fleet([ReplicaConfig(id="r0", url="http://127.0.0.1:9")]),
                             REASONS)
    samples = [("kvgate_requests_total", {"replica": "r0", "route": "passthrough",
                                          "status": "200"}),
               ("kvgate_requests_total", {"replica": "none", "route": "passthrough",
                                          "status": "503"}),
               ("kvgate_requests_total", {"replica": "none", "route": "passthrough",
                                          "status": "502"})]
    assert [metrics.registry.get_sample_value(name, labels) for name, labels in samples] \
        == [0.0, 0.0, 0.0]
    # a pass-through request reports no prompt or cached tokens: no such series
    assert metrics.registry.get_sample_value("kvgate_prompt_tokens_total",
                                             {"route": "passthrough"}) is None
