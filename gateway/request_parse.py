"""Validate an OpenAI request body and pull out what routing needs.

The body is parsed to check it and to read the prompt; the bytes the replica receives are
the client's own, unchanged (unknown fields survive).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from engine.tokenizer import ChatFormatError, check_tools, normalize_messages
from gateway.errors import BadRequest

Endpoint = Literal["completions", "chat"]


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


def parse_body(raw: bytes, endpoint: Endpoint, affinity_field: str | None = None,
               affinity_header_value: str | None = None) -> ParsedRequest:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:  # also raised for invalid UTF-8
        raise BadRequest(f"request body is not valid JSON: {exc}", code="invalid_json") from exc
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object", code="invalid_json")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("'model' is required and must be a non-empty string", param="model")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest(f"'stream' must be a boolean, got {stream!r}", param="stream")
    for key in ("max_tokens", "max_completion_tokens"):
        value = body.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < 1):
            raise BadRequest(f"'{key}' must be a positive integer, got {value!r}", param=key)
    salt = body.get("cache_salt")
    if salt is not None and (not isinstance(salt, str) or not salt or len(salt) > 128):
        raise BadRequest("'cache_salt' must be a non-empty string of at most 128 characters",
                         param="cache_salt")
    affinity = affinity_header_value
    if affinity is None and affinity_field:
        value = body.get(affinity_field)
        if value is not None:
            affinity = str(value)
    prompt_text: str | None = None
    prompt_ids: list[int] | None = None
    messages: list[Any] | None = None
    tools: list[Any] | None = None
    if endpoint == "completions":
        prompt_text, prompt_ids = _parse_prompt(body.get("prompt"))
    else:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("'messages' must be a non-empty array", param="messages")
        try:
            normalize_messages(messages)
        except ChatFormatError as exc:
            raise BadRequest(str(exc), param="messages") from exc
        try:
            tools = check_tools(body.get("tools"))
        except ChatFormatError as exc:
            raise BadRequest(str(exc), param="tools") from exc
    return ParsedRequest(endpoint, body, model, stream, prompt_text, prompt_ids, messages,
                         salt, affinity, tools)


MAX_TOKEN_ID = (1 << 32) - 1


def _is_ids(value: Any) -> bool:
    return isinstance(value, list) and all(
        isinstance(t, int) and not isinstance(t, bool) and 0 <= t <= MAX_TOKEN_ID
        for t in value)


def _parse_prompt(prompt: Any) -> tuple[str | None, list[int] | None]:
    """Text or token ids of the prompt routing looks at (the first one of a batch)."""
    if prompt is None:
        raise BadRequest("'prompt' is required", param="prompt")
    if isinstance(prompt, str):
        if not prompt:
            raise BadRequest("'prompt' must not be empty", param="prompt")
        return prompt, None
    if isinstance(prompt, list) and prompt:
        first = prompt[0]
        if _is_ids(prompt):
            return None, list(prompt)
        if all(isinstance(p, str) for p in prompt):
            if not first:
                raise BadRequest("'prompt' must not be empty", param="prompt")
            return first, None
        if all(_is_ids(p) and p for p in prompt):
            return None, list(first)
    raise BadRequest(
        "'prompt' must be a non-empty string, array of strings, array of token ids "
        f"(integers 0..{MAX_TOKEN_ID}) or array of token id arrays", param="prompt")
