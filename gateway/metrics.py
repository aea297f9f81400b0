"""The gateway's own Prometheus metrics (``GET /metrics`` on the gateway).

Counters and histograms are updated on the request path; per-replica gauges are computed
from the live ``Fleet`` at scrape time, so a removed replica's series disappear with it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.fleet import Fleet
from policies.kv_index import KVIndex

_LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0,
                    2.0, 5.0, 10.0, 30.0, 60.0)


class _FleetCollector(Collector):
    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet

    def collect(self) -> Iterator[Metric]:
        queued = GaugeMetricFamily("kvgate_replica_queued_tokens",
                                   "Prompt tokens queued at the replica, as routing sees them",
                                   labels=["replica"])
        health = GaugeMetricFamily("kvgate_replica_healthy", "1 when the replica is healthy",
                                   labels=["replica"])
        hit = GaugeMetricFamily("kvgate_replica_token_hit_rate",
                                "Prefix-cache token hit rate over the scrape window",
                                labels=["replica"])
        inflight = GaugeMetricFamily("kvgate_replica_in_flight",
                                     "Requests this gateway has in flight at the replica",
                                     labels=["replica"])
        hits_per_s = queries_per_s = 0.0
        ratio = self.fleet.calibration.ratio()
        for state in self.fleet:
            queued.add_metric([state.id], state.queued_tokens(ratio))
            health.add_metric([state.id], 1.0 if state.healthy else 0.0)
            inflight.add_metric([state.id], state.in_flight)
            rate = state.token_hit_rate()
            if rate is not None:
                hit.add_metric([state.id], rate)
            rates = state.hits.rates()  # the window's token rates, for the fleet's ratio
            hits_per_s += rates.hits_per_s
            queries_per_s += rates.queries_per_s
        fleet = GaugeMetricFamily(
            "kvgate_fleet_token_hit_rate",
            "Sum of replicas' hit-token rates over the sum of their query-token rates")
        if queries_per_s > 0:
            fleet.add_metric([], hits_per_s / queries_per_s)
        yield from (queued, health, hit, inflight, fleet)


class KVEventCounts(Protocol):
    messages: int
    malformed: int
    gaps: int
    replays: int
    replay_failures: int
    index: KVIndex


class _KVEventCollector(Collector):
    def __init__(self, source: KVEventCounts) -> None:
        self.source = source

    def collect(self) -> Iterator[Metric]:
        s, stats = self.source, self.source.index.stats
        for name, text, value in (
            ("kvgate_kv_event_messages", "KV event messages applied", s.messages),
            ("kvgate_kv_event_malformed", "KV event messages skipped as malformed",
             s.malformed),
            ("kvgate_kv_event_gaps", "Jumps in a replica's KV event sequence (and late "
             "starts), replayed or not", s.gaps),
            ("kvgate_kv_event_replays", "Gaps filled from a replica's replay endpoint",
             s.replays),
            ("kvgate_kv_event_replay_failures", "Replays that failed", s.replay_failures),
            ("kvgate_kv_event_lost", "KV event messages never applied (gaps not replayed)",
             stats.gaps),
            ("kvgate_kv_index_orphan_blocks", "Stored blocks dropped: parent unknown",
             stats.orphans),
            ("kvgate_kv_event_restarts", "Replicas whose KV event sequence went back "
             "(restarted): their blocks were cleared", stats.restarts),
        ):
            family = CounterMetricFamily(name, text)
            family.add_metric([], value)
            yield family


class GatewayMetrics:
    def __init__(self, fleet: Fleet) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("kvgate_requests", "Requests by replica, route reason and status",
                                ["replica", "route", "status"], registry=r)
        self.decision_seconds = Histogram(
            "kvgate_routing_decision_seconds",
            "Time to decide a route, tokenization included", buckets=_LATENCY_BUCKETS,
            registry=r)
        self.upstream_ttfb = Histogram(
            "kvgate_upstream_time_to_first_byte_seconds",
            "Time from sending a request to a replica to its first response byte",
            ["replica"], buckets=_LATENCY_BUCKETS, registry=r)
        self.errors = Counter("kvgate_errors", "Errors by kind", ["kind"], registry=r)
        self.prompt_tokens = Counter(
            "kvgate_prompt_tokens", "Prompt tokens of answered requests, as replicas reported "
            "them in usage, by route reason", ["route"], registry=r)
        self.cached_tokens = Counter(
            "kvgate_cached_prompt_tokens", "Prompt tokens replicas served from prefix cache "
            "(usage.prompt_tokens_details.cached_tokens), by route reason", ["route"],
            registry=r)
        self.cuts = Counter("kvgate_upstream_cuts", "Answers a replica broke off after the "
                            "client got part of them (the client sees the answer end in an "
                            "error)", ["replica", "cause"], registry=r)
        self.retries = Counter("kvgate_retries", "Requests retried on the next replica",
                               ["replica", "cause"], registry=r)
        r.register(_FleetCollector(fleet))

    def watch_kv_events(self, source: KVEventCounts) -> None:
        """Export the counts of a KV event subscriber."""
        self.registry.register(_KVEventCollector(source))
