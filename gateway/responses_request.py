"""OpenAI's Responses API (``POST /v1/responses``, served by vLLM and SGLang too) read as
the chat it carries, for routing.

A replica runs a Responses request as its model's chat over the same messages, so the
gateway routes it as that chat: ``instructions`` the system message, then ``input`` (a
string, a user message; or items: messages, function calls and their outputs), with the
function ``tools`` in the chat's shape. The replica gets the body unchanged; the chat is
rendered only to find the prefix the replicas cache (an agent's long instructions and
tools, and the turns it sends again). Items of other kinds (reasoning, built-in tools'
calls) take no part in the key. ``previous_response_id`` names a response a replica
stored; ``ResponseHomes`` keeps which replica answered each, so such a request goes back
there (no other replica can continue it).
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import orjson

from kvwire.chat_messages import ChatFormatError, check_tools
from kvwire.media_parts import shown
from kvwire.openai_schema import (
    BadRequest,
    RequestFields,
    check_cache_salt,
    model_field,
    optional,
    positive_int,
)

PATH = "/v1/responses"
# a failed response: its own event, or an error event (the answer failed under a 200)
FAILED_EVENTS = (b'"type":"response.failed"', b'"type": "response.failed"',
                 b'"type":"error"', b'"type": "error"')
# a whole stream's last event (vLLM, SGLang and OpenAI send no [DONE] after it); JSON
# strings escape their quotes, so no content holds these
LAST_EVENTS = (b'"type":"response.completed"', b'"type": "response.completed"',
               b'"type":"response.incomplete"', b'"type": "response.incomplete"',
               *FAILED_EVENTS)
_TEXT_PARTS = frozenset(("input_text", "output_text", "text", "refusal"))
_ROLES = {"developer": "system", "system": "system", "user": "user",
          "assistant": "assistant"}
# a response's id in its first bytes: the body's own, or the response.created event's
_RESPONSE_ID = re.compile(rb'"id"\s*:\s*"(resp[_-][A-Za-z0-9_.:-]{1,200})"')
_ID_LOOK_BYTES = 4096


def responses_fields(body: Any) -> RequestFields:
    """The checked fields of a Responses request, its chat in ``messages`` and ``tools``;
    BadRequest naming the first field that is wrong."""
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object", code="invalid_json")
    model = model_field(body)
    stream = bool(optional(body, "stream", bool, False))
    limit = positive_int(body, "max_output_tokens")
    salt = check_cache_salt(body.get("cache_salt"))
    optional(body, "previous_response_id", str, None)
    instructions = optional(body, "instructions", str, None)
    messages: list[dict[str, Any]] = []
    if instructions:
        messages.append({"role": "system", "content": instructions})
    raw = body.get("input")
    if isinstance(raw, str):
        messages.append({"role": "user", "content": raw})
    elif isinstance(raw, list):
        for i, item in enumerate(raw):
            message = _item_message(item, f"input[{i}]")
            if message is not None:
                messages.append(message)
    elif raw is not None or body.get("previous_response_id") is None:
        raise BadRequest(f"'input' must be a string or an array of items, got {shown(raw)}",
                         param="input")
    if not messages:  # nothing the chat key can read (a continuation of items alone)
        messages.append({"role": "user", "content": ""})
    try:
        tools = check_tools(_chat_tools(body.get("tools")))
    except ChatFormatError as exc:
        raise BadRequest(str(exc), param=exc.param or "tools") from exc
    return RequestFields(body, model, stream, limit, salt, messages=messages, tools=tools)


def _item_message(item: Any, where: str) -> dict[str, Any] | None:
    """The chat message an ``input`` item stands for; None for an item the chat key does
    not read."""
    if isinstance(item, str):
        return {"role": "user", "content": item}
    if not isinstance(item, Mapping):
        raise BadRequest(f"{where} must be an object or a string, got {shown(item)}",
                         param=where)
    kind = item.get("type", "message")
    if kind == "message":
        role = _ROLES.get(item.get("role"))  # type: ignore[arg-type]
        if role is None:
            raise BadRequest(f"{where}.role must be one of {sorted(_ROLES)}, got "
                             f"{shown(item.get('role'))}", param=f"{where}.role")
        return {"role": role, "content": _content(item.get("content"), f"{where}.content")}
    if kind == "function_call":
        name, arguments = item.get("name"), item.get("arguments")
        if not isinstance(name, str) or not isinstance(arguments, str):
            raise BadRequest(f"{where} (a function_call) needs a string name and arguments",
                             param=where)
        call = {"id": str(item.get("call_id") or item.get("id") or ""), "type": "function",
                "function": {"name": name, "arguments": arguments}}
        return {"role": "assistant", "content": "", "tool_calls": [call]}
    if kind == "function_call_output":
        output = item.get("output")
        text = output if isinstance(output, str) else orjson.dumps(output).decode()
        return {"role": "tool", "tool_call_id": str(item.get("call_id") or ""),
                "content": text}
    return None


def _content(content: Any, where: str) -> str:
    """A message's text: a string, or its text parts joined (an image stands by its
    address; other parts are left out of the key)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise BadRequest(f"{where} must be a string or an array of parts, got "
                         f"{shown(content)}", param=where)
    texts: list[str] = []
    for part in content:
        if not isinstance(part, Mapping):
            raise BadRequest(f"{where} parts must be objects, got {shown(part)}", param=where)
        kind = part.get("type")
        if kind in _TEXT_PARTS:
            text = part.get("text", part.get("refusal"))
            if isinstance(text, str):
                texts.append(text)
        elif kind == "input_image":
            texts.append(f"[image {part.get('image_url') or part.get('file_id') or ''}]")
    return "\n".join(texts)


def _chat_tools(tools: Any) -> Any:
    """Function ``tools`` in the chat's shape (``{"type": "function", "function":
    {...}}``); a Responses function tool is flat (``name``, ``parameters`` beside its
    type). Built-in tools (web search, file search...) are left out of the key."""
    if not isinstance(tools, list):
        return tools  # None, or what check_tools names as wrong
    out: list[Any] = []
    for tool in tools:
        if not isinstance(tool, Mapping):
            out.append(tool)
        elif tool.get("type") == "function" and "function" not in tool:
            out.append({"type": "function", "function": {
                "name": tool.get("name"), "description": tool.get("description"),
                "parameters": tool.get("parameters")}})
        elif tool.get("type") == "function":
            out.append(tool)
    return out or None


def response_id(first_bytes: bytes) -> str | None:
    """The id of the response whose body (or stream) starts with ``first_bytes``."""
    found = _RESPONSE_ID.search(first_bytes, 0, _ID_LOOK_BYTES)
    return found.group(1).decode() if found else None


class ResponseHomes:
    """Which replica answered each recent response (``limit`` of them, the oldest
    forgotten first): a request that continues one (``previous_response_id``) can only
    be served where it is stored."""

    def __init__(self, limit: int = 1 << 16) -> None:
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit!r}")
        self.limit = limit
        self._homes: OrderedDict[str, str] = OrderedDict()

    def __len__(self) -> int:
        return len(self._homes)

    def answered(self, response: str, replica: str) -> None:
        self._homes[response] = replica
        self._homes.move_to_end(response)
        while len(self._homes) > self.limit:
            self._homes.popitem(last=False)

    def home_of(self, response: str) -> str | None:
        return self._homes.get(response)
