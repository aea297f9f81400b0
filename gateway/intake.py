"""A request's way into the gateway, the same for proxying and for ``/admin/explain``:
the body read under the size limit, checked, its model looked up, and, under
``tenancy.isolate``, rewritten with the tenant's cache salt."""

from __future__ import annotations

import asyncio
import dataclasses
import heapq
import operator
from typing import Any, NamedTuple

from starlette.requests import Request

from gateway.admission import Slot
from gateway.fleet import ModelInfo
from gateway.generate_request import model_param
from gateway.monitor import MODEL_ID_CHARS
from gateway.request_parse import Endpoint, ParsedRequest, parse_body
from gateway.state import GatewayState
from kvwire.media_parts import shown
from kvwire.openai_schema import (
    MODEL_SHOWN_CHARS,
    BadRequest,
    ClientDisconnected,
    NotFound,
    UnsupportedMediaType,
)
from kvwire.request_edge import (
    header_value,
    parses_on_loop,
    read_body,
    unless_disconnected,
)

# of the models an unknown model's error names: a fleet of LoRA adapters serves thousands
SHOWN_MODELS = 16


class Intake(NamedTuple):
    parsed: ParsedRequest
    raw: bytes  # the bytes to forward: the client's own, or salted for its tenant
    tenant: str | None


async def read_timed_body(request: Request, gw: GatewayState, serve: bool = True,
                          tenant: str | None = None) -> bytes:
    """The request's body, within ``max_body_bytes`` and ``limits.body_timeout_s``, when
    it comes uncompressed (``check_encoding``, before reading it). A request to be served
    (``serve``; not one the admin API explains, nor a replica it adds) then holds its
    body's bytes until its answer ends (``Admission.hold_body``: 429 past
    ``limits.max_held_body_bytes``), and is refused when the gateway has no place for it
    (``Admission.check_room``: ``tenant``'s share of it), before anything is done with
    its body."""
    check_encoding(request)
    raw = await read_body(request, gw.config.max_body_bytes, gw.admission.bodies,
                          timeout_s=gw.config.limits.body_timeout_s)
    if serve:
        gw.admission.hold_body(request.scope, len(raw))
        gw.admission.check_room(tenant)
    return raw


_IDENTITY = frozenset(("", "identity"))


def check_encoding(request: Request) -> None:
    """UnsupportedMediaType (RFC 9110's 415, saying what is accepted) for a body sent
    compressed (``Content-Encoding: gzip``): the gateway reads the JSON it routes by,
    and vLLM and SGLang read no compressed body either."""
    encoding = (header_value(request, "content-encoding") or "").strip().lower()
    if encoding not in _IDENTITY:
        raise UnsupportedMediaType(
            f"Content-Encoding {shown(encoding, 40)} is not supported: send the request "
            f"body uncompressed", code="unsupported_content_encoding",
            headers={"accept-encoding": "identity"})


async def take_place(request: Request, gw: GatewayState, tenant: str | None) -> Slot:
    """A place for a request of ``tenant`` whose body was read (``Admission.enter``: a
    share of the places between the tenants asking for them); ClientDisconnected
    when its client left while it waited for one (nobody would read its answer). A
    request that waits is watched for its client leaving: it gives its place in the queue
    up then, rather than holding it (and a live client's 429) until its turn."""
    slot = gw.admission.enter_now(tenant)
    if slot is not None:
        return slot
    try:
        slot = await unless_disconnected(request, gw.admission.enter(tenant))
    except ClientDisconnected:
        raise ClientDisconnected("the client left while its request waited for a place") \
            from None
    if await request.is_disconnected():
        slot.release()
        raise ClientDisconnected("the client left while its request waited for a place")
    return slot


class _BaseModels:
    """The models a request naming none may be for (``base_models``), worked out again
    only when a replica's model list changes: each list the gateway learns is a new dict
    (``Monitor``, ``box_feed``), so the lists' identities tell it, in one pass over the
    replicas rather than one over every adapter's name (100 replicas of 1,024 adapters:
    100,000 names)."""

    def __init__(self) -> None:
        self._lists: tuple[dict[str, ModelInfo], ...] | None = None  # none seen yet
        self._bases: frozenset[str] = frozenset()

    def __call__(self, gw: GatewayState) -> frozenset[str] | None:
        if gw.fleet.models_cut():
            return None
        lists = tuple(state.model_info for state in gw.fleet)
        if self._lists is None or len(lists) != len(self._lists) \
                or not all(map(operator.is_, lists, self._lists)):
            # an adapter is for its base model: its parent, where the replica lists it
            # beside it (as vLLM does); a parent none lists is no model to send one to
            self._bases = frozenset().union(*(
                {info.parent if info.parent in listed else name
                 for name, info in listed.items()} for listed in lists))
            self._lists = lists
        return self._bases


base_models = _BaseModels()


def unnamed_model(bases: frozenset[str] | None) -> str:
    """The model a request that names none is for, given ``base_models``: the fleet's one
    base model, whatever adapters of it are listed (vLLM serves a request without
    ``model`` with its base model, adapters loaded or not); BadRequest (``model``) naming
    the base models when there are several, or saying none is known yet."""
    if bases is not None and len(bases) == 1:
        return next(iter(bases))
    why = f"this fleet serves several models: name one of {some_models(set(bases))}" \
        if bases else "no replica's models are known yet" if bases is not None \
        else "a replica serves more models than the gateway keeps of its list"
    raise BadRequest(f"'model' is required and must be a non-empty string ({why})",
                     param="model")


def default_model(gw: GatewayState) -> str:
    """``unnamed_model`` of the fleet's ``base_models`` now."""
    return unnamed_model(base_models(gw))


async def check_model(gw: GatewayState, model: str | None, tenant: str | None = None,
                      param: str = "model") -> str | None:
    """NotFound unless a replica ``tenant`` may use serves ``model`` (any model, before
    models are known, or while a replica lists more than the gateway keeps); the error
    names ``param``, the body's field that named it (``lora_path``: an adapter on
    ``/generate``), and only the models the tenant may use, the first ``SHOWN_MODELS`` of
    them. A model
    none lists is looked for again first (``Monitor.refresh_all_models``: loaded at run
    time, or a replica restarted with it; by the next round, up to a second away), by
    every worker of a box alike (``box_feed``); one too long for any list
    (``MODEL_ID_CHARS``) is not, and its error says why.

    Returns the model to route the request as: ``model``; or, where no replica lists it
    and ``unlisted_model`` is ``pass``, the fleet's base model, where it has one alone and
    the tenant's replicas serve it (then without looking for the name again: such a
    request is no rarity, and would wait for a round each time). Its body goes to such a
    replica unchanged, which answers the name as it would without the gateway: SGLang and
    TGI serve any name (SGLang's examples send "default", TGI's "tgi"), vLLM and the
    engine answer their own 404."""
    allowed = gw.tenancy.allowed(tenant)
    if gw.fleet.lists(model, allowed):  # as most requests are: the set of every model
        return model  # (100 replicas of 1,024 adapters: 100,000 names) is built for others
    known = gw.fleet.models(allowed)
    too_long = model is not None and len(model) > MODEL_ID_CHARS  # never listed
    passing = param == "model" and not too_long and gw.config.unlisted_model == "pass"
    if known and model not in known and not gw.fleet.models_cut():
        bases = base_models(gw)
        if passing and bases is not None and len(bases) == 1 and bases <= known:
            return next(iter(bases))
        if gw.monitor is not None and not too_long:
            await gw.monitor.refresh_all_models()
            known = gw.fleet.models(allowed)
    if known and model not in known and not gw.fleet.models_cut():
        # the name's start only: a body may hold megabytes of it
        why = (f" (model names over {MODEL_ID_CHARS} characters are not routed: a replica "
               f"that lists one has it left out of its models)") if too_long else ""
        named = shown(model, MODEL_SHOWN_CHARS)
        what = f"model {named}" if param == "model" \
            else f"the adapter '{param}' names, {named},"
        hint = ""
        if param == "model" and not too_long and not passing \
                and len(base_models(gw) or ()) == 1:
            hint = " (where the replicas serve any name, as SGLang and TGI do, the " \
                   "gateway's unlisted_model: pass sends it to them)"
        raise NotFound(f"{what} is not served by any replica{why}{hint}; available: "
                       f"{some_models(known)}", param=param, code="model_not_found")
    return model


def some_models(models: set[str]) -> str:
    """The first ``SHOWN_MODELS`` of ``models`` in order, and how many more there are."""
    first = ", ".join(heapq.nsmallest(SHOWN_MODELS, models))
    more = len(models) - SHOWN_MODELS
    return first if more <= 0 else f"{first} and {more} more (GET /v1/models lists them)"


async def take_in(request: Request, gw: GatewayState, endpoint: Endpoint | None,
                  keyed: str | None = None, named: bool = False,
                  body: dict[str, Any] | None = None) -> Intake:
    """``endpoint`` None: chat when the body has ``messages``, else completions. With client
    API keys on, or ``named`` (the admin API names the tenant it explains for), ``keyed``
    is the tenant (the request's tenant header is not read here). A request to be served
    (not ``named``) is refused once its body is read when the gateway has no place for it
    (``read_timed_body``). ``body``: the request's body already decoded (by
    ``request_object``: ``/invocations`` looks at it to choose a route)."""
    # from the request's head: its share of the gateway's places is the tenant's
    tenant = keyed if gw.auth.on or named else gw.tenancy.tenant_of(request)
    raw = await read_timed_body(request, gw, not named, tenant)
    aff = gw.config.affinity
    affinity = header_value(request, aff.header) if aff.header else None
    on_loop = parses_on_loop(raw)
    if on_loop:
        parsed = parse_body(raw, endpoint, aff.body_field, affinity,
                            lambda: default_model(gw), body)
    else:  # its checks' Python (a chat of 150,000 parts: 0.4 s) leaves the loop free
        bases = base_models(gw)  # the fleet's, read here: its lists change on the loop
        parsed = await asyncio.to_thread(parse_body, raw, endpoint, aff.body_field,
                                         affinity, lambda: unnamed_model(bases), body)
    routed_as = await check_model(gw, parsed.model, tenant, model_param(parsed.body)
                                  if parsed.endpoint == "generate" else "model")
    if routed_as != parsed.model and routed_as is not None:
        parsed = dataclasses.replace(parsed, model=routed_as)  # (its body unchanged)
    # the body written again with the tenant's salt: where it was parsed, as a
    # pass-through body is
    isolated = await gw.tenancy.isolate_off_loop(tenant, parsed.body, not on_loop)
    if isolated is not None:
        raw, salt = isolated
        parsed = dataclasses.replace(parsed, cache_salt=salt)
    return Intake(parsed, raw, tenant)
