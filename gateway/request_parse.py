"""Validate an OpenAI request body and pull out what routing needs.

The body is checked with the rules the engine applies (``kvwire.openai_schema``), leniently
where the replica is the judge (content parts the gateway does not know, ``prompt_embeds``),
and read for the prompt; the bytes the replica receives are the client's own, unchanged
(unknown fields survive).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from gateway.generate_request import generate_fields
from gateway.responses_request import responses_fields
from kvwire.openai_schema import (
    BadRequest,
    RequestFields,
    checked_as_sent,
    json_object,
    parse_fields,
)
from kvwire.request_edge import check_json_counts

Endpoint = Literal["completions", "chat", "generate", "responses"]


@dataclass(frozen=True, slots=True)
class ParsedRequest:
    endpoint: Endpoint
    body: Mapping[str, Any]
    model: str
    stream: bool
    prompt_text: str | None
    prompt_ids: list[int] | None
    messages: list[Any] | None
    cache_salt: str | None
    affinity_key: str | None
    tools: list[Any] | None = None
    raw_bytes: int | None = None  # the body's size as sent (None: not known)
    num_prompts: int = 1  # a batch's size (routed by its first prompt)


def request_object(raw: bytes) -> dict[str, Any]:
    """The JSON object request body ``raw`` holds; BadRequest when it holds none, or
    more arrays, objects or keys than a request may (``check_json_counts``, asked before
    it is decoded)."""
    check_json_counts(raw)
    return json_object(raw)


def parse_body(raw: bytes, endpoint: Endpoint | None, affinity_field: str | None = None,
               affinity_header_value: str | None = None,
               default_model: Callable[[], str | None] | None = None,
               body: dict[str, Any] | None = None) -> ParsedRequest:
    """The request's fields; one without ``model`` (or naming none: "") is for
    ``default_model()`` (the fleet's one model, asked only then; its body is forwarded as
    it came), and refused when there is none. ``endpoint`` None (``/admin/explain``, which
    explains any of them; ``/invocations``, which sends only chats and completions here):
    chat when the body has ``messages``, SGLang's native ``/generate`` when it has
    ``text`` or ``input_ids`` and no ``prompt``, else completions. ``body``: ``raw``
    already decoded (``request_object``), not decoded again."""
    if body is None:
        return _parsed(raw, request_object(raw), endpoint, affinity_field,
                       affinity_header_value, default_model)
    decoded = body
    return checked_as_sent(raw, lambda: _parsed(raw, decoded, endpoint, affinity_field,
                                                 affinity_header_value, default_model))


def _parsed(raw: bytes, body: dict[str, Any], endpoint: Endpoint | None,
            affinity_field: str | None, affinity_header_value: str | None,
            default_model: Callable[[], str | None] | None) -> ParsedRequest:
    if endpoint is None:
        endpoint = "chat" if "messages" in body else "generate" \
            if "prompt" not in body and ("text" in body or "input_ids" in body) \
            else "completions"
    if body.get("model") in (None, ""):  # an empty name is the default's, as vLLM reads it
        model = None if default_model is None else default_model()
        if model is None:
            raise BadRequest("'model' is required and must be a non-empty string (this "
                             "fleet serves several models, or none is known yet)",
                             param="model")
        fields = _fields({**body, "model": model}, endpoint)
    else:
        fields = _fields(body, endpoint)
    assert fields.model is not None
    affinity = affinity_header_value
    if affinity is None and affinity_field:
        value = body.get(affinity_field)
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            affinity = str(value)
        elif value is not None:
            raise BadRequest(f"'{affinity_field}' (the affinity key) must be a string or a "
                             f"number, got {type(value).__name__}", param=affinity_field)
    return ParsedRequest(endpoint, body, fields.model, fields.stream, fields.prompt_text,
                         fields.prompt_ids, fields.messages, fields.cache_salt, affinity,
                         fields.tools, len(raw), fields.num_prompts)


def _fields(body: dict[str, Any], endpoint: Endpoint) -> RequestFields:
    if endpoint == "generate":
        return generate_fields(body)
    if endpoint == "responses":  # routed as the chat it carries
        return responses_fields(body)
    return parse_fields(body, chat=endpoint == "chat", lenient=True)


_GENERATE_KEYS = ("messages", "prompt", "prompt_embeds")


def generates(body: Mapping[str, Any]) -> bool:
    """Whether an ``/invocations`` body is a chat or a completion (``messages``,
    ``prompt`` or ``prompt_embeds``), to be routed as one."""
    return any(key in body for key in _GENERATE_KEYS)
