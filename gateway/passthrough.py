"""The OpenAI endpoints that carry no prompt to route on (embeddings, rerank,
score, tokenize, detokenize, audio transcriptions and translations): sent by ``model`` to
the least busy healthy replica serving it (within the tenant's partition), bodies
unchanged but for the tenant's ``cache_salt`` under ``tenancy.isolate`` (all but tokenize,
detokenize and the audio uploads run the model over the client's text, so a shared prefix
cache would time one tenant's prompts by another's; an upload is a form, forwarded as it
came, its ``model`` read from its form field), under the same admission, body timeout,
retries and relay as completions.

Their cost is not prefill of a reusable prefix, so they take no part in cache-aware
routing: no policy is asked and nothing is learned from them.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from gateway.admission import released_on_error
from gateway.errors import NoReplicaAvailable
from gateway.forwarding import request_id_of, upstream_headers, upstream_query
from gateway.intake import check_model, default_model, read_timed_body, take_place
from gateway.metrics import PASSTHROUGH_ROUTE
from gateway.proxy import UpstreamStream
from gateway.relay_response import relay
from gateway.request_parse import request_object
from gateway.state import GatewayState
from gateway.tenancy import partition_views
from kvwire.form_fields import form_field
from kvwire.media_parts import shown
from kvwire.openai_schema import (
    MODEL_SHOWN_CHARS,
    OpenAIError,
    model_field,
)
from kvwire.request_edge import PARSE_ON_THREAD_BYTES

# uploads (``multipart/form-data``), whose ``model`` is a form field
FORM_PATHS = ("/v1/audio/transcriptions", "/v1/audio/translations")
PATHS = ("/v1/embeddings", "/v1/rerank", "/v1/score", "/tokenize",
         "/detokenize", "/pooling", "/classify", "/score", "/rerank", "/v2/rerank",
         *FORM_PATHS)
ROUTE = PASSTHROUGH_ROUTE
# what runs no model over the request's text (no prefix cache to keep tenants apart in)
_NO_CACHE = frozenset({"/tokenize", "/detokenize"})


_turn = itertools.count()  # ties taken in turn, so equal replicas share the load


def least_busy(gw: GatewayState, model: str,
               allowed: Callable[[str], bool] | None = None,
               tenant: str | None = None) -> tuple[str, ...]:
    """Healthy replicas serving ``model`` (and, given ``allowed``, ``tenant``'s
    partition), fewest requests in flight first (ties in turn)."""
    views = [v for v in partition_views(gw.fleet.views(model), allowed, tenant, model)
             if v.healthy]
    if not views:
        raise NoReplicaAvailable(f"no healthy replica for model "
                                 f"{shown(model, MODEL_SHOWN_CHARS)}")
    start = next(_turn)
    order = {v.id: (i - start) % len(views) for i, v in enumerate(views)}
    views.sort(key=lambda v: (v.in_flight / v.weight if v.weight > 0 else float("inf"),
                              order[v.id]))
    return tuple(v.id for v in views)


async def passthrough(request: Request, decoded: dict[str, Any] | None = None) -> Response:
    """Relay a request to the least busy replica of its model, unrouted; ``decoded``: its
    body already decoded (by ``request_object``: ``/invocations`` looked at it)."""
    gw: GatewayState = request.app.state.gw
    assert gw.proxy is not None
    path = request.url.path
    arrived = time.perf_counter()
    trace = gw.tracing.start(request.headers, path)
    tenant: str | None = None  # the header's tenant once read: a refusal's line names it

    def refused(status: str) -> None:
        gw.refused(request, ROUTE, status, arrived, tenant)

    try:
        tenant = gw.auth.tenant_of(request) if gw.auth.on else gw.tenancy.tenant_of(request)
        query = upstream_query(request)
        # before a place, as ``gateway.app``'s, refused by its tenant's share of them
        raw = await read_timed_body(request, gw, tenant=tenant)
        slot = await take_place(request, gw, tenant)
    except OpenAIError as exc:
        refused(str(exc.status))
        trace.failed(exc)
        raise
    with released_on_error(slot, refused), trace.guard():
        # a large body is parsed (and salted) on a thread: 16 MiB of JSON held the loop 3 s
        large = len(raw) > PARSE_ON_THREAD_BYTES
        if path in FORM_PATHS:
            # an upload, forwarded as it came: its parts are the replica's to read (no
            # cache salt goes into a form; see docs/tenancy.md)
            args = (request.headers.get("content-type"), raw, "model")
            named = await asyncio.to_thread(form_field, *args) if large else form_field(*args)
            model = await check_model(gw, named or default_model(gw), tenant) or ""
        else:
            body = decoded
            if body is None:
                body = await asyncio.to_thread(request_object, raw) if large \
                    else request_object(raw)
            # absent (or null), else a non-empty string: a refusal names what was sent
            model = await check_model(gw, model_field(body) or default_model(gw),
                                      tenant) or ""
            # the model runs over the client's text: a tenant's prefixes are its own there
            if path not in _NO_CACHE:
                isolated = await gw.tenancy.isolate_off_loop(tenant, body, large)
                if isolated is not None:
                    raw = isolated[0]
        forwarded = upstream_headers(request, gw.trusted_proxies,
                                     (gw.tenancy.config.header, tenant))
        request_id = request_id_of(request, forwarded, f"pass-{random.getrandbits(48):x}")
        trace.upstream(forwarded)

        def on_done(stream: UpstreamStream, ok: bool) -> None:
            slot.release()
            trace.answered(stream)
            gw.ended(ROUTE, stream.outcome, stream.replica, request_id=request_id,
                     tenant=tenant, model=model, duration_s=stream.duration_s)
            if ok:
                gw.metrics.answers.relayed(model, ROUTE, stream, arrived)

        ranked = least_busy(gw, model, gw.tenancy.allowed(tenant), tenant)
        return await relay(request, gw.proxy.open(
            ranked, path, raw, forwarded, lambda replica: 0, lambda replica: None, on_done,
            query=query),
            ROUTE, request_id, gw.worker)
