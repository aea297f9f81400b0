"""The gateway's Starlette application: OpenAI endpoints, health, metrics (the admin API
is an app of its own, ``gateway.admin.create_admin_app``, on its own listener).

Long-lived parts (the upstream HTTP clients, the monitor loops, the tokenizer pool) are
opened in the lifespan and closed on shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import logging
import math
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import orjson
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.admin import AdminOff
from gateway.admission import Slot, released_on_error
from gateway.config import GatewayConfig
from gateway.discovery.runner import Discovery, build_source
from gateway.errors import ARRIVED, CountingBoundary, NoReplicaAvailable, counted
from gateway.fleet import ModelInfo, ReplicaState
from gateway.forwarding import request_id_header, request_id_of, upstream_headers, upstream_query
from gateway.generate_request import PATH as GENERATE_PATH
from gateway.generate_request import counted_alike
from gateway.held_back import held_back
from gateway.intake import Intake, read_timed_body, some_models, take_in, take_place
from gateway.kv_event_subscriber import KVEventSubscriber
from gateway.monitor import Monitor
from gateway.passthrough import PATHS as PASSTHROUGH_PATHS
from gateway.passthrough import passthrough
from gateway.periodic import HEARTBEAT_S, every, stop_tasks
from gateway.proxy import Proxy, UpstreamStream
from gateway.relay_response import relay
from gateway.request_parse import Endpoint, ParsedRequest, generates, request_object
from gateway.resident_requests import Resident, prompt_head_key
from gateway.responses_request import PATH as RESPONSES_PATH
from gateway.responses_request import ResponseHome, response_id, response_not_found
from gateway.routing import Routing, work_tokens
from gateway.state import GatewayState, build_state
from gateway.stored_responses import home_unavailable, stored_response
from gateway.tenancy import record_home
from gateway.tracing import RequestTrace, Tracing
from gateway.upstream_http import client_for
from kvwire.media_parts import carries_media, shown
from kvwire.openai_schema import (
    MODEL_SHOWN_CHARS,
    BadRequest,
    NotFound,
    OpenAIError,
    ServiceUnavailable,
    TooManyRequests,
)
from kvwire.request_edge import parses_on_loop
from policies.base import Finished, Routed, RouteRequest, Unrouted

log = logging.getLogger("kvgate.gateway")
# seconds a stopping gateway waits for its last spans to be exported
TRACING_CLOSE_S = 3.0


async def close_tracing(tracing: Tracing, wait_s: float = TRACING_CLOSE_S) -> None:
    """Export the spans left and stop, on a thread of its own, waiting ``wait_s`` at most:
    on the event loop, a collector that accepts connections and never answers held a
    stopping gateway for its exporter's timeout (10 s), past what the drain allows."""
    done = threading.Event()

    def close() -> None:
        try:
            tracing.close()
        finally:
            done.set()

    threading.Thread(target=close, name="kvgate-tracing-close", daemon=True).start()
    if not await asyncio.to_thread(done.wait, wait_s):
        log.warning("tracing: the spans not exported %g s after stopping are dropped", wait_s)

try:
    _VERSION = importlib.metadata.version("kvgate")
except importlib.metadata.PackageNotFoundError:  # run from a source tree
    _VERSION = "unknown"


# the path of each routed endpoint (``/invocations`` picks an OpenAI one by its body;
# ``/generate`` is SGLang's native one)
_PATHS: dict[Endpoint, str] = {"completions": "/v1/completions",
                               "chat": "/v1/chat/completions",
                               "generate": GENERATE_PATH,
                               "responses": RESPONSES_PATH}
# the body's own request id field on each (vLLM's; SGLang's ``rid``)
_BODY_ID: dict[Endpoint, str] = {"completions": "request_id", "chat": "request_id",
                                 "generate": "rid", "responses": "request_id"}


async def _proxy(request: Request, endpoint: Endpoint | None, path: str,
                 body: dict[str, Any] | None = None) -> Response:
    """Admit, route and relay one request; every way out counts one ``requests`` sample.
    ``endpoint`` None (``/invocations``): chat or completions as its body says (``body``,
    already decoded there)."""
    gw: GatewayState = request.app.state.gw
    arrived = time.perf_counter()
    trace = gw.tracing.start(request.headers, path)
    route = "none"
    tenant = None
    model: str | None = None  # the request's model, once routed
    # the replicas the request was sent to, less those that refused it before taking it
    # (``_open``), the last one last
    holders: list[str] = []

    def refused(status: str) -> None:
        if status == "499" and holders:
            # the client left while its replica had the request: counted at that replica,
            # as a client that leaves mid-answer is (none: it left before any had it)
            gw.refused(request, route, status, arrived, tenant, holders[-1], model)
        else:
            gw.refused(request, route, status, arrived, tenant)

    def sent(replica: str, taken: bool = True) -> None:
        if taken:
            holders.append(replica)
        elif replica in holders:  # refused before taking the prompt: it never had it
            holders.remove(replica)

    try:
        tenant = keyed = gw.auth.tenant_of(request) if gw.auth.on else None
        query = upstream_query(request)
        # the body before a place: a client that sends a head and no body holds no place,
        # only the bytes it sent (``Admission.bodies``), for at most ``body_timeout_s``
        intake = await take_in(request, gw, endpoint, keyed, body=body)
        tenant = intake.tenant
        slot = await take_place(request, gw, tenant)
    except OpenAIError as exc:
        refused(str(exc.status))
        trace.failed(exc)
        raise
    except Exception as exc:  # a fault of the gateway's own: answered 500 (ErrorBoundary)
        refused("500")
        trace.failed(exc)
        raise
    with released_on_error(slot, refused), trace.guard():
        gw.capture.observe(intake.parsed, intake.tenant, len(intake.raw))
        routing = await gw.router.decide(intake.parsed, intake.tenant,
                                         gw.tenancy.allowed(intake.tenant), trace)
        gw.metrics.decision_seconds.observe(routing.seconds)
        gw.metrics.built_on[routing.pooled].inc()
        route = routing.decision.reason
        model = routing.request.model
        forwarded = upstream_headers(request, gw.trusted_proxies,
                                     (gw.tenancy.config.header, intake.tenant))
        request_id = request_id_of(request, forwarded, routing.request.request_id,
                                   intake.parsed.body.get(_BODY_ID[intake.parsed.endpoint]))
        trace.upstream(forwarded)
        upstream = _PATHS[intake.parsed.endpoint] if endpoint is None else path
        return await relay(request, _open(gw, routing, intake, upstream, slot, forwarded,
                                          request_id, arrived, trace, sent, query),
                           route, request_id, gw.worker)


async def _open(gw: GatewayState, routing: Routing, intake: Intake, path: str,
                slot: Slot, headers: dict[str, str], request_id: str,
                arrived: float, trace: RequestTrace,
                sent: Callable[[str, bool], None], query: str = "") -> UpstreamStream:
    """The first ranked replica's answer (under the per-replica queue bound), with the
    policy told where the request went and how it ended (``arrived``: the request's
    ``perf_counter`` at arrival), and ``sent`` each replica it is sent to (True), and
    each that refused it before taking the prompt (False)."""
    assert gw.proxy is not None
    route_req, decision = routing.request, routing.decision
    _refuse_taken_id(gw, intake, request_id)
    stored = _stored_at(gw, intake.parsed, intake.tenant, routing)
    if stored is not None:  # only that replica can continue the response it stored: a
        # full queue there makes the request wait, not fail at another replica for sure
        ranked = (stored, *(r for r in decision.ranked if r != stored))
    else:
        ranked = _under_queue_bound(gw, decision.ranked)
        margin = gw.config.limits.held_back_margin
        if margin is not None:
            ranked, moved = held_back(ranked, routing.views, margin)
            if moved and moved[0] == decision.ranked[0]:
                gw.metrics.held_back(moved[0])
        ranked, short = _short_contexts_last(gw, ranked, route_req, gw.proxy.max_attempts)
        if short and short[0] == decision.ranked[0]:
            gw.metrics.short_context(short[0])
    # a batch is routed by its first prompt; its work is counted as that many of it, and
    # its summed usage teaches no calibration (it is not the first prompt's)
    batch = intake.parsed.num_prompts
    # a stream of one choice is judged by whether a finish reason came anywhere in it
    # before its [DONE]; several, choice by choice
    n = intake.parsed.body.get("n")
    several_choices = batch > 1 or n not in (None, 1)
    # ... and an answer with no choice at all carries nothing where it asks several of an
    # ``n`` that is a positive integer (one of 0, or of another type, the replica may
    # refuse or answer with none; one choice, ``n`` absent or equal to 1, is judged so
    # whatever its type)
    asks_choices = n is None or (type(n) is int and n >= 1)
    # the replica's prompt tokens count what this gateway's do: not a response's stored
    # history (continued on the replica), nor images and audio (the gateway counts their
    # placeholders), nor SGLang's n samples of one prompt (each counted whole); such an
    # answer teaches the token calibration nothing
    comparable = not _continues(intake.parsed) and not carries_media(intake.parsed.messages) \
        and (intake.parsed.endpoint != "generate" or counted_alike(intake.parsed.body))
    # what the answer's end needs of the request: never ``intake`` itself, whose parsed
    # body (some 24 times its bytes) the stream would hold until it ends
    tenant = intake.tenant

    held: list[Resident] = []  # the answer, while it streams, in the KV capacity estimate
    last_sent: str | None = None  # the replica last sent the request

    def on_sent(replica: str) -> None:
        nonlocal last_sent
        last_sent = replica
        sent(replica, True)
        gw.policy.observe(Routed(route_req, replica, routing.views))
        if gw.peers is not None:
            gw.peers.routed(route_req, replica)
        if gw.worker_routes is not None:
            gw.worker_routes.routed(route_req, replica)

    def on_unsent(replica: str) -> None:
        # the replica refused the prompt before taking it; the route told to peers and
        # workers stands (they have no way to take one back)
        sent(replica, False)
        gw.policy.observe(Unrouted(route_req, replica))

    def on_done(stream: UpstreamStream, ok: bool) -> None:
        slot.release()
        trace.answered(stream)
        for entry in held:
            gw.kv_capacity.resident.ended(entry)
        usage = stream.usage()
        cached = None
        if usage is not None:
            gw.metrics.bound(gw.metrics.prompt_tokens, decision.reason).inc(
                usage.prompt_tokens)
            gw.metrics.bound(gw.metrics.cached_tokens, decision.reason).inc(
                usage.cached_tokens)
            if batch == 1:
                cached = gw.fleet.answered(stream.replica, route_req.model,
                                           route_req.prompt_tokens, usage.prompt_tokens,
                                           usage.cached_tokens, teach=comparable)
        # a stream's first byte comes with its first token; a whole body's comes after
        # the last one, so it says nothing of time to first token
        ttft = stream.first_byte_s if stream.stream else None
        gw.policy.observe(Finished(route_req, stream.replica, ok, cached, ttft,
                                   stream.duration_s,
                                   cached_told=usage is not None and usage.cached_told))
        # the client's times, from its request's arrival: a retried request waited for
        # every try (the policy's are the replica's, from the last try's send)
        gw.ended(decision.reason, stream.outcome, stream.replica, request_id=request_id,
                 tenant=tenant, model=route_req.model,
                 prompt_tokens=usage[0] if usage else None,
                 cached_tokens=usage[1] if usage else None,
                 ttft_s=None if ttft is None else stream.first_byte_at - arrived,
                 duration_s=None if stream.duration_s is None
                 else time.perf_counter() - arrived)
        if ok:
            gw.metrics.answers.relayed(route_req.model, decision.reason, stream, arrived,
                                       usage)

    try:
        stream = await gw.proxy.open(
            ranked, path, intake.raw, headers,
            lambda replica: batch * work_tokens(route_req, decision, replica), on_sent,
            on_done, intake.parsed.stream, _continues(intake.parsed), on_unsent=on_unsent,
            several_choices=several_choices, asks_choices=asks_choices, query=query)
    except BaseException as exc:
        if last_sent is not None:
            # no replica answered (every try failed, or the client left): the request is
            # over, and its tries that may have reached their replica (timed out, cut,
            # cancelled) stand, those refused being taken back already. Not ok, it teaches
            # no pace or slot hold
            gw.policy.observe(Finished(route_req, last_sent, ok=False))
        if isinstance(exc, NotFound) and exc.param == "previous_response_id":
            # no replica stores it: answered as another tenant's response is, naming no
            # replica (the replicas asked are for the operator's log)
            log.debug("%s", exc.message)
            raise response_not_found(intake.parsed.body["previous_response_id"]) from None
        raise
    try:
        if intake.parsed.endpoint == "responses" and stream.status < 400:
            answered = response_id(stream.first_chunk)
            if answered is not None and record_home(
                    gw.response_homes, answered, ResponseHome(stream.replica, tenant)):
                if gw.worker_routes is not None:  # the box's other workers refuse it too
                    gw.worker_routes.answered(answered, stream.replica, tenant)
                if gw.peers is not None:  # and the other gateway copies
                    gw.peers.answered(answered, stream.replica, tenant)
        if stream.stream:
            open_now = stream.duration_s is None and gw.kv_capacity.on
            if open_now or not _asks_usage(intake.parsed):
                stream.count_events()  # its output tokens (so far) are its content chunks
            if open_now:  # the replica holds its prompt while it streams
                held.append(gw.kv_capacity.resident.started(
                    stream.replica, batch * route_req.prompt_tokens,
                    prompt_head_key(intake.parsed), stream.content_chunks))
    except BaseException:
        # no response will relay (and close) it: its place, connection and pending
        # tokens would be held for good
        stream.close(ok=False)
        raise
    return stream


def _continues(parsed: ParsedRequest) -> bool:
    """A Responses request that continues a stored response (``previous_response_id``):
    only the replica that stores it can serve it."""
    return parsed.endpoint == "responses" \
        and isinstance(parsed.body.get("previous_response_id"), str)


def _stored_at(gw: GatewayState, parsed: ParsedRequest, tenant: str | None,
               routing: Routing) -> str | None:
    """The replica that answered the response a Responses request of ``tenant`` continues
    (``previous_response_id``), when this gateway process saw it answer and it may serve
    the request (else the replicas are asked in turn: ``Proxy.open``'s
    ``stored_elsewhere``, and each holds a continuation to the ``cache_salt`` its
    response was made under). NotFound, with the body an id no replica stores gets, when
    it answered another tenant, with or without ``tenancy.isolate`` (without it no salt
    reaches the replicas: only the process that saw the response answered refuses it).
    ``home_unavailable`` (a retryable 503) while that replica is out of routing
    (ejected, not yet readmitted): no other replica stores the response, so asking them
    could only end in a 404 the client would not retry, the conversation lost over a
    blip. A replica that left the fleet, or that no longer serves the request's model or
    tenant, is passed over: the others are asked in turn."""
    if not _continues(parsed):
        return None
    previous = parsed.body["previous_response_id"]
    home = gw.response_homes.get(previous, None)
    if home is None:
        return None
    if home.tenant != tenant:  # never sent on: a replica may not tell tenants apart
        raise response_not_found(previous)
    if home.replica in routing.decision.ranked:
        return home.replica
    state = gw.fleet.get(home.replica)
    if state is None or not any(view.id == home.replica for view in routing.views):
        return None
    if state.healthy:  # routable, though the policy ranked it not: still the only one
        return home.replica
    raise home_unavailable(gw, previous, home.replica, state.ejected_until)


def _refuse_taken_id(gw: GatewayState, intake: Intake, request_id: str) -> None:
    """BadRequest for a Responses request whose id (``request_id``, sent as its
    ``X-Request-Id``, or its body's ``request_id``) is a stored response of another
    tenant: a replica that names a response after it (vLLM does) would replace that
    tenant's stored response with this one, the other tenant's next turn continuing it."""
    if intake.parsed.endpoint != "responses":
        return
    in_body = intake.parsed.body.get("request_id")
    names = (request_id, in_body) if isinstance(in_body, str) and in_body != request_id \
        else (request_id,)
    for name in names:
        home = gw.response_homes.get(name, None)
        if home is not None and home.tenant != intake.tenant:
            log.debug("refused a request whose id %s is another tenant's stored response",
                      shown(name))
            raise BadRequest(f"request id {shown(name)} (the X-Request-Id header or the "
                             "body's request_id) names a stored response this client may "
                             "not replace: send another", param="request_id",
                             code="request_id_in_use")


def _asks_usage(parsed: ParsedRequest) -> bool:
    """The stream ends with its usage (its output tokens need not be counted): every
    ``/generate`` event carries its counts, and a response's last event its usage."""
    if parsed.endpoint in ("generate", "responses"):
        return True
    options = parsed.body.get("stream_options")
    return isinstance(options, dict) and options.get("include_usage") is True


def _under_queue_bound(gw: GatewayState, ranked: tuple[str, ...]) -> tuple[str, ...]:
    """``ranked`` less the replicas whose queue reached ``max_queued_tokens_per_replica``;
    TooManyRequests when that leaves none."""
    bound = gw.config.limits.max_queued_tokens_per_replica
    if bound is None:
        return ranked
    ratio = gw.fleet.calibration.ratio()
    queues = {rid: state.queued_tokens(ratio) for rid in ranked
              if (state := gw.fleet.get(rid)) is not None}
    kept = tuple(rid for rid in ranked if queues.get(rid, 0) < bound)
    if kept:
        return kept
    # until the shortest queue drains below the bound, at its replica's prefill rate
    rid, shortest = min(queues.items(), key=lambda item: item[1], default=("", bound))
    state = gw.fleet.get(rid)
    rate = state.hits.prefill_per_s() if state is not None else None
    after = max(1, math.ceil((shortest - bound + 1) * ratio / rate)) if rate else 1
    raise TooManyRequests(
        f"every replica has {bound} or more prompt tokens queued; retry after {after} s",
        code="replicas_overloaded", headers={"Retry-After": str(after)})


# a prompt's estimated tokens over a replica's context by this factor clearly exceed it (a
# length estimate from text, or a calibration still learning, may be off by that much)
CONTEXT_MARGIN = 1.25


def _short_contexts_last(gw: GatewayState, ranked: tuple[str, ...], request: RouteRequest,
                         tries: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``ranked`` with the replicas whose context the prompt clearly exceeds moved after
    the others (in their order), and those moved: a replica whose ``max_model_len`` (its
    ``/v1/models``' for the model, or for the adapter's base model) is under the prompt's
    tokens in the replica's own (the gateway's estimate times the token calibration's
    ratio) divided by ``CONTEXT_MARGIN``, the estimate's error allowed for. Ranked
    replicas are looked at until ``tries`` that may hold the prompt are found (the proxy
    tries no more); where none is, ``ranked`` (the replica's own refusal is the
    answer)."""
    fleet = gw.fleet
    needed = request.prompt_tokens * fleet.calibration.ratio(request.model) / CONTEXT_MARGIN
    fits: list[str] = []
    short: list[str] = []
    for rid in ranked:
        limit = _context_of(fleet.get(rid), request.model, request.base_model)
        if limit is not None and needed > limit:
            short.append(rid)
        else:
            fits.append(rid)
            if len(fits) == tries:
                break
    if not short or not fits:
        return ranked, ()
    looked = len(fits) + len(short)
    return (*fits, *ranked[looked:], *short), tuple(short)


def _context_of(state: ReplicaState | None, model: str | None, base: str | None
                ) -> int | None:
    """The ``max_model_len`` ``state``'s ``/v1/models`` gave ``model`` (or, where it gave
    that none, its ``base``); None where it told none."""
    if state is None or model is None:
        return None
    info = state.model_info.get(model)
    if (info is None or info.max_model_len is None) and base is not None:
        info = state.model_info.get(base)
    return None if info is None else info.max_model_len


async def completions(request: Request) -> Response:
    return await _proxy(request, "completions", _PATHS["completions"])


async def chat_completions(request: Request) -> Response:
    return await _proxy(request, "chat", _PATHS["chat"])


async def generate(request: Request) -> Response:
    return await _proxy(request, "generate", _PATHS["generate"])


async def responses(request: Request) -> Response:
    return await _proxy(request, "responses", _PATHS["responses"])


async def invocations(request: Request) -> Response:
    """SageMaker's (and vLLM's) one inference path: a chat when the body has
    ``messages``, a completion when it has ``prompt`` (or ``prompt_embeds``), each routed
    and sent to the replica's OpenAI path for it; any other body (embeddings, rerank,
    score, classify, pooling: vLLM tells them by the model's task) goes, as the other
    pass-through endpoints do, to the replica's own ``/invocations``."""
    gw: GatewayState = request.app.state.gw
    # a refusal here is counted where it is answered (``CountingBoundary``)
    # a key before the body, as every /v1 route asks it
    tenant = gw.auth.tenant_of(request) if gw.auth.on else gw.tenancy.tenant_of(request)
    # read within the limits (refused once read when its tenant finds no place), and
    # kept on the request for the handler that serves it
    raw = await read_timed_body(request, gw, tenant=tenant)
    # decoded once, for the route that serves it too; a large body on a thread (16 MiB of
    # JSON held the event loop a second)
    try:
        body = request_object(raw) if parses_on_loop(raw) \
            else await asyncio.to_thread(request_object, raw)
    except BadRequest:  # its error is a chat's or a completion's
        return await _proxy(request, None, "/invocations")
    if generates(body):
        return await _proxy(request, None, "/invocations", body)
    return await passthrough(request, body)


async def version(request: Request) -> Response:
    return JSONResponse({"version": _VERSION}, headers=request_id_header(request))


async def models(request: Request) -> Response:
    """The models a client may use; counted as every /v1 request is, answered or refused
    (a refusal where it is answered: ``CountingBoundary``)."""
    gw: GatewayState = request.app.state.gw
    # every /v1 route needs a client's key when keys are configured; a tenant's list
    # names only the models of the replicas it may use (its partition)
    tenant = gw.auth.tenant_of(request) if gw.auth.on else gw.tenancy.tenant_of(request)
    cards = gw.fleet.advertised(gw.tenancy.allowed(tenant))
    return _answered(gw, request, tenant, {"object": "list", "data": [
        _model_card(name, cards[name], gw.started) for name in sorted(cards)]})


async def model(request: Request) -> Response:
    """One model of ``GET /v1/models`` (the openai client's ``models.retrieve``), as the
    list shows it to the client's tenant; a 404 ``model_not_found`` naming it where the
    list holds no such model (a name of another tenant's partition too)."""
    gw: GatewayState = request.app.state.gw
    tenant = gw.auth.tenant_of(request) if gw.auth.on else gw.tenancy.tenant_of(request)
    name = request.path_params["model"]
    info = gw.fleet.advertised(gw.tenancy.allowed(tenant)).get(name) if name else None
    if info is None:
        raise NotFound(f"The model {shown(name, MODEL_SHOWN_CHARS)} does not exist."
                       if name else "GET /v1/models/{model} names no model (/v1/models "
                       "lists them)", param="model", code="model_not_found")
    return _answered(gw, request, tenant, _model_card(name, info, gw.started))


async def get_model_info(request: Request) -> Response:
    """SGLang's ``GET /get_model_info`` (its frontend's ``RuntimeEndpoint`` reads
    ``model_path`` when it connects, to choose a chat template): the base model the fleet
    serves, as ``/v1/models`` shows it to the client's tenant, where it was loaded from (the
    listing's ``root``; its id where none is given) as ``model_path`` and
    ``tokenizer_path``. ``?model=`` names one of several base models (an adapter named
    there is told by its base model's path, as SGLang tells it); without it, a fleet of
    several is a 400 naming them. Answered here rather than by one replica: a vLLM replica
    has no such endpoint, and any replica of the model would answer alike."""
    gw: GatewayState = request.app.state.gw
    tenant = gw.auth.tenant_of(request) if gw.auth.on else gw.tenancy.tenant_of(request)
    cards = gw.fleet.advertised(gw.tenancy.allowed(tenant))
    name = request.query_params.get("model")
    if name is None:
        bases = {info.parent or n for n, info in cards.items()}
        if not bases:
            raise NoReplicaAvailable("GET /get_model_info: no replica this client may use "
                                     "has listed a model yet (GET /v1/models lists them)")
        if len(bases) > 1:
            raise BadRequest(f"GET /get_model_info: this fleet serves several models; name "
                             f"one with ?model= (one of {some_models(bases)})",
                             param="model")
        name = bases.pop()
    elif not name:
        raise BadRequest("GET /get_model_info: ?model= is empty; name a model (GET /v1/models "
                         "lists them) or leave it out", param="model")
    info = cards.get(name)
    base = name
    if info is not None and info.parent is not None:  # an adapter: its base model's path
        base, info = info.parent, cards.get(info.parent)
    elif info is None and not any(i.parent == name for i in cards.values()):
        raise NotFound(f"GET /get_model_info: the model {shown(name, MODEL_SHOWN_CHARS)} does "
                       f"not exist (GET /v1/models lists them)", param="model",
                       code="model_not_found")
    path = info.root if info is not None and info.root else base
    return _answered(gw, request, tenant, {"model_path": path, "tokenizer_path": path,
                                           "served_model_name": name})


def _answered(gw: GatewayState, request: Request, tenant: str | None,
              body: dict[str, object]) -> Response:
    """A models route's answer, counted as a request answered here (route none, 200)."""
    response = JSONResponse(body, headers=request_id_header(request))
    # (answered here; arrived where the fast path stamped it, else now: the app alone)
    gw.refused(request, "none", "200", request.scope.get(ARRIVED, time.perf_counter()),
               tenant)
    return response


def _model_card(name: str, info: ModelInfo, created: int) -> dict[str, object]:
    """A /v1/models entry as vLLM writes one: an adapter's ``parent`` is its base model,
    its ``root`` where it was loaded from; a base model's ``root`` is itself; its
    ``max_model_len`` the least of the healthy replicas serving it (``Fleet.advertised``).
    Its other fields (``owned_by``, ``created``, ``permission``...) are the listing's
    (``ModelInfo.card``); the gateway's own (``kvgate``, its start) where none gave them."""
    card: dict[str, object] = {"id": name, "object": "model", "created": created,
                               "owned_by": "kvgate", "root": info.root or name,
                               "parent": info.parent}
    if info.max_model_len is not None:
        card["max_model_len"] = info.max_model_len
    if info.card is not None:
        card.update(orjson.loads(info.card))
        if info.max_model_len is not None:  # the fleet's, over a listing's null
            card["max_model_len"] = info.max_model_len
    return card


async def health(request: Request) -> Response:
    return JSONResponse({"status": "ok"}, headers=request_id_header(request))


async def ready(request: Request) -> Response:
    gw: GatewayState = request.app.state.gw
    # a probe's answer, not a client's request: a not-ready answer is in
    # kvgate_errors_total, never in kvgate_requests_total (probes every second of a drain
    # or an outage would read as clients refused)
    counted(request)
    if gw.draining:
        raise ServiceUnavailable("the gateway is shutting down", code="draining")
    if not gw.fleet.any_healthy():
        raise NoReplicaAvailable(f"none of {len(gw.fleet)} replicas is healthy")
    healthy = sum(1 for s in gw.fleet if s.healthy)
    return JSONResponse({"status": "ready", "healthy_replicas": healthy},
                        headers=request_id_header(request))


async def health_generate(request: Request) -> Response:
    """SGLang's router's check that a replica can generate (SGLang's own runs one token):
    /ready's answer, whether a healthy replica is there to take a request; open under
    client keys, as the other probes (orchestrators' health checks send no key)."""
    return await ready(request)


async def flush_cache(request: Request) -> Response:
    """SGLang's router serves ``/flush_cache`` on its main port, to anyone; here it changes
    what every replica holds, so it is an admin call, served on the admin listener alone
    (a client without its key, under client keys, is told only that)."""
    gw: GatewayState = request.app.state.gw
    if gw.auth.on:
        gw.auth.tenant_of(request)
    if not request.app.state.admin_on:
        raise AdminOff("POST /flush_cache (every replica's prefix cache flushed) is on the "
                       "admin API, which is off: configure admin.token (or token_file, "
                       "token_env), then POST /flush_cache to the admin listener "
                       "(admin.host:admin.port) with 'Authorization: Bearer <admin token>'",
                       code="admin_off")
    raise AdminOff("POST /flush_cache (every replica's prefix cache flushed) is served on "
                   "the admin listener only, with 'Authorization: Bearer <admin token>'",
                   code="admin_listener_only")


async def metrics(request: Request) -> Response:
    gw: GatewayState = request.app.state.gw
    headers = {"Content-Type": CONTENT_TYPE_LATEST}
    if gw.worker is not None:
        headers["x-kvgate-worker"] = str(gw.worker)
    return Response(await gw.metrics.page(), headers=headers)


def create_app(config: GatewayConfig, state: GatewayState | None = None) -> ASGIApp:
    gw = state or build_state(config)
    discovery = Discovery(gw, [build_source(source) for source in config.discovery])
    gw.metrics.watch_discovery(discovery.stats)
    if gw.box is not None:  # worker processes: the leader's counts reach every worker
        gw.box.discovery = discovery.stats

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        connector = aiohttp.TCPConnector(
            limit=0, limit_per_host=config.limits.connections_per_replica, ttl_dns_cache=300)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=config.timeouts.connect_s)
        # whatever started is stopped, in reverse order, even if a later start fails
        async with contextlib.AsyncExitStack() as stack:
            stack.callback(gw.router.close)
            gw.tracing.open()
            stack.push_async_callback(close_tracing, gw.tracing)
            # health checks and scrapes (aiohttp); proxied requests (the gateway's own client)
            session = await stack.enter_async_context(aiohttp.ClientSession(
                connector=connector, timeout=timeout, auto_decompress=False))
            upstream = client_for(config)
            stack.push_async_callback(upstream.close)
            gw.proxy = Proxy(upstream, gw.fleet, config.timeouts, gw.metrics,
                             config.max_attempts, config.health,
                             forward_client_auth=not gw.auth.on)
            stack.callback(gw.proxy.close)
            if gw.box is None or gw.box.leader:  # with workers, one checks for the box
                gw.monitor = Monitor(gw.fleet, session, config.health, config.scrape,
                                     gw.kv_capacity, tls=upstream.tls)
                stack.push_async_callback(gw.monitor.stop)
                await gw.monitor.start()
                stack.push_async_callback(discovery.stop)  # ... and discovers
                await discovery.start()
            else:  # a follower checks nothing, but lists the models again on a miss, as
                # one gateway does (``intake.check_model``): not started, no loops
                gw.monitor = Monitor(gw.fleet, session, config.health, config.scrape,
                                     tls=upstream.tls)
                stack.push_async_callback(gw.monitor.stop)
            if gw.box is not None:
                stack.push_async_callback(gw.box.stop)
                await gw.box.start()
            if gw.heartbeat is not None:  # a worker process's loop, alive (gateway.workers)
                gw.heartbeat()
                beating = asyncio.create_task(every(HEARTBEAT_S, gw.heartbeat,
                                                    "the heartbeat"))
                stack.push_async_callback(stop_tasks, [beating])
            if gw.worker_routes is not None:  # stopped after the peers that may forward
                stack.callback(gw.worker_routes.stop)
                gw.worker_routes.start()
            if gw.peers is not None:
                stack.push_async_callback(gw.peers.stop)
                await gw.peers.start()
            stack.push_async_callback(gw.capture.stop)
            await gw.capture.start()
            if gw.capture.log is not None:
                gw.metrics.watch_capture(gw.capture.log)
            if gw.metrics.mirror is not None:
                stack.push_async_callback(gw.metrics.mirror.stop)
                await gw.metrics.mirror.start()
            kv_events = KVEventSubscriber.for_policy(gw.fleet, gw.policy)
            if kv_events is not None:
                stack.push_async_callback(kv_events.stop)
                await kv_events.start()
                gw.metrics.watch_kv_events(kv_events)
            yield

    routes = [
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route(GENERATE_PATH, generate, methods=["POST"]),
        Route(RESPONSES_PATH, responses, methods=["POST"]),
        Route(RESPONSES_PATH + "/{response_id}", stored_response, methods=["GET", "DELETE"]),
        Route(RESPONSES_PATH + "/{response_id}/input_items", stored_response,
              methods=["GET"]),
        Route(RESPONSES_PATH + "/{response_id}/cancel", stored_response, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/models/{model:path}", model, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/ping", health, methods=["GET", "POST"]),
        Route("/version", version, methods=["GET"]),
        Route("/invocations", invocations, methods=["POST"]),
        Route("/ready", ready, methods=["GET"]),
        Route("/health_generate", health_generate, methods=["GET"]),
        Route("/get_model_info", get_model_info, methods=["GET"]),
        Route("/flush_cache", flush_cache, methods=["GET", "POST"]),
        Route("/metrics", metrics, methods=["GET"]),
        *(Route(path, passthrough, methods=["POST"]) for path in PASSTHROUGH_PATHS),
    ]
    boundary = gw.boundary()
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers=boundary.handlers())
    app.router.redirect_slashes = False  # a path with a trailing / is a 404, not a redirect
    app.state.gw = gw
    app.state.admin_on = config.admin.resolved_token() is not None  # (read as serve reads it)
    fast = _FastPath(app, boundary)
    cors = config.cors
    if not cors.allow_origins:
        return fast
    return _CountedPreflight(
        CORSMiddleware(fast, allow_origins=list(cors.allow_origins),
                       allow_methods=["GET", "POST", "OPTIONS"], allow_headers=["*"],
                       allow_credentials=cors.allow_credentials,
                       expose_headers=["x-request-id", "x-kvgate-replica"]), gw)


class _CountedPreflight:
    """``cors`` (the CORS layer over the app), its refused preflights counted: the answer
    it writes itself to a preflight from an origin, or for a method, it does not allow
    (400) ends a request as every other refusal does (``kvgate_requests_total`` under
    route none, an access-log line; not ``kvgate_errors_total``, whose kinds are the
    gateway's own errors), and carries the ``x-request-id`` that line names.
    An accepted preflight is a browser's question before most cross-origin requests, not
    a client's request: counted, it would double a browser client's requests, as
    /v1/models answers (route none, 200)."""

    def __init__(self, cors: ASGIApp, gw: GatewayState) -> None:
        self.cors = cors
        self.gw = gw

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # a preflight as ``CORSMiddleware`` tells one; any other OPTIONS request goes to
        # the app, whose 405 is counted there
        if scope["type"] != "http" or scope["method"] != "OPTIONS" \
                or not {b"origin", b"access-control-request-method"} \
                <= {name for name, _ in scope["headers"]}:
            await self.cors(scope, receive, send)
            return
        arrived = time.perf_counter()
        request = Request(scope)

        async def counted_send(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] >= 400:
                request_id = request_id_header(request)["x-request-id"]
                message = {**message, "headers": [*message.get("headers", ()),
                                                  (b"x-request-id", request_id.encode())]}
                self.gw.refused(request, "none", str(message["status"]), arrived)
            await send(message)

        await self.cors(scope, receive, counted_send)


class _FastPath:
    """The two proxy endpoints without Starlette's router and middleware layers (a
    measurable share of a proxied request's CPU); everything else goes to the app. The
    body a request held (``Admission.hold_body``) is let go once its call returns: its
    answer ended, relayed, refused or failed, or its client left."""

    _HANDLERS = {path: (endpoint, path) for endpoint, path in _PATHS.items()}

    def __init__(self, app: Starlette, boundary: CountingBoundary) -> None:
        self.app = app
        self.state = app.state
        self.boundary = boundary
        self.admission = app.state.gw.admission

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self._serve(scope, receive, send)
        finally:
            self.admission.let_go(scope)

    async def _serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        target = self._HANDLERS.get(scope.get("path", "")) if scope["type"] == "http" else None
        if target is None or scope["method"] != "POST":
            if scope["type"] == "http":  # where a refusal's duration starts (``_proxy``
                scope[ARRIVED] = time.perf_counter()  # takes its own)
            await self.app(scope, receive, send)
            return
        scope["app"] = self.app
        request = Request(scope, receive)
        try:
            response = await _proxy(request, *target)  # type: ignore[arg-type]
        except Exception as exc:  # answered as the app answers it
            response = self.boundary.response(request, exc)
        await response(scope, receive, send)
