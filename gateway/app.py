"""The gateway's Starlette application: OpenAI endpoints, health, metrics, admin.

Long-lived parts (the upstream HTTP session, the monitor loops, the tokenizer pool) are
opened in the lifespan and closed on shutdown.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator

import aiohttp
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway import admin
from gateway.config import GatewayConfig
from gateway.errors import NoReplicaAvailable
from gateway.intake import take_in
from gateway.kv_event_subscriber import KVEventSubscriber
from gateway.monitor import Monitor
from gateway.proxy import Proxy, UpstreamStream, forward_headers
from gateway.request_parse import Endpoint
from gateway.routing import work_tokens
from gateway.state import GatewayState, build_state
from kvwire.openai_schema import ClientDisconnected, OpenAIError
from kvwire.request_edge import ErrorBoundary, unless_disconnected
from policies.base import Finished, Routed

log = logging.getLogger("kvgate.gateway")


async def _proxy(request: Request, endpoint: Endpoint, path: str) -> Response:
    gw: GatewayState = request.app.state.gw
    assert gw.proxy is not None
    intake = await take_in(request, gw, endpoint)
    routing = await gw.router.decide(intake.parsed, intake.tenant)
    gw.metrics.decision_seconds.observe(routing.seconds)
    route_req, decision = routing.request, routing.decision

    def on_sent(replica: str) -> None:
        gw.policy.observe(Routed(route_req, replica))

    def on_done(stream: UpstreamStream, ok: bool) -> None:
        gw.metrics.requests.labels(replica=stream.replica, route=decision.reason,
                                   status=str(stream.status)).inc()
        usage = stream.usage()
        cached = None
        if usage is not None:
            gw.metrics.prompt_tokens.labels(route=decision.reason).inc(usage[0])
            gw.metrics.cached_tokens.labels(route=decision.reason).inc(usage[1])
            cached = gw.fleet.answered(route_req.model, route_req.prompt_tokens, *usage)
        # a stream's first byte comes with its first token; a whole body's comes after
        # the last one, so it says nothing of time to first token
        ttft = stream.first_byte_s if stream.stream else None
        gw.policy.observe(Finished(route_req, stream.replica, ok, cached, ttft,
                                   stream.duration_s))

    try:
        stream = await unless_disconnected(request, gw.proxy.open(
            decision.ranked, path, intake.raw, forward_headers(request.headers),
            lambda replica: work_tokens(route_req, decision, replica), on_sent, on_done))
    except OpenAIError as exc:
        if not isinstance(exc, ClientDisconnected):
            gw.metrics.requests.labels(replica="none", route=decision.reason,
                                       status=str(exc.status)).inc()
        raise
    headers = dict(stream.headers)
    headers["x-kvgate-replica"] = stream.replica
    headers["x-kvgate-route"] = decision.reason
    if stream.complete:  # nothing left to relay: skip the streaming machinery
        return Response(stream.whole_body(), status_code=stream.status, headers=headers)
    return _RelayResponse(stream, headers)


class _RelayResponse(StreamingResponse):
    """Relays an upstream stream; settles it even if the relay never started (a client
    that leaves before the first chunk is sent cancels the response, not the relay)."""

    def __init__(self, stream: UpstreamStream, headers: dict[str, str]) -> None:
        super().__init__(stream.relay(), status_code=stream.status, headers=headers)
        self.stream = stream

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.stream.close(ok=False)  # no-op when the relay finished and closed it


async def completions(request: Request) -> Response:
    return await _proxy(request, "completions", "/v1/completions")


async def chat_completions(request: Request) -> Response:
    return await _proxy(request, "chat", "/v1/chat/completions")


async def models(request: Request) -> Response:
    gw: GatewayState = request.app.state.gw
    names = sorted(gw.fleet.models())
    return JSONResponse({"object": "list", "data": [
        {"id": name, "object": "model", "owned_by": "kvgate"} for name in names]})


async def health(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


async def ready(request: Request) -> Response:
    gw: GatewayState = request.app.state.gw
    if not gw.fleet.any_healthy():
        raise NoReplicaAvailable(f"none of {len(gw.fleet)} replicas is healthy")
    healthy = sum(1 for s in gw.fleet if s.healthy)
    return JSONResponse({"status": "ready", "healthy_replicas": healthy})


async def metrics(request: Request) -> Response:
    gw: GatewayState = request.app.state.gw
    return Response(generate_latest(gw.metrics.registry),
                    headers={"Content-Type": CONTENT_TYPE_LATEST})


def create_app(config: GatewayConfig, state: GatewayState | None = None) -> ASGIApp:
    gw = state or build_state(config)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, ttl_dns_cache=300)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=config.timeouts.connect_s)
        # whatever started is stopped, in reverse order, even if a later start fails
        async with contextlib.AsyncExitStack() as stack:
            stack.callback(gw.router.close)
            session = await stack.enter_async_context(aiohttp.ClientSession(
                connector=connector, timeout=timeout, auto_decompress=False))
            gw.proxy = Proxy(session, gw.fleet, config.timeouts, gw.metrics,
                             config.max_attempts)
            gw.monitor = Monitor(gw.fleet, session, config.health, config.scrape)
            stack.push_async_callback(gw.monitor.stop)
            await gw.monitor.start()
            kv_events = KVEventSubscriber.for_policy(gw.fleet, gw.policy)
            if kv_events is not None:
                stack.push_async_callback(kv_events.stop)
                await kv_events.start()
            yield

    routes = [
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/ready", ready, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        *admin.routes(),
    ]
    boundary = ErrorBoundary(lambda kind: gw.metrics.errors.labels(kind=kind).inc())
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers=boundary.handlers())
    app.state.gw = gw
    return _FastPath(app, boundary)


class _FastPath:
    """The two proxy endpoints without Starlette's router and middleware layers (a
    measurable share of a proxied request's CPU); everything else goes to the app."""

    _HANDLERS = {"/v1/completions": ("completions", "/v1/completions"),
                 "/v1/chat/completions": ("chat", "/v1/chat/completions")}

    def __init__(self, app: Starlette, boundary: ErrorBoundary) -> None:
        self.app = app
        self.state = app.state
        self.boundary = boundary

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        target = self._HANDLERS.get(scope.get("path", "")) if scope["type"] == "http" else None
        if target is None or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        scope["app"] = self.app
        request = Request(scope, receive)
        try:
            response = await _proxy(request, *target)  # type: ignore[arg-type]
        except Exception as exc:  # answered as the app answers it
            response = self.boundary.response(request, exc)
        await response(scope, receive, send)
