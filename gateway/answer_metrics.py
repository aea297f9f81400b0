"""Histograms of answered requests by model and route reason, as the client saw them.

- ``kvgate_time_to_first_token_seconds``: from the request's arrival at the gateway to
  the first chunk of the answer relayed to the client (a stream's first token; for a
  non-streamed answer, its first byte).
- ``kvgate_request_duration_seconds``: from arrival to the answer's last byte.
- ``kvgate_output_tokens``: the replica's ``usage.completion_tokens`` when the answer
  carries it (every non-streamed answer, and streams that asked for
  ``stream_options.include_usage``); otherwise a stream's content chunks, one per token
  for vLLM and kvgate's engine, summed over its choices (``UpstreamStream.content_chunks``).

Only answers that completed with a status under 400 are recorded (the rest are counted in
``kvgate_requests`` by status). The ``model`` label takes the fleet's served models, at
most ``MAX_MODEL_LABELS`` of them (the first answered; a fleet serving a thousand LoRA
adapters made 125,000 series, 15 MB of /metrics, one adapter at a time); any other name is
recorded as ``other``, so the number of series stays bounded whatever clients send. A
model the fleet no longer serves gives its place, and its series are removed, when a new
one needs it; with worker processes (prometheus-client's multiprocess mode, which cannot
remove a series) no model gives its place: each worker labels the first 32 it answers.
Label children are cached per (model, reason): a request costs one dict lookup and three
observations.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from prometheus_client import CollectorRegistry, Histogram

if TYPE_CHECKING:
    from gateway.proxy import UpstreamStream, Usage

OTHER_MODEL = "other"
MAX_MODEL_LABELS = 32  # distinct model label values, ``other`` aside

TTFT = "kvgate_time_to_first_token_seconds"
DURATION = "kvgate_request_duration_seconds"
OUTPUT_TOKENS = "kvgate_output_tokens"

_TTFT_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.25, 0.5, 0.75, 1.0, 2.5,
                 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
_DURATION_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0,
                     80.0, 160.0, 320.0, 640.0)
_TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000)


class _Children(NamedTuple):
    ttft: Any
    duration: Any
    output_tokens: Any


class AnswerMetrics:
    """``serves`` tells whether the fleet serves a model now (asked only on a cache miss,
    never for the set of every model: a fleet of LoRA adapters lists thousands)."""

    def __init__(self, registry: CollectorRegistry, serves: Callable[[str], bool],
                 reasons: tuple[str, ...] = (), evict: bool = True) -> None:
        labels = ["model", "reason"]
        self.ttft = Histogram(TTFT, "Request arrival to the first answer chunk relayed to "
                              "the client (a stream's first token)", labels,
                              buckets=_TTFT_BUCKETS, registry=registry)
        self.duration = Histogram(DURATION, "Request arrival to the answer's last byte",
                                  labels, buckets=_DURATION_BUCKETS, registry=registry)
        self.output_tokens = Histogram(
            OUTPUT_TOKENS, "Output tokens per answer (usage.completion_tokens, else a "
            "stream's content chunks)", labels, buckets=_TOKEN_BUCKETS, registry=registry)
        self._serves = serves
        self._evict = evict  # a model that left may give its place (not in multiprocess mode)
        self._children: dict[tuple[str, str], _Children] = {}
        for reason in reasons:
            self._labelled(OTHER_MODEL, reason)

    def _labelled(self, model: str, reason: str) -> _Children:
        children = _Children(self.ttft.labels(model, reason),
                             self.duration.labels(model, reason),
                             self.output_tokens.labels(model, reason))
        self._children[(model, reason)] = children
        return children

    def children(self, model: str | None, reason: str) -> _Children:
        """The label children of (``model``, ``reason``), created on first use; a model
        the fleet does not serve, or one past ``MAX_MODEL_LABELS``, is ``other``."""
        found = self._children.get((model or OTHER_MODEL, reason))
        if found is not None:
            return found
        if model is None or not self._may_label(model):
            model = OTHER_MODEL
            found = self._children.get((model, reason))
            if found is not None:
                return found
        return self._labelled(model, reason)

    def _may_label(self, model: str) -> bool:
        """Whether ``model`` has, or may take, a label of its own: the fleet serves it, and
        it has one, or there is room, or a model the fleet no longer serves gives its
        place (its series removed)."""
        if not self._serves(model):
            return False
        labelled = {m for m, _ in self._children if m != OTHER_MODEL}
        if model in labelled or len(labelled) < MAX_MODEL_LABELS:
            return True
        if not self._evict:
            return False
        gone = next((m for m in labelled if not self._serves(m)), None)
        if gone is None:
            return False
        for key in [key for key in self._children if key[0] == gone]:
            del self._children[key]
            for histogram in (self.ttft, self.duration, self.output_tokens):
                histogram.remove(*key)
        return True

    def answered(self, model: str | None, reason: str, ttft_s: float | None,
                 duration_s: float, output_tokens: int | None) -> None:
        """One answer completed (``ttft_s`` None: no chunk reached the client)."""
        children = self.children(model, reason)
        if ttft_s is not None:
            children.ttft.observe(ttft_s)
        children.duration.observe(duration_s)
        if output_tokens is not None:
            children.output_tokens.observe(output_tokens)

    def relayed(self, model: str | None, reason: str, stream: UpstreamStream,
                arrived: float, usage: Usage | None = None) -> None:
        """``stream`` relayed whole to the client, for a request that arrived at
        ``arrived`` (``perf_counter``); ``usage``: what the answer reported, if read."""
        ttft_s = None if stream.first_sent_at is None else stream.first_sent_at - arrived
        tokens = usage.completion_tokens if usage is not None else None
        if tokens is None:
            tokens = stream.content_chunks()
        self.answered(model, reason, ttft_s, time.perf_counter() - arrived, tokens)
