"""The gateway's own Prometheus metrics (``GET /metrics`` on the gateway).

Counters and histograms are updated on the request path; per-replica gauges are computed
from the live ``Fleet`` at scrape time. Label children are created up front for the values
known in advance (error kinds, rejection statuses, and per replica the policy's route
reasons, retry and cut causes), so ``increase()`` sees a series' first increment; a
replica's series go when it leaves the fleet. Histograms of answers by model and route
reason are ``gateway.answer_metrics``; ``process_*`` describe the gateway's process.

With worker processes (prometheus-client's multiprocess mode, ``PROMETHEUS_MULTIPROC_DIR``
set by ``gateway.workers``) ``exposed`` sums every worker's counters and histograms; the
per-replica gauges are the box's already (``shared_load``), and so are the discovery
counts (the leader's, copied to every worker); the peer links' counts and the requests
holding and waiting for places (``Admission``), each worker's own, are copied into summed
metrics every second (``gateway.metric_mirror``), and the KV event
counts (every worker reads every replica's stream) into the largest worker's;
``process_*`` are left out (one worker's would pass for the box's). A replica that left
goes from ``/metrics`` at once and from the workers' files soon after (``MetricFiles``),
so the files hold the fleet's replicas, not every one that ever joined.

``GET /metrics`` runs only the collectors of the event loop's state on the loop; the rest
of its page is read and written on a thread (``GatewayMetrics.page``).
"""

from __future__ import annotations

import asyncio
import functools
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, NamedTuple, Protocol

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from gateway.admission import (
    SHOWN_TENANTS,
    Admission,
    BusiestTenants,
    TenantCount,
    added_up,
    busiest,
)
from gateway.answer_metrics import AnswerMetrics
from gateway.fleet import Fleet
from gateway.fleet_events import FleetEvent, ReplicaAdded
from gateway.metric_mirror import MetricMirror, worker_files
from gateway.shared_load import TenantBoard
from policies.base import ReplicaRemoved
from policies.kv_index import KVIndex

_LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0,
                    2.0, 5.0, 10.0, 30.0, 60.0)


class _CurrentReplicas(Collector):
    """The worker processes' summed series (prometheus-client's multiprocess mode) less
    those of replicas no longer in the fleet: a worker's files keep a replica's series
    a while after it left (``GatewayMetrics._drop_filed``), and another worker's until it
    has heard of the leaving. ``among`` reads only the files, for the ids given: it may
    run on another thread."""

    def __init__(self, summed: Collector, fleet: Fleet, mirror: MetricMirror) -> None:
        self.summed = summed
        self.fleet = fleet
        self.mirror = mirror

    def current(self) -> frozenset[str]:
        """The fleet's replicas, and ``none`` (requests no replica took)."""
        return frozenset((*(state.id for state in self.fleet), "none"))

    def collect(self) -> Iterator[Metric]:
        return self.among(self.current())

    def among(self, current: frozenset[str]) -> Iterator[Metric]:
        for family in self.summed.collect():
            family.samples = [s for s in family.samples
                              if s.labels.get("replica", "none") in current]
            yield self.mirror.retyped(family)


def _by_replica(families: Iterable[Metric]) -> dict[str, dict[str, int]]:
    """``kvgate_requests``' counts by replica, then route reason (any status)."""
    out: dict[str, dict[str, int]] = {}
    for family in families:
        for sample in family.samples:
            replica = sample.labels["replica"]
            if not sample.name.endswith("_total") or replica == "none":
                continue
            routes = out.setdefault(replica, {})
            route = sample.labels["route"]
            routes[route] = routes.get(route, 0) + int(sample.value)
    return out


class _Collected(Collector):
    """Families collected already, served as they are."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> list[Metric]:
        return self.families


class _Page(Collector):
    """``GET /metrics``' families: those of the collectors that read the event loop's
    state (``live``), then the rest (``rest``)."""

    def __init__(self, live: list[Collector], rest: Callable[[], Iterable[Metric]]) -> None:
        self.live = live
        self.rest = rest

    def collect(self) -> Iterator[Metric]:
        for collector in self.live:
            yield from collector.collect()
        yield from self.rest()


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
        refused = CounterMetricFamily(
            "kvgate_replica_auth_failures", "Answers 401/403 to the gateway's own calls to "
            "the replica (/metrics, /v1/models), and to requests sent with the key the "
            "gateway holds for it: its api_key is missing or wrong",
            labels=["replica"])
        hits_per_s = queries_per_s = 0.0
        ratio = self.fleet.calibration.ratio()
        for state in self.fleet:
            load = state.load()  # the box's, with worker processes
            queued.add_metric([state.id], state.queued_tokens(ratio, load))
            health.add_metric([state.id], 1.0 if state.healthy else 0.0)
            inflight.add_metric([state.id], load.in_flight)
            refused.add_metric([state.id], state.auth_failures)
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
        yield from (queued, health, hit, inflight, refused, fleet)


def _unlabelled(family: type[CounterMetricFamily] | type[GaugeMetricFamily],
                rows: Sequence[tuple[str, str, float]]) -> Iterator[Metric]:
    """One family of ``family``'s kind per (name, help, value), without labels."""
    for name, text, value in rows:
        metric = family(name, text)
        metric.add_metric([], value)
        yield metric


# the index's counts (``IndexStats``' fields) exported per replica
DROP_REASONS = ("orphans", "keyed_elsewhere", "wrong_block_size", "gaps", "restarts",
                "overflows")


class KVEventCounts(Protocol):
    messages: int
    malformed: int
    gaps: int
    replays: int
    replay_failures: int
    index: KVIndex


class _KVEventCollector(Collector):
    """The KV event subscriber's ``counts``, and the index's ``blocks`` per replica (with
    whether its stream is stalled)."""

    def __init__(self, source: KVEventCounts, counts: bool = True, blocks: bool = True
                 ) -> None:
        self.source = source
        self.counts = counts
        self.blocks = blocks

    def collect(self) -> Iterator[Metric]:
        if self.counts:
            yield from self._counts()
        if self.blocks:
            yield from self._blocks()

    def _counts(self) -> Iterator[Metric]:
        s, stats = self.source, self.source.index.stats
        yield from _unlabelled(CounterMetricFamily, (
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
            ("kvgate_kv_index_keyed_elsewhere_blocks", "Stored blocks dropped: hashed over "
             "more than their tokens (a cache salt, an image)", stats.keyed_elsewhere),
            ("kvgate_kv_event_restarts", "Replicas whose KV event sequence went back "
             "(restarted): their blocks were cleared", stats.restarts),
            ("kvgate_kv_index_overflows", "Replicas whose KV events named more blocks than "
             "they can hold: their blocks were cleared", stats.overflows),
        ))
        yield self._drops()

    def _drops(self) -> Metric:
        """The index's counts of what it could not apply, per replica and reason."""
        index = self.source.index
        drops = CounterMetricFamily(
            "kvgate_kv_index_drops", "What a replica's KV events lost in the exact index, by "
            "reason: stored blocks dropped (orphans: parent unknown; keyed_elsewhere: "
            "hashed over more than their tokens), stored events dropped (wrong_block_size: "
            "not the gateway's block size), messages lost (gaps), the replica's blocks "
            "cleared (restarts, overflows)", labels=["replica", "reason"])
        for replica in index.replicas():
            stats = index.stats_of(replica)
            if stats is None:
                continue
            for reason in DROP_REASONS:
                drops.add_metric([replica, reason], getattr(stats, reason))
        return drops

    def _blocks(self) -> Iterator[Metric]:
        index = self.source.index
        blocks = GaugeMetricFamily("kvgate_kv_index_blocks", "Blocks the exact index holds "
                                   "for a replica (from its KV events)", labels=["replica"])
        for replica in index.replicas():
            blocks.add_metric([replica], index.num_blocks(replica))
        yield blocks
        stalled = index.stalled()
        gauge = GaugeMetricFamily(
            "kvgate_kv_events_stalled", "1 while a replica's KV event stream is judged "
            "stalled: prompts answered there stored blocks, and no message of it came since "
            "(its index is not trusted meanwhile)", labels=["replica"])
        for replica in index.replicas():
            gauge.add_metric([replica], 1.0 if replica in stalled else 0.0)
        yield gauge


class PeerCounts(Protocol):
    frames_sent: int
    frames_dropped: int
    frames_received: int
    malformed: int
    refused: int
    links_up: int
    peers_in: int


class _PeerCollector(Collector):
    def __init__(self, source: PeerCounts) -> None:
        self.source = source

    def collect(self) -> Iterator[Metric]:
        s = self.source
        yield from _unlabelled(CounterMetricFamily, (
            ("kvgate_peer_frames_sent", "Frames sent to peer gateway copies", s.frames_sent),
            ("kvgate_peer_frames_dropped", "Frames not sent: the peer was down or too far "
             "behind", s.frames_dropped),
            ("kvgate_peer_frames_received", "Frames applied from peer gateway copies",
             s.frames_received),
            ("kvgate_peer_malformed", "Peer connections dropped for a malformed frame",
             s.malformed),
            ("kvgate_peer_refused", "Peer handshakes refused (the secrets differ)",
             s.refused),
        ))
        yield from _unlabelled(GaugeMetricFamily, (
            ("kvgate_peer_links_up", "Connections this copy sends its peers on", s.links_up),
            ("kvgate_peer_links_in", "Connections peers send this copy on", s.peers_in),
        ))


class WorkerRouteCounts(Protocol):
    sent: int
    received: int
    dropped: int
    malformed: int
    unknown: int
    answers_told: int
    answers_dropped: int
    answers_received: int


class _WorkerRouteCollector(Collector):
    def __init__(self, source: WorkerRouteCounts) -> None:
        self.source = source

    def collect(self) -> Iterator[Metric]:
        s = self.source
        yield from _unlabelled(CounterMetricFamily, (
            ("kvgate_worker_routes_sent", "Routes told to the box's other workers (one per "
             "worker told)", s.sent),
            ("kvgate_worker_routes_dropped", "Routes not told: another worker's buffer was "
             "full, or it had stopped", s.dropped),
            ("kvgate_worker_routes_received", "Routes the box's other workers told",
             s.received),
            ("kvgate_worker_routes_malformed", "Messages from other workers skipped as "
             "malformed", s.malformed),
            ("kvgate_worker_routes_unknown", "Routes the box's other workers told to a "
             "replica this worker's fleet does not hold (not yet, or no more): skipped",
             s.unknown),
            ("kvgate_worker_responses_told", "Stored responses (their replica and tenant) "
             "told to the box's other workers (one per worker told)", s.answers_told),
            ("kvgate_worker_responses_dropped", "Stored responses not told to another "
             "worker (its buffer full): it would send another tenant's continuation of "
             "one on to the replicas", s.answers_dropped),
            ("kvgate_worker_responses_received", "Stored responses the box's other workers "
             "told", s.answers_received),
        ))


class CaptureCounts(Protocol):
    written: int
    dropped_full: int
    dropped_large: int


class _CaptureCollector(Collector):
    def __init__(self, source: CaptureCounts) -> None:
        self.source = source

    def collect(self) -> Iterator[Metric]:
        s = self.source
        yield from _unlabelled(CounterMetricFamily, (
            ("kvgate_capture_records_written", "Requests written to the capture log",
             s.written),
        ))
        dropped = CounterMetricFamily("kvgate_capture_records_dropped", "Requests the "
                                      "capture log lost: its queue was full, or the record "
                                      "too large or not writable", labels=["cause"])
        dropped.add_metric(["queue_full"], s.dropped_full)
        dropped.add_metric(["unwritten"], s.dropped_large)
        yield dropped


class _AdmissionCollector(Collector):
    """The gateway's places and waiting slots (``Admission``): the requests holding a place
    and those waiting for one, all tenants together. No series per tenant: /metrics is
    served on the client port, open without a key, and a multi-tenant gateway's tenant
    names are not public."""

    def __init__(self, admission: Admission) -> None:
        self.admission = admission

    def collect(self) -> Iterator[Metric]:
        a = self.admission
        yield from _unlabelled(GaugeMetricFamily, (
            ("kvgate_admission_in_flight", "Requests holding one of the gateway's places "
             "(limits.max_in_flight)", a.in_flight),
            ("kvgate_admission_waiting", "Requests waiting for a place (limits.max_pending)",
             a.waiting),
        ))


ADMISSION_GAUGES = ("kvgate_admission_in_flight", "kvgate_admission_waiting")


class TopCounts(NamedTuple):
    """What ``/admin/top`` reads of the metrics: ``by_replica`` (``requests_by_replica``),
    the requests holding a place and waiting for one, and those of the busiest tenants
    (None: not watched)."""

    by_replica: dict[str, dict[str, int]]
    in_flight: int | None
    waiting: int | None
    tenants: BusiestTenants | None = None


def _top_counts(families: Iterable[Metric]) -> TopCounts:
    """``TopCounts`` of the families of ``kvgate_requests`` and ``ADMISSION_GAUGES``."""
    families = list(families)
    gauges = {family.name: int(family.samples[0].value) for family in families
              if family.name in ADMISSION_GAUGES and family.samples}
    in_flight, waiting = (gauges.get(name) for name in ADMISSION_GAUGES)
    return TopCounts(_by_replica(f for f in families if f.name == "kvgate_requests"),
                     in_flight, waiting)


def _box_tenants(own: list[TenantCount], board: TenantBoard) -> BusiestTenants:
    """The busiest tenants of the box: this worker's ``own`` counts and every other
    worker's on ``board`` added up, the rest summed. A tenant another worker left out of
    its own list (thousands busier than it) is counted once more among the rest for each
    such worker."""
    parts = [busiest(own, len(own))]
    for worker in range(board.workers):
        if worker != board.worker:
            published = board.read(worker)
            if published is not None:  # else it stopped while writing: left out
                parts.append(published)
    shown = busiest(added_up(c for part in parts for c in part.shown), SHOWN_TENANTS)
    return shown._replace(
        more_tenants=shown.more_tenants + sum(p.more_tenants for p in parts),
        more_in_flight=shown.more_in_flight + sum(p.more_in_flight for p in parts),
        more_waiting=shown.more_waiting + sum(p.more_waiting for p in parts))


class DiscoveryCounts(Protocol):
    label: str
    replicas: int
    syncs: int
    failures: int
    relists: int
    gone: int
    refused: int
    last_sync: float | None


class _DiscoveryCollector(Collector):
    def __init__(self, sources: Sequence[DiscoveryCounts]) -> None:
        self.sources = sources

    def collect(self) -> Iterator[Metric]:
        replicas = GaugeMetricFamily("kvgate_discovery_replicas",
                                     "Replicas in the last set a discovery source found",
                                     labels=["source"])
        last = GaugeMetricFamily("kvgate_discovery_last_sync_timestamp_seconds",
                                 "When a discovery source last applied a set (Unix time)",
                                 labels=["source"])
        counters = [
            (CounterMetricFamily("kvgate_discovery_syncs", "Sets a discovery source found "
                                 "and applied", labels=["source"]), "syncs"),
            (CounterMetricFamily("kvgate_discovery_failures", "Lookups, lists or watches "
                                 "of a discovery source that failed (its last set stays)",
                                 labels=["source"]), "failures"),
            (CounterMetricFamily("kvgate_discovery_relists", "Full lists of a Kubernetes "
                                 "discovery source", labels=["source"]), "relists"),
            (CounterMetricFamily("kvgate_discovery_watch_gone", "Watches answered 410 Gone",
                                 labels=["source"]), "gone"),
            (CounterMetricFamily("kvgate_discovery_refused", "Replicas a discovery source "
                                 "found that may not join (an id, URL or address no replica "
                                 "may have): each once", labels=["source"]), "refused"),
        ]
        for source in self.sources:
            replicas.add_metric([source.label], source.replicas)
            if source.last_sync is not None:
                last.add_metric([source.label], source.last_sync)
            for family, attr in counters:
                family.add_metric([source.label], getattr(source, attr))
        yield replicas
        yield last
        yield from (family for family, _ in counters)


ERROR_KINDS = ("bad_request", "unauthorized", "not_found", "too_large", "body_timeout",
               "client_disconnect", "rate_limited", "unavailable", "no_replica", "fleet_busy",
               "upstream", "upstream_timeout", "untrusted_tenant", "admin_off", "internal",
               "http")
# answered before any replica
REJECTED = ("400", "401", "403", "404", "405", "408", "413", "415", "429", "499", "503")
UNANSWERED = ("502", "504")  # routed, every replica tried failed before its first byte
RETRY_CAUSES = ("connect", "5xx", "broken", "timeout", "idle_timeout", "ejected")
CUT_CAUSES = ("broken", "cut_short", "idle_timeout", "ejected")
# the route of requests relayed without a routing decision (embeddings, rerank, score...)
PASSTHROUGH_ROUTE = "passthrough"


class GatewayMetrics:
    def __init__(self, fleet: Fleet, reasons: tuple[str, ...] = ()) -> None:
        multiprocess_dir = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
        # with worker processes: this worker's files, before any metric writes to them
        self.files = worker_files(multiprocess_dir) if multiprocess_dir else None
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
        built = Counter(
            "kvgate_prompts_built", "Routing requests built, by where: on the tokenizer pool "
            "(a prompt encoded, or a large chat rendered) or inline on the event loop (token "
            "ids, a length estimate, a remembered document, text hashes)", ["where"],
            registry=r)
        self.built_on = {True: built.labels(where="pool"), False: built.labels(where="inline")}
        self.prompt_tokens = Counter(
            "kvgate_prompt_tokens", "Prompt tokens of answered requests, as replicas reported "
            "them in usage, by route reason", ["route"], registry=r)
        self.cached_tokens = Counter(
            "kvgate_cached_prompt_tokens", "Prompt tokens replicas served from prefix cache "
            "(usage.prompt_tokens_details.cached_tokens), by route reason", ["route"],
            registry=r)
        self.access_dropped = Counter(
            "kvgate_access_log_dropped_lines", "Access log lines lost: standard error did not "
            "keep up (past the lines that may wait for it), or was closed", registry=r)
        self.cuts = Counter("kvgate_upstream_cuts", "Answers a replica broke off after the "
                            "client got part of them (the client sees the answer end in an "
                            "error)", ["replica", "cause"], registry=r)
        self.retries = Counter("kvgate_retries", "Requests tried again: on the next replica "
                               "(after a failure of this cause there), or sent again to it on "
                               "a new connection (cause resent: a kept-alive one closed as "
                               "the request went out)", ["replica", "cause"], registry=r)
        self.held_backs = Counter("kvgate_held_back", "Requests the policy ranked this "
                                  "replica first for, sent elsewhere first because it held "
                                  "far more requests in flight than the fleet's median "
                                  "(limits.held_back_margin)", ["replica"], registry=r)
        self.short_contexts = Counter(
            "kvgate_short_context", "Requests the policy ranked this replica first for, "
            "sent elsewhere first because the prompt's estimate clearly exceeds its "
            "max_model_len (by more than the estimate's margin)", ["replica"], registry=r)
        ProcessCollector(registry=r)  # process_cpu_seconds_total, process_resident_memory..
        # (multiprocess mode cannot remove a series: no model label is given back there)
        # the routes a request's series are labelled with: the policy's reasons, and
        # pass-through (whose prompt and cached tokens are not counted)
        routes = (*reasons, PASSTHROUGH_ROUTE)
        self.answers = AnswerMetrics(r, fleet.lists, routes, evict=not multiprocess_dir)
        # the collectors that read the event loop's state (the fleet, a subscriber)
        self._live: list[Collector] = []
        # with worker processes: per-worker counts, copied into the summed figures
        self.mirror: MetricMirror | None = None
        self._summed: _CurrentReplicas | None = None
        if multiprocess_dir:
            self.mirror = MetricMirror(r)
            self._summed = _CurrentReplicas(MultiProcessCollector(None, multiprocess_dir),
                                            fleet, self.mirror)
        # what GET /metrics serves (``page``: the same, written off the event loop)
        self.exposed = _Page(self._live, (self._summed or r).collect)
        self.export(_FleetCollector(fleet))
        self._admission: Admission | None = None  # ``watch_admission``
        self._board: TenantBoard | None = None  # ``watch_box_tenants``
        self.routes = routes
        # label children bound once: labels() locks and checks on every call
        self._bound: dict[tuple[Any, tuple[str, ...]], Any] = {}
        self._children: dict[str, dict[tuple[Any, tuple[str, ...]], None]] = {}
        self._fleet = fleet
        # replicas that left but whose requests then ended: their series went again
        self._departed: set[str] = set()
        # replicas whose series went from the registry but not yet from ``files``
        self._filed: set[str] = set()
        for kind in ERROR_KINDS:
            self.errors.labels(kind=kind)
        for route in reasons:
            self.prompt_tokens.labels(route=route)
            self.cached_tokens.labels(route=route)
        for route in ("none", *routes):
            for status in REJECTED if route == "none" else (*REJECTED, *UNANSWERED):
                self.requests.labels(replica="none", route=route, status=status)
        self.requests.labels(replica="none", route="none", status="200")  # /v1/models
        # a request head too large, which only the HTTP server answers (no route reached)
        self.requests.labels(replica="none", route="none", status="431")
        for state in fleet:
            self._replica_added(state.id)
        fleet.listen(self._on_fleet_event)

    def _on_fleet_event(self, event: FleetEvent) -> None:
        if isinstance(event, ReplicaAdded):
            self._replica_added(event.replica)
        elif isinstance(event, ReplicaRemoved):
            self._replica_removed(event.replica)

    def _replica_added(self, replica: str) -> None:
        self._drop_departed()
        for route in self.routes:
            for status in ("200", "502"):
                self._child(self.requests, replica, route, status)
        for cause in RETRY_CAUSES:
            self._child(self.retries, replica, cause)
        for cause in CUT_CAUSES:
            self._child(self.cuts, replica, cause)
        self._child(self.upstream_ttfb, replica)

    def _replica_removed(self, replica: str) -> None:
        """Drop every child labelled with ``replica``, created up front or since."""
        self._departed.add(replica)
        self._drop_departed()

    def _drop_departed(self) -> None:
        """Drop the children of replicas that left: at their leaving, and those a request
        still under way there then brought back when it ended, at the fleet's next change
        (else each replica that ever left could keep a few series for good)."""
        for replica in self._departed:
            if self._fleet.get(replica) is not None:  # back in the fleet
                continue
            for metric, labels in self._children.pop(replica, {}):
                self._bound.pop((metric, labels), None)
                metric.remove(*labels)
            self._filed.add(replica)
        self._departed.clear()
        self._drop_filed()

    def _drop_filed(self) -> None:
        """With worker processes, take the series of replicas that left out of this
        worker's files too (``MetricFiles``), once they are a fifth of what the files
        hold: a rewrite costs the whole files, so one per departure cost a rollout of R
        replicas R times R replicas' series."""
        if self.files is None or not self._filed or len(self._filed) * 4 < len(self._fleet):
            return
        self.files.drop("replica", {r for r in self._filed if self._fleet.get(r) is None})
        self._filed.clear()

    def bound(self, metric: Any, *labels: str) -> Any:
        """``metric.labels(*labels)``, bound once."""
        child = self._bound.get((metric, labels))
        if child is None:
            child = self._bound[(metric, labels)] = metric.labels(*labels)
        return child

    def _child(self, metric: Any, *labels: str) -> Any:
        """``metric.labels(*labels)``, bound once and remembered under its replica (the
        first label)."""
        child = self._bound.get((metric, labels))
        if child is None:
            if labels[0] != "none":
                self._children.setdefault(labels[0], {})[(metric, labels)] = None
                if self._fleet.get(labels[0]) is None:
                    self._departed.add(labels[0])
            child = self.bound(metric, *labels)
        return child

    # -- the request path -----------------------------------------------------------------
    def request_done(self, replica: str, route: str, status: str) -> None:
        self._child(self.requests, replica, route, status).inc()

    async def requests_by_replica(self) -> dict[str, dict[str, int]]:
        """Requests each replica answered so far (any status), by route reason (``top``'s
        ``by_replica``)."""
        return (await self.top()).by_replica

    async def top(self) -> TopCounts:
        """Requests each replica answered so far (any status), by route reason, and the
        requests holding a place and waiting for one; with worker processes, every
        worker's (the summed figures ``/metrics`` serves: the places as last copied, at
        most ``MetricMirror.interval_s`` ago), read from their files on a thread
        (``page``: 84 ms for 8 workers of 100 replicas, at every ``kvgate top``
        refresh)."""
        admission = self._admission
        if self._summed is None:
            if admission is None:
                return TopCounts(_by_replica(self.requests.collect()), None, None)
            return TopCounts(_by_replica(self.requests.collect()), admission.in_flight,
                             admission.waiting,
                             busiest(admission.tenant_counts(), SHOWN_TENANTS))
        summed, current = self._summed, self._summed.current()
        own = admission.tenant_counts() if admission is not None else None
        board = self._board

        def read() -> TopCounts:
            counts = _top_counts(f for f in summed.among(current)
                                 if f.name == "kvgate_requests" or f.name in ADMISSION_GAUGES)
            if own is None or board is None:
                return counts
            return counts._replace(tenants=_box_tenants(own, board))

        return await asyncio.to_thread(read)

    def retried(self, replica: str, cause: str) -> None:
        self._child(self.retries, replica, cause).inc()

    def held_back(self, replica: str) -> None:
        """A request ``replica`` was ranked first for went elsewhere first: it held far
        more requests in flight than the fleet's median (``gateway.held_back``)."""
        self._child(self.held_backs, replica).inc()

    def short_context(self, replica: str) -> None:
        """A request ``replica`` was ranked first for went elsewhere first: the prompt
        clearly exceeds its context."""
        self._child(self.short_contexts, replica).inc()

    def cut(self, replica: str, cause: str) -> None:
        self._child(self.cuts, replica, cause).inc()

    def first_byte(self, replica: str, seconds: float) -> None:
        self._child(self.upstream_ttfb, replica).observe(seconds)

    def export(self, collector: Collector, per_worker: bool = False) -> None:
        """Serve ``collector`` from ``GET /metrics``: it reads live state (the fleet, a
        subscriber). With worker processes a collector of the box's state (the fleet's)
        joins the summed multiprocess figures as it is; one of a worker's own counts
        (``per_worker``) is summed over the workers through ``mirror``."""
        if per_worker and self.mirror is not None:
            self.mirror.add(collector)
            return
        self._live.append(collector)

    async def page(self) -> bytes:
        """``GET /metrics``' page, as ``exposed`` gives it. Only the collectors that read
        the event loop's state run on it; the rest (the counters' and histograms' values,
        which their locks guard; the worker processes' files) are read, and the page
        written, on a thread: with 100 replicas that took 26 ms, with 8 workers' files of
        them 107 ms, and routing waited meanwhile at every scrape."""
        live = _Collected([family for collector in self._live
                           for family in collector.collect()])
        rest = self.registry.collect if self._summed is None else \
            functools.partial(self._summed.among, self._summed.current())
        return await asyncio.to_thread(generate_latest, _Page([live], rest))

    def watch_worker_routes(self, source: WorkerRouteCounts) -> None:
        """Export the counts of the routes told between worker processes (each worker's,
        summed over the box)."""
        self.export(_WorkerRouteCollector(source), per_worker=True)

    def watch_discovery(self, sources: Sequence[DiscoveryCounts]) -> None:
        """Export the counts of the discovery sources."""
        self.export(_DiscoveryCollector(sources))  # the leader's, every worker's copy

    def watch_capture(self, source: CaptureCounts) -> None:
        """Export the counts of the capture log (this worker's, summed over workers)."""
        self.export(_CaptureCollector(source), per_worker=True)

    def watch_peers(self, source: PeerCounts) -> None:
        """Export the counts of the peer links (``gateway.peers``)."""
        self.export(_PeerCollector(source), per_worker=True)

    def watch_admission(self, admission: Admission) -> None:
        """Export the requests holding a place and waiting for one (each worker's, summed
        over the box), all tenants together."""
        self._admission = admission
        self.export(_AdmissionCollector(admission), per_worker=True)

    def watch_box_tenants(self, board: TenantBoard) -> None:
        """With worker processes, ``top`` adds up every worker's requests per tenant: this
        worker's own, and the others' as they last published them to ``board`` (at their
        last heartbeat, ``HEARTBEAT_S`` ago at most). Never on ``/metrics``."""
        self._board = board

    def watch_kv_events(self, source: KVEventCounts) -> None:
        """Export the counts of a KV event subscriber. Every worker reads every stream:
        with workers its counts are the box's largest worker's (one worker's alone went
        back when the next scrape found another, a reset to Prometheus), and the index's
        blocks this worker's."""
        if self.mirror is None:
            self.export(_KVEventCollector(source))
            return
        self.mirror.add(_KVEventCollector(source, blocks=False), same_events=True)
        self.export(_KVEventCollector(source, counts=False))
