"""The admin API: list, add and remove replicas; explain a routing decision; audit the
prompt layout of recent requests (``/admin/prefix-report``); a compact snapshot of the
fleet for ``kvgate top``; flush the replicas' prefix caches (``/flush_cache``, SGLang's
router's path: ``gateway.cache_flush``).

It is an app of its own (``create_admin_app``), served on the admin listener only
(``AdminConfig``), and only when a token is configured; every call needs
``Authorization: Bearer <token>``. A replica it adds must pass the config's URL rules and
the admin allowlist, and is never sent a client's ``Authorization`` header.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import time
from typing import Any
from urllib.parse import urlsplit

import orjson
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.cache_flush import flush_replicas
from gateway.capture import unpack
from gateway.client_auth import presented_bearer
from gateway.config import ReplicaConfig, endpoint_clash, held_endpoints
from gateway.data_parallel import group_of
from gateway.discovery.replica_checks import address_unfit
from gateway.errors import Arrival
from gateway.intake import read_timed_body, take_in
from gateway.layout_audit import AuditReport, audit
from gateway.membership import ADMIN, join_all, leave
from gateway.state import GatewayState
from kvwire.media_parts import shown
from kvwire.openai_schema import (
    BadRequest,
    NotFound,
    OpenAIError,
    ServiceUnavailable,
    Unauthorized,
)
from kvwire.request_edge import check_json_counts, parses_on_loop
from policies.config import ConfigError, from_mapping


class AdminOff(OpenAIError):
    status = 403
    type = "permission_error"
    kind = "admin_off"


def _authorize(request: Request) -> GatewayState:
    gw: GatewayState = request.app.state.gw
    token: str | None = request.app.state.admin_token
    if not token:
        raise AdminOff("the admin API is off: configure admin.token (or token_file, "
                       "token_env)", code="admin_off")
    # as client API keys are read, compared in constant time; the refusal says whether a
    # token came at all (the caller knows that already), never how the one sent differs
    presented = presented_bearer(request)
    if not hmac.compare_digest(presented.encode(), token.encode()):
        told = "the bearer token sent is not the admin token" if presented else \
            "no bearer token was sent (no Authorization header, another scheme, or none after it)"
        raise Unauthorized(f"{told}: admin endpoints need 'Authorization: Bearer <admin token>'",
                           code="invalid_admin_token")
    return gw


def _replica_json(gw: GatewayState, replica_id: str) -> dict[str, Any]:
    state = gw.fleet.get(replica_id)
    assert state is not None
    view = state.view(time.monotonic(), gw.fleet.calibration.ratio())
    capacity = state.kv_capacity()
    return {
        "id": view.id, "url": view.url, "source": state.source, "weight": view.weight,
        "healthy": view.healthy,
        "last_error": state.last_error, "queued_tokens": view.queued_tokens,
        "running": view.running, "waiting": view.waiting, "in_flight": view.in_flight,
        # what the last scrape's running and waiting held beyond this gateway's in flight
        "others_in_flight": view.others_in_flight,
        "kv_usage": view.kv_usage, "kv_capacity_tokens": view.kv_capacity_tokens,
        # where kv_capacity_tokens came from: scraped, configured or estimated (or null)
        "kv_capacity_source": capacity.source,
        "kv_capacity_replica_tokens": capacity.replica_tokens,
        "kv_capacity_estimate": gw.kv_capacity.describe(state.id),
        "token_hit_rate": view.token_hit_rate, "epoch": view.epoch,
        "models": list(state.models),
        "dialect": state.scraped.dialect if state.scraped else None,
        # its scrapes failed since: the load figures above are this gateway's own
        "scrape_stale": state.scraped.stale if state.scraped else None,
        "scrape_failures": state.scrape_failures,
        "pending_age_s": view.pending_age_s,
        # the mean seconds its requests that finished between its last two scrapes ran
        # (any sender's; vLLM's request_inference_time_seconds), null where none did
        "slot_hold_s": view.slot_hold_s,
        "prefill_tokens_per_s": view.prefill_tokens_per_s,
        "replica_tokens_per_gateway_token": gw.fleet.calibration.ratio(),
        # its own answers' ratio, by model: one far from the fleet's (the median of the
        # replicas') counts its tokens otherwise, or its usage lies
        "own_replica_tokens_per_gateway_token": gw.fleet.calibration.own_ratios(state.id),
    }


async def list_replicas(request: Request) -> Response:
    gw = _authorize(request)
    return JSONResponse({"replicas": [_replica_json(gw, s.id) for s in gw.fleet]})


async def add_replica(request: Request) -> Response:
    gw = _authorize(request)
    # within the body limits and uncompressed, as every body the gateway reads; a large
    # one (up to max_body_bytes) decoded and checked in a worker thread, as a served
    # request's is (``parses_on_loop``): 16 MiB of JSON held the event loop 0.1 s or more
    raw = await read_timed_body(request, gw, serve=False)
    config = _replica_config(raw) if parses_on_loop(raw) \
        else await asyncio.to_thread(_replica_config, raw)
    ranks = config.ranks()  # one member per data-parallel rank (gateway.data_parallel)
    for rank in ranks:
        _check_reachable(gw, rank)
    # an id of its ranks taken, or its own: by a replica of one rank, or of ranks (then
    # DELETE /admin/replicas/<id> would name two replicas)
    taken = next((r.id for r in ranks if gw.fleet.get(r.id) is not None), None) \
        or (config.id if gw.fleet.get(config.id) is not None or _ranks_of(gw, config.id)
            else None)
    if taken is not None:
        raise BadRequest(f"replica {taken!r} already exists", param="id",
                         code="duplicate_replica")
    # its KV event endpoints none of the fleet's (the config's check, on the live fleet);
    # nothing awaited from here until it joins, so no other add comes between
    clash = endpoint_clash(ranks, held_endpoints(s.config for s in gw.fleet))
    if clash is not None:
        raise BadRequest(clash, code="invalid_replica")  # (the message names the key)
    try:
        states = await join_all(gw, ranks, ADMIN, forward_auth=False)
    except ValueError as exc:  # no room: the fleet at its limit, or no slot left in the
        # workers' shared accounting (no rank joined)
        raise BadRequest(str(exc), param="id", code="replica_slots_full") from exc
    # a DELETE while its health was checked: what is left of it, if anything
    joined = [s.id for s in states if gw.fleet.get(s.id) is s]
    if not joined:
        raise NotFound(f"replica {config.id!r} was removed while it was being added",
                       code="replica_removed")
    if config.data_parallel_size == 1:
        return JSONResponse(_replica_json(gw, config.id), status_code=201)
    return JSONResponse({"id": config.id, "ranks": [_replica_json(gw, rid) for rid in joined]},
                        status_code=201)


_MESSAGE_CHARS = 1000  # of an error about an added replica's body


def _replica_config(raw: bytes) -> ReplicaConfig:
    """The replica a ``POST /admin/replicas`` body describes; BadRequest saying what is
    wrong with it. Touches nothing of the gateway's: it may run in a worker thread."""
    try:
        # orjson: no NaN or Infinity, and a nesting bound with an error of its own
        check_json_counts(raw)
        data = orjson.loads(raw)
        if not isinstance(data, dict):
            raise BadRequest(f"a replica is a JSON object, got {shown(data)}",
                             code="invalid_replica")
        if data.get("data_parallel_rank") is not None:
            raise BadRequest("'data_parallel_rank' is set by the gateway on each rank of a "
                             "replica; give the replica data_parallel_size instead",
                             param="data_parallel_rank", code="invalid_replica")
        for key in ("api_key_env", "api_key_file"):
            if data.get(key) is not None:
                # read from the gateway's own environment or disk and sent to the URL
                # given: an admin caller could have any secret of the gateway's sent away
                raise BadRequest(f"{key!r} is for replicas in the config file; a replica "
                                 "added here takes its key as api_key", param=key,
                                 code="invalid_replica")
        return from_mapping(ReplicaConfig, data, "replica")
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}", code="invalid_json") from exc
    except ConfigError as exc:
        message = str(exc)  # a replica's checks may show a value whole (megabytes of it)
        if len(message) > _MESSAGE_CHARS:
            message = f"{message[:_MESSAGE_CHARS]}... (cut short)"
        raise BadRequest(message, code="invalid_replica") from exc


def _ranks_of(gw: GatewayState, replica_id: str) -> list[str]:
    """The fleet ids of the data-parallel ranks of the replica ``replica_id``."""
    return [s.id for s in gw.fleet
            if s.config.data_parallel_rank is not None and group_of(s.id) == replica_id]


def _check_reachable(gw: GatewayState, config: ReplicaConfig) -> None:
    """The places an added replica makes the gateway connect to (its URL, its KV event
    endpoints) are all on hosts the admin API may name: else an admin caller could have
    the gateway open connections anywhere; and its URL's host is no address a replica
    cannot have (unspecified, broadcast, multicast: as discovery refuses them). A KV event
    endpoint that is not ``tcp://`` (``ipc://``: a path on the gateway's own machine) is for
    replicas in the config file."""
    # whatever the allow lists admit, as discovery refuses it
    for key in ("url", "kv_events", "kv_events_replay"):
        place = getattr(config, key)
        host = "" if place is None else urlsplit(place).hostname or ""
        try:
            unfit = address_unfit(ipaddress.ip_address(host))
        except ValueError:  # a name (or none): the allow lists' to judge
            continue
        if unfit is not None:
            raise BadRequest(f"replica {key} {place!r:.200}: {host} is {unfit}, never a "
                             "replica's address", param=key, code="invalid_replica")
    allows = gw.config.admin.allows
    if not allows(config.url):
        raise AdminOff(f"replica url {config.url!r}: its host is in neither "
                       "admin.allow_hosts nor admin.allow_networks", param="url",
                       code="replica_not_allowed")
    for key in ("kv_events", "kv_events_replay"):
        endpoint = getattr(config, key)
        if endpoint is None:
            continue
        if not _plain_tcp(endpoint):
            raise AdminOff(f"{key} {endpoint!r:.120}: a replica added here takes plain "
                           "tcp://host:port endpoints only (others, and ZeroMQ's "
                           "source;destination form, are for replicas in the config file)",
                           param=key, code="replica_not_allowed")
        if not allows(endpoint):
            raise AdminOff(f"{key} {endpoint!r:.120}: its host is in neither "
                           "admin.allow_hosts nor admin.allow_networks", param=key,
                           code="replica_not_allowed")


def _plain_tcp(endpoint: str) -> bool:
    """``tcp://host:port`` and nothing else: the host the check reads is then the one
    ZeroMQ connects to (in ``tcp://a:1;b:2`` it connects to b, from a)."""
    parts = urlsplit(endpoint)
    try:
        port = parts.port
    except ValueError:
        return False
    return parts.scheme == "tcp" and bool(parts.hostname) and port is not None \
        and not (parts.path or parts.query or parts.fragment or "@" in parts.netloc
                 or ";" in endpoint or "?" in endpoint or "#" in endpoint)


async def remove_replica(request: Request) -> Response:
    gw = _authorize(request)
    replica_id = request.path_params["replica_id"]
    if gw.fleet.get(replica_id) is not None:
        leave(gw, replica_id)
        return JSONResponse({"removed": replica_id})
    ranks = _ranks_of(gw, replica_id)  # a replica of several ranks: all of them
    if not ranks:
        raise NotFound(f"no replica {shown(replica_id, 80)}", code="replica_not_found")
    for rid in ranks:
        leave(gw, rid)
    return JSONResponse({"removed": replica_id, "ranks": ranks})


async def explain(request: Request) -> Response:
    """The decision the gateway would take for a request body, without sending it."""
    gw = _authorize(request)
    # the tenant to explain for is the tenant header's, from any admin caller (the admin
    # token is no client's key, and the caller is seldom one of trusted_proxies): else
    # every request was the anonymous tenant's, shown off its tenant's partition and
    # refused under require_tenant
    keyed = _explained_tenant(request, gw)
    parsed, _, tenant = await take_in(request, gw, None, keyed, named=True)
    routing = await gw.router.decide(parsed, tenant, gw.tenancy.allowed(tenant),
                                     explain=True)
    d = routing.decision
    return JSONResponse({
        "chosen": d.chosen, "ranked": list(d.ranked), "reason": d.reason,
        "matched_tokens": d.matched_tokens, "policy": gw.policy.name,
        "prompt_tokens": routing.request.prompt_tokens,
        "tokens_hashed": len(routing.request.tokens),
        "decision_ms": round(routing.seconds * 1000, 3),
        # token counts above and below are the gateway's; x this for the replicas'
        "replica_tokens_per_gateway_token": gw.fleet.calibration.ratio(parsed.model),
        # what the state deciding this request's model learned (never another model's)
        "policy_state": gw.policy.describe_for(routing.request),
        "scores": [{"replica": s.replica, "score": s.score,
                    "matched_tokens": s.matched_tokens, **({"terms": dict(s.terms)}
                                                           if s.terms else {})}
                   for s in d.scores],
    })


def _explained_tenant(request: Request, gw: GatewayState) -> str | None:
    header = gw.tenancy.config.header
    values = request.headers.getlist(header)
    if len(values) > 1:
        raise BadRequest(f"header {header!r} was sent {len(values)} times; send it once",
                         code="repeated_tenant")
    return values[0] if values and values[0] else None


async def prefix_report(request: Request) -> Response:
    """The prompt-layout audit (``kvgate audit``'s JSON) of the recent requests the gateway
    keeps (``prefix_report`` or ``capture`` on), run in a worker thread, one at a time."""
    gw = _authorize(request)
    recent = gw.capture.recent
    if recent is None:
        raise NotFound("the prefix report is off: set prefix_report.enabled (or "
                       "capture.path) in the gateway's config", code="prefix_report_off")
    lines = recent.snapshot()

    def report_of() -> AuditReport:
        return audit(unpack(lines), gw.router.tokenizer)

    async with request.app.state.report_lock:
        report = await asyncio.to_thread(report_of)
    body = report.as_json()
    log = gw.capture.log
    body["capture"] = {"recent_requests": len(lines), "recent_bytes": recent.bytes,
                       **({"written": log.written, "dropped": log.dropped,
                           "rotations": log.rotations} if log is not None else {})}
    return JSONResponse(body)


async def top(request: Request) -> Response:
    """A compact snapshot for ``kvgate top``: per replica its health, queue and the
    cumulative counters a client turns into rates over its own window (the replica's
    prefix-cache counters as last scraped, in the replica's tokens; requests the gateway
    routed there, by reason), and the gateway's own requests holding a place and waiting
    for one (``admission``), with those of its busiest tenants (``tenants``: tenant None
    for requests of no tenant; the rest summed in ``tenants_more``), which ``/metrics``
    never names."""
    gw = _authorize(request)
    counts = await gw.metrics.top()
    routed = counts.by_replica
    ratio = gw.fleet.calibration.ratio()
    now = time.monotonic()
    replicas = []
    for state in gw.fleet:
        s = state.scraped
        v = state.view(now, ratio)  # the box's load with worker processes
        reasons = routed.get(state.id, {})
        replicas.append({
            "id": state.id, "healthy": v.healthy, "last_error": state.last_error,
            "queued_tokens": v.queued_tokens, "in_flight": v.in_flight,
            "running": v.running, "waiting": v.waiting, "kv_usage": v.kv_usage,
            "hit_tokens": s.hit_tokens if s else None,
            "query_tokens": s.query_tokens if s else None,
            "token_hit_rate": v.token_hit_rate,
            "requests": sum(reasons.values()), "reasons": reasons,
        })
    return JSONResponse({"policy": gw.policy.name,
                         "hit_rate_window_s": gw.config.scrape.hit_rate_window_s,
                         "scrape_interval_s": gw.config.scrape.interval_s,
                         "admission": {"in_flight": counts.in_flight,
                                       "waiting": counts.waiting,
                                       **(counts.tenants.as_json()
                                          if counts.tenants is not None else {})},
                         "replicas": replicas})


async def flush_cache(request: Request) -> Response:
    """Flush every healthy replica's prefix cache, and forget what the policy believed
    they held (``gateway.cache_flush``)."""
    gw = _authorize(request)
    if gw.monitor is None:  # (the gateway's lifespan not started, or ended)
        raise ServiceUnavailable("the gateway is not serving", code="not_serving")
    summary = await flush_replicas(gw, gw.monitor.session, gw.monitor.tls)
    return JSONResponse(summary.as_json(), status_code=summary.status_code)


def routes() -> list[Route]:
    return [
        Route("/admin/replicas", list_replicas, methods=["GET"]),
        Route("/admin/replicas", add_replica, methods=["POST"]),
        Route("/admin/replicas/{replica_id}", remove_replica, methods=["DELETE"]),
        Route("/admin/explain", explain, methods=["POST"]),
        Route("/admin/prefix-report", prefix_report, methods=["GET"]),
        Route("/admin/top", top, methods=["GET"]),
        Route("/flush_cache", flush_cache, methods=["POST"]),
    ]


def create_admin_app(gw: GatewayState, token: str | None = None) -> Starlette:
    """The admin API over ``gw`` (the main app's state, whose lifespan runs the rest),
    with ``token`` (default: the configured one, read now). A call it refuses is counted
    as every refused request is (``kvgate_requests_total``, the access log)."""
    boundary = gw.boundary()
    app = Starlette(routes=routes(), middleware=[Middleware(Arrival)],
                    exception_handlers=boundary.handlers())
    app.router.redirect_slashes = False  # a path with a trailing / is a 404, not a redirect
    app.state.gw = gw
    app.state.admin_token = token if token is not None else gw.config.admin.resolved_token()
    app.state.report_lock = asyncio.Lock()
    return app
