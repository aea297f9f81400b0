"""OpenAI's routes over a stored response (``GET`` and ``DELETE /v1/responses/{id}``,
``GET /v1/responses/{id}/input_items``, ``POST /v1/responses/{id}/cancel``: the openai
client's ``responses.retrieve``, ``delete``, ``input_items.list`` and ``cancel``), sent to
the replica that stored it and its answer relayed.

Only the replica that answered a response stores it. The gateway keeps which one did, and
for which tenant (``response_homes``, as continuations use it): another tenant's id is a
404 as an unknown one is, sent nowhere; its own goes to that replica (a retryable 503 while
it is out of routing), then, answered 404 there, to the tenant's other healthy replicas in
turn, as an id this gateway process never saw answered is (another copy or worker may
have). None storing it: a 404. A replica's tenant check (the tenant header the gateway
sends) keeps a tenant from another's responses on the replicas too. A deletion one
answered drops this process's record; other workers and peer copies keep theirs until it
ages out: a retrieval or continuation they route is answered 404 by the replica.

A replica's redirect is never followed (it could point anywhere, and the tenant header
would go with the request) nor relayed: a 3xx, as any status under 200, is no answer, and
the client gets a 502 naming the replica where no other replica answers. An answer is read
up to ``answer_bound`` bytes; a longer one is a 502 naming the replica, not held.
"""

from __future__ import annotations

import logging
import math
import time
from urllib.parse import quote

import aiohttp
import yarl
from starlette.requests import Request
from starlette.responses import Response

from gateway.config import GatewayConfig
from gateway.errors import ARRIVED, NoReplicaAvailable, UpstreamError
from gateway.forwarding import request_id_header, upstream_headers, upstream_query
from gateway.responses_request import PATH
from gateway.state import GatewayState
from kvwire.media_parts import shown
from kvwire.openai_schema import NotFound, ServiceUnavailable

log = logging.getLogger("kvgate.gateway")
ROUTE = "stored"  # the route label of these requests (metrics, access log)
# the relayed answer's headers (a replica's own are not the client's business)
_RELAYED_HEADERS = ("content-type",)


class _NoAnswer(Exception):
    """A replica's answer that is not relayed (a redirect, an answer past the bound): the
    client's 502 says why."""


def answer_bound(config: GatewayConfig) -> int:
    """The bytes of a replica's answer read at most: what the proxy holds of an answer
    whole (``timeouts.buffer_bytes``), or ``max_body_bytes`` where larger, since a
    response's input items hold the request that made it."""
    return max(config.timeouts.buffer_bytes, config.max_body_bytes)


async def _read_bounded(answer: aiohttp.ClientResponse, bound: int, replica: str) -> bytes:
    """``answer``'s body, or ``_NoAnswer`` once it passes ``bound`` bytes (told by its
    ``content-length`` before reading, where it has one)."""
    over = _NoAnswer(f"replica {replica!r} answered more than {bound} bytes, more than "
                     "the gateway relays of a stored response")
    if answer.content_length is not None and answer.content_length > bound:
        raise over
    parts: list[bytes] = []
    size = 0
    async for chunk in answer.content.iter_any():
        size += len(chunk)
        if size > bound:
            raise over
        parts.append(chunk)
    return b"".join(parts)


def not_found(response: str) -> NotFound:
    """The answer for a response no replica stores for the client's tenant: never stored,
    forgotten, deleted, or another tenant's (one answer for all)."""
    return NotFound(f"Response with id {shown(response)} not found.", param="response_id",
                    code="response_not_found")


def home_unavailable(gw: GatewayState, response: str, replica: str, ejected_until: float,
                     param: str = "previous_response_id") -> ServiceUnavailable:
    """The 503 for a request on ``response`` (``param`` names it) while ``replica``, the one
    that stores it, is out of routing (``ejected_until``: monotonic, the end of an outlier
    ejection; 0 for none): retried after that ejection's end plus the health checks that
    readmit it (``x-should-retry``, which the openai client obeys over its own rule)."""
    health = gw.config.health
    wait_s = max(0.0, ejected_until - time.monotonic()) \
        + health.interval_s * health.successes_to_readmit
    return ServiceUnavailable(
        f"Response with id {shown(response)} is stored on replica {shown(replica)}, which "
        "is out of routing now (ejected, or not checked yet): try again shortly",
        param=param, code="response_replica_unavailable",
        headers={"Retry-After": str(max(1, math.ceil(wait_s))), "x-should-retry": "true"})


def _replicas(gw: GatewayState, response: str, tenant: str | None) -> list[str]:
    """The replicas to ask for ``response`` of ``tenant``, in turn: its home first (where
    this process saw it answered, while that replica is in the fleet and the tenant's
    partition), then the tenant's other healthy replicas. NotFound where it is another
    tenant's; ``home_unavailable`` while its home is out of routing."""
    allowed = gw.tenancy.allowed(tenant)
    home = gw.response_homes.get(response, None)
    first: list[str] = []
    if home is not None:
        if home.tenant != tenant:  # never sent on: a replica may not tell tenants apart
            raise not_found(response)
        state = gw.fleet.get(home.replica)
        if state is not None and (allowed is None or allowed(home.replica)):
            if not state.healthy:
                raise home_unavailable(gw, response, home.replica, state.ejected_until,
                                       param="response_id")
            first.append(home.replica)
    others = [s.id for s in gw.fleet if s.healthy and s.id not in first
              and (allowed is None or allowed(s.id))]
    if not first and not others:
        raise NoReplicaAvailable("no healthy replica to ask for the stored response "
                                 f"{shown(response)}")
    return first + others


async def stored_response(request: Request) -> Response:
    """One request on a stored response, sent to the replicas that may store it until one
    answers other than 404 (``_replicas``), its answer relayed; counted as every /v1
    request is (route ``stored``), and needing the client's key as they do."""
    gw: GatewayState = request.app.state.gw
    arrived = request.scope.get(ARRIVED, time.perf_counter())
    tenant = gw.auth.tenant_of(request) if gw.auth.on else gw.tenancy.tenant_of(request)
    response = request.path_params["response_id"]
    order = _replicas(gw, response, tenant)
    # the path as the client named it: the id (one segment) quoted again, what follows it
    suffix = request.scope["path"][len(PATH) + 1 + len(response):]
    path = f"{PATH}/{quote(response, safe='')}{suffix}"
    query = upstream_query(request)
    forwarded = upstream_headers(request, gw.trusted_proxies,
                                 (gw.tenancy.config.header, tenant))
    body = await request.body()  # a cancel's (empty); none on the others
    assert gw.monitor is not None
    session = gw.monitor.session
    tls = gw.monitor.tls  # https replicas checked as health checks and proxied requests are
    timeouts = gw.config.timeouts
    limit = aiohttp.ClientTimeout(total=timeouts.stall_s, sock_connect=timeouts.connect_s)
    bound = answer_bound(gw.config)
    failed: list[str] = []
    refused: list[str] = []  # why each answer that is no answer was not relayed
    for replica in order:
        state = gw.fleet.get(replica)
        if state is None:
            continue
        # (sent as written: the id quoted above, the client's query string as it came)
        url = yarl.URL(state.config.base_url + path + query, encoded=True)
        headers = dict(state.upstream_headers(forwarded, not gw.auth.on))
        try:
            async with session.request(request.method, url, headers=headers, data=body,
                                       timeout=limit, allow_redirects=False,
                                       ssl=True if tls is None else tls) as answer:
                status = answer.status
                if status < 200 or 300 <= status < 400:
                    # a redirect (or a status no server answers): neither followed nor
                    # relayed, its Location and body left unread
                    raise _NoAnswer(f"replica {replica!r} answered {status}, which is no "
                                    "answer (a redirect is not followed)" if status >= 300
                                    else f"replica {replica!r} answered {status}, which "
                                    "is no answer")
                content = await _read_bounded(answer, bound, replica)
                relayed = {k: answer.headers[k] for k in _RELAYED_HEADERS
                           if k in answer.headers}
        except _NoAnswer as exc:
            log.warning("%s (%s %s)", exc, request.method, path)
            refused.append(str(exc))
            continue
        except (TimeoutError, aiohttp.ClientError) as exc:
            log.warning("replica %s did not answer %s %s: %s", replica, request.method,
                        path, exc.__class__.__name__)
            failed.append(replica)
            continue
        if status == 404:
            continue
        if request.method == "DELETE" and status < 300:
            gw.response_homes.pop(response, None)
        gw.refused(request, ROUTE, str(status), arrived, tenant, replica)
        return Response(content, status_code=status, headers={
            **relayed, **request_id_header(request), "x-kvgate-replica": replica,
            "x-kvgate-route": ROUTE})
    if refused:  # one that may store it answered what cannot be relayed
        raise UpstreamError(f"Response with id {shown(response)}: {'; '.join(refused)}",
                            param="response_id", code="upstream_error")
    if failed:  # one that may store it did not answer: not known to be gone
        raise ServiceUnavailable(
            f"Response with id {shown(response)}: replicas {', '.join(map(shown, failed))} "
            "did not answer, and no other stores it", param="response_id",
            code="response_replica_unavailable", headers={"x-should-retry": "true"})
    if request.method == "DELETE":
        gw.response_homes.pop(response, None)
    raise not_found(response)
