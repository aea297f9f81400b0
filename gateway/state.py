"""Everything one gateway holds: its config, the fleet, the policy, metrics and router, and
the long-lived parts its lifespan opens (proxy, monitor)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from starlette.requests import Request

from gateway.access_log import AccessLog
from gateway.admission import Admission
from gateway.box_feed import BoxFeed
from gateway.capture import Capture
from gateway.client_auth import ClientAuth
from gateway.config import GatewayConfig
from gateway.errors import CountingBoundary, counted
from gateway.fleet import Fleet
from gateway.fleet_events import CacheFlushed, FleetEvent, FleetListener
from gateway.forwarding import request_id_header
from gateway.kv_capacity_estimate import CapacityCollector, CapacityEstimator
from gateway.metrics import GatewayMetrics
from gateway.monitor import Monitor
from gateway.networks import Networks
from gateway.peer_wire import Answered
from gateway.peers import Peers
from gateway.proxy import Proxy
from gateway.responses_request import RESPONSE_HOMES, ResponseHome
from gateway.routing import Router
from gateway.shared_load import SharedLoad
from gateway.tenancy import Tenancy, record_home
from gateway.tracing import NO_TRACING, Tracing, build_tracing
from gateway.worker_routes import WorkerRoutes
from kvwire.bounded_memo import BoundedMemo
from kvwire.tokenizer import PromptTokenizer, load_tokenizer
from policies.base import Policy, ReplicaRemoved, ReplicaReset
from policies.per_model import PerModel
from policies.registry import build_policy

if TYPE_CHECKING:
    from gateway.membership import SourceBook


@dataclass
class GatewayState:
    config: GatewayConfig
    fleet: Fleet
    policy: Policy
    metrics: GatewayMetrics
    router: Router
    admission: Admission
    trusted_proxies: Networks
    tenancy: Tenancy
    auth: ClientAuth
    access: AccessLog
    tracing: Tracing
    capture: Capture
    kv_capacity: CapacityEstimator
    proxy: Proxy | None = None
    draining: bool = False  # a shutdown began: /ready answers 503
    started: int = field(default_factory=lambda: int(time.time()))  # /v1/models' created

    def stop_relays(self) -> int:
        """The shutdown's time is up: cut the answers still being relayed (``Proxy``)."""
        return 0 if self.proxy is None else self.proxy.stop_relays()

    def refused(self, request: Request, route: str, status: str, arrived: float,
                tenant: str | None = None, replica: str = "none",
                model: str | None = None) -> None:
        """``ended`` for a request the gateway answered itself (an error before or instead
        of a replica's answer, or ``/v1/models``): its line has the id its answer carries
        and its duration; ``replica`` and ``model`` those of a request whose client left
        (499) while a replica had it. The request is marked counted (``errors.counted``):
        the error boundary counts it no second time."""
        counted(request)
        self.ended(route, status, replica,
                   request_id=request_id_header(request)["x-request-id"], tenant=tenant,
                   model=model, duration_s=time.perf_counter() - arrived)

    def boundary(self) -> CountingBoundary:
        """The error boundary of the gateway's apps (the main one, the admin API): each
        error answer counted by kind, and as a request no handler counted."""
        return CountingBoundary(
            lambda kind: self.metrics.errors.labels(kind=kind).inc(), request_id_header,
            lambda request, status, arrived: self.refused(request, "none", status, arrived))

    def refused_by_server(self, status: str) -> None:
        """``ended`` for an answer the HTTP server wrote itself, before any handler:
        malformed HTTP (400), a head too large (431) or too slow (408), a transfer coding
        it does not decode (501), too many pipelined requests (429) or connections
        (503)."""
        self.ended("none", status)

    def ended(self, route: str, status: str, replica: str = "none", **access: Any) -> None:
        """One request ended (answered by ``replica``, or refused before any): its one
        ``requests`` sample and its access-log line (``access``: the line's other fields)."""
        self.metrics.request_done(replica, route, status)
        self.access.write(route=route, status=status,
                          replica=None if replica == "none" else replica, **access)

    def keep_told(self, told: Answered, from_peer: bool = False) -> None:
        """Keep a stored response's replica and tenant that another worker of the box or
        (``from_peer``) a peer copy saw answered, by the rule of this copy's own answers
        (``tenancy.record_home``): one held as another tenant's stays so, for the teller
        may never have learned it. A peer's kept is told to the box's other workers."""
        if record_home(self.response_homes, told.response,
                       ResponseHome(told.replica, told.tenant), told=True) \
                and from_peer and self.worker_routes is not None:
            self.worker_routes.answered(told.response, told.replica, told.tenant)
    monitor: Monitor | None = None
    worker: int | None = None  # this worker's index, with worker processes
    box: BoxFeed | None = None  # ... and its part in the fleet snapshot (box_feed)
    # ... and its event loop's heartbeat (``gateway.workers.Heartbeats``), beaten every
    # ``periodic.HEARTBEAT_S`` from the lifespan: a stuck loop stops beating
    heartbeat: Callable[[], None] | None = None
    peers: Peers | None = None  # the other gateway copies (peers in the config)
    # the routes this worker and the box's other workers tell each other (--workers N)
    worker_routes: WorkerRoutes | None = None
    # which replica answered each recent response (Responses API), and for which tenant:
    # this process's own
    response_homes: BoundedMemo[str, ResponseHome] = field(
        default_factory=lambda: BoundedMemo(RESPONSE_HOMES))
    # what ``gateway.membership.reconcile`` last made of each discovery source's set
    source_books: dict[str, SourceBook] = field(default_factory=dict)


def policy_listener(policy: Policy) -> FleetListener:
    """Tells ``policy`` of replicas that left or restarted, and of caches flushed (as a
    restart: what the replica held is gone)."""

    def listener(event: FleetEvent) -> None:
        if isinstance(event, ReplicaRemoved | ReplicaReset):
            policy.observe(event)
        elif isinstance(event, CacheFlushed):
            policy.observe(ReplicaReset(event.replica, cache_only=True))

    return listener


def build_state(config: GatewayConfig, tokenizer: PromptTokenizer | None = None,
                policy: Policy | None = None, tracing: Tracing | None = None,
                shared: SharedLoad | None = None) -> GatewayState:
    """``tracing``: where request traces go (default: as ``config.tracing`` says);
    ``shared``: the box's accounting, for a worker process (``gateway.workers``)."""
    fleet = Fleet(config.fleet_replicas(), config.scrape.hit_rate_window_s, shared)
    if policy is None:  # one state per model: a decision sees its model's replicas only
        policy = PerModel(build_policy(config.policy, where="policy"),
                          lambda: build_policy(config.policy, where="policy"),
                          # before any replica's model list is known, every name counts as
                          # listed (its own state from the first request, as without lists)
                          listed=lambda model: fleet.lists(model) or not fleet.models_known())
    fleet.listen(policy_listener(policy))
    tokenizer = tokenizer or load_tokenizer(config.tokenizer, config.tokenizer_memo)
    router = Router(policy, tokenizer, fleet, config.tokenizer_concurrency)
    trusted = Networks(config.trusted_proxies)
    metrics = GatewayMetrics(fleet, policy.reasons)
    metrics.export(CapacityCollector(fleet))
    gw = GatewayState(config, fleet, policy, metrics, router, Admission(config.limits),
                      trusted, Tenancy(config.tenancy, trusted),
                      ClientAuth(config.auth.api_keys),
                      AccessLog(config.access_log, metrics.access_dropped.inc),
                      tracing or build_tracing(config.tracing),
                      # with worker processes, worker 0 serves the prefix report
                      Capture(config.capture, config.prefix_report,
                              serves_report=shared is None or shared.worker == 0),
                      CapacityEstimator(fleet, config.scrape.kv_capacity_estimate))
    metrics.watch_admission(gw.admission)
    if config.peers.on:
        # a box's workers share one instance id (a link from one of them to its own box
        # is found as its own whichever worker answers) and the peers port
        gw.peers = Peers(config.peers, fleet, policy, shared.box_id if shared else None)
        homes = gw.response_homes
        # (with worker processes, told on to the box's other workers)
        gw.peers.on_answered = lambda told: gw.keep_told(told, from_peer=True)
        gw.peers.known_answers = lambda: [Answered(response, home.replica, home.tenant)
                                          for response, home in homes.items()]
        fleet.outbox = gw.peers
        metrics.watch_peers(gw.peers.counts)
    if gw.tracing is not NO_TRACING:  # the spans its exporter lost, summed over workers
        metrics.export(gw.tracing, per_worker=True)
    return gw
