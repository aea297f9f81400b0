"""Rates over a sliding window from successive ``/admin/top`` snapshots (``kvgate top``).

The snapshot carries cumulative counters per replica: the replica's prefix-cache hit and
query tokens (as the gateway last scraped them) and the requests the gateway routed there,
by reason. A replica's rates over the window are the differences between its oldest and
newest samples in the window::

    token hit rate = (hits_new - hits_old) / (queries_new - queries_old)
    requests/s     = (requests_new - requests_old) / (t_new - t_old)

A counter that goes backwards (the replica restarted, or left and came back) restarts that
replica's window. The hit rate starts from the window's oldest sample that has the
counters: a replica's first samples may have none (not yet scraped). A counter the
snapshot lacks, or gives as no number (a gateway of another version), is no counter: the
rate it feeds is None, never an error; so is one no float holds (NaN, Infinity, an integer
past 1.8e308), and a rate that comes out no finite number is None too.

Samples closer together than ``window_s / _MAX_SAMPLES`` are thinned (of three such, the
middle one goes), so a replica holds at most about ``2 * _MAX_SAMPLES`` of them however
many reads the window spans, and the window's start is found to within that gap.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Any

_MAX_SAMPLES = 256  # per window, about, per replica


@dataclass(frozen=True, slots=True)
class Sample:
    at: float  # the client's monotonic clock, seconds
    hit_tokens: float | None
    query_tokens: float | None
    requests: float | None  # None: the snapshot has no count
    reasons: dict[str, float]


@dataclass(frozen=True, slots=True)
class ReplicaRates:
    span_s: float  # seconds between the window's oldest and newest samples
    token_hit_rate: float | None  # None: no prompt tokens queried in the window
    requests_per_s: float | None  # None: a single sample so far, or no request count
    reasons: dict[str, float]  # requests routed in the window, by reason


def _went_back(old: Sample, new: Sample) -> bool:
    def back(a: float | None, b: float | None) -> bool:
        return a is not None and b is not None and b < a

    return (back(old.hit_tokens, new.hit_tokens) or back(old.query_tokens, new.query_tokens)
            or back(old.requests, new.requests))


def number(value: object) -> float | None:
    """A counter or gauge of the snapshot: None unless it is a finite number a float
    holds (JSON's true and false, NaN, Infinity and an integer past 1.8e308 are none)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        return value if math.isfinite(value) else None
    except OverflowError:  # an integer no float holds
        return None


def _counter(value: object) -> float | None:
    """``number(value)`` as a float: differences of counters are taken in floats, which
    overflow to infinity, never to an error."""
    n = number(value)
    return None if n is None else float(n)


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def replica_id(index: int, rep: object) -> str:
    """The id of the snapshot's ``index``-th replica; a ``ValueError`` naming the entry
    and the field when it is no object with an ``id``."""
    if not isinstance(rep, dict):
        raise ValueError(f"replica {index} of the snapshot is no object: {type(rep).__name__}")
    if rep.get("id") is None:
        raise ValueError(f"replica {index} of the snapshot has no 'id'")
    return str(rep["id"])


def _reasons(value: object) -> dict[str, float]:
    if not isinstance(value, dict):
        return {}
    return {str(k): n for k, v in value.items() if (n := number(v)) is not None}


class TopWindow:
    """Per-replica samples over the last ``window_s`` seconds."""

    def __init__(self, window_s: float) -> None:
        if window_s <= 0:
            raise ValueError(f"window_s must be positive, got {window_s!r}")
        self.window_s = window_s
        self._series: dict[str, deque[Sample]] = {}

    def add(self, at: float, snapshot: dict[str, Any]) -> None:
        """Record one ``/admin/top`` answer fetched at ``at``; replicas that left are
        forgotten. A ``ValueError`` (``replica_id``) for a replica without an id, before
        anything is recorded."""
        replicas = snapshot.get("replicas", [])
        ids = [replica_id(i, rep) for i, rep in enumerate(replicas)]
        seen = set(ids)
        for rid, rep in zip(ids, replicas, strict=True):
            sample = Sample(at, _counter(rep.get("hit_tokens")),
                            _counter(rep.get("query_tokens")), _counter(rep.get("requests")),
                            _reasons(rep.get("reasons")))
            series = self._series.setdefault(rid, deque())
            if series and _went_back(series[-1], sample):
                series.clear()
            series.append(sample)
            # [-3] and [-1] closer than a gap: [-2] tells nothing the ends do not
            if len(series) >= 3 and at - series[-3].at < self.window_s / _MAX_SAMPLES:
                del series[-2]
            # keep the newest sample at or before the window's start as its left edge
            while len(series) > 2 and at - series[1].at >= self.window_s:
                series.popleft()
        for gone in set(self._series) - seen:
            del self._series[gone]

    def rates(self, replica: str) -> ReplicaRates:
        series = self._series.get(replica)
        if not series:
            return ReplicaRates(0.0, None, None, {})
        old, new = series[0], series[-1]
        span = new.at - old.at
        hit_rate = None
        if new.hit_tokens is not None and new.query_tokens is not None:
            # from the window's oldest sample that has the counters (a replica not yet
            # scraped at the window's start has none there)
            first = next(s for s in series
                         if s.hit_tokens is not None and s.query_tokens is not None)
            assert first.hit_tokens is not None and first.query_tokens is not None
            queried = new.query_tokens - first.query_tokens
            if queried > 0:
                hit_rate = (new.hit_tokens - first.hit_tokens) / queried
        reasons = {k: v - old.reasons.get(k, 0) for k, v in new.reasons.items()
                   if v - old.reasons.get(k, 0) > 0}
        rps = None
        if span > 0 and new.requests is not None and old.requests is not None:
            rps = (new.requests - old.requests) / span
        return ReplicaRates(span, _finite(hit_rate), _finite(rps), reasons)
