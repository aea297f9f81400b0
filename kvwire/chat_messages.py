"""OpenAI chat messages and tools as a request carries them, checked and normalized.

The gateway checks them when it parses a request, the engine when it validates one, and
the tokenizer renders the normalized form; all three read this module. A message's
content is a string or a list of parts, joined by newlines as vLLM joins them (an empty
or null text is no part); a media part (image, audio, video) stands in place by its
content-derived placeholder (``kvwire.media_parts``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kvwire.media_parts import (
    MediaPartError,
    media_type,
    opaque_placeholder,
    placeholder,
    shown,
)

# a message given as parts keeps them (their texts and placeholders) under this key, as a
# tuple: no JSON body holds one, so only this module's own output carries it
PARTS = "content_parts"

# parts whose text is the model's to read: the key that holds it
_TEXT_PARTS = {"text": "text", "input_text": "text", "refusal": "refusal",
               "thinking": "thinking"}


class ChatFormatError(ValueError):
    """A chat message is malformed; the message names which one and why, ``param`` the
    field when it is known more closely than ``messages``."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def check_tools(tools: Any) -> list[Any] | None:
    """The request's ``tools`` (None when absent), as vLLM's request model takes them:
    each ``{"type": "function", "function": {"name": str, "description": str or null,
    "parameters": object or null}}`` (``type`` may be left out), or a ``custom`` tool
    (``{"type": "custom", "custom": {...}}``); ``ChatFormatError`` naming the first
    field that is not."""
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise ChatFormatError(f"'tools' must be an array of objects, got {shown(tools)}",
                              param="tools")
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, Mapping):
            raise ChatFormatError(f"{where} must be an object, got {shown(tool)}", param=where)
        kind = tool.get("type", "function")
        if kind == "custom":
            custom = tool.get("custom")
            if not isinstance(custom, Mapping):
                raise ChatFormatError(f"{where}.custom must be an object ({{'name': ...}}), "
                                      f"got {shown(custom)}", param=f"{where}.custom")
            continue
        if kind != "function":
            raise ChatFormatError(f"{where}.type must be 'function' or 'custom', got "
                                  f"{shown(kind)}", param=f"{where}.type")
        fn = tool.get("function")
        if not isinstance(fn, Mapping):
            raise ChatFormatError(f"{where}.function must be an object ({{'name': ..., "
                                  f"'parameters': {{...}}}}), got {shown(fn)}",
                                  param=f"{where}.function")
        for key, types, what in (("name", str, "a string"),
                                 ("description", (str, type(None)), "a string"),
                                 ("parameters", (Mapping, type(None)), "an object")):
            value = fn.get(key)
            if not isinstance(value, types):
                raise ChatFormatError(f"{where}.function.{key} must be {what}, got "
                                      f"{shown(value)}", param=f"{where}.function.{key}")
    return tools


def normalize_messages(messages: Sequence[Any], hash_media: bool = True,
                       lenient: bool = False) -> list[dict[str, Any]]:
    """Check OpenAI chat messages; returns them as plain ``{role, content}`` dicts, with an
    assistant turn's ``tool_calls`` and ``reasoning`` (vLLM's field: the thinking a client
    gives back, which templates of interleaved thinking render), a tool turn's
    ``tool_call_id`` and a message's ``name`` where given (a chat template renders them:
    without them, a history's calls would all read the same). With
    ``hash_media`` False, media parts are checked but not hashed: their placeholders have
    the right length and a zero digest (for validation and length estimates).

    A message's parts are joined by newlines, as vLLM joins them for a chat template
    that takes text; a text part whose text is null or empty is left out (vLLM skips it),
    and one without its text is refused, as vLLM's schema requires the field.
    The texts and placeholders are also kept, as a tuple under :data:`PARTS`, for a
    template that reads a message's content as parts (``kvwire.chat_template``).

    ``lenient`` (the gateway, which forwards the request for its replica to judge): a
    content part of a type this module does not know (``input_image``, embeddings of
    audio or video), or a media part named by its ``uuid`` alone (vLLM's cache of media
    it has seen), stands in the prompt as a placeholder derived from the whole part
    (``opaque_placeholder``) instead of being refused; a media part that is malformed (an
    empty URL) is refused either way, and the engine, which must serve what it reads, is
    strict."""
    normalized = [_normalize_message(m, i, hash_media, lenient)
                  for i, m in enumerate(messages)]
    if not normalized:
        raise ChatFormatError("messages must contain at least one message")
    return normalized


def _normalize_message(message: Any, index: int, hash_media: bool, lenient: bool
                       ) -> dict[str, Any]:
    if not isinstance(message, Mapping):
        raise ChatFormatError(f"messages[{index}] must be an object, got {shown(message)}",
                              param=f"messages[{index}]")
    role = message.get("role")
    if not isinstance(role, str) or not role:
        raise ChatFormatError(f"messages[{index}].role must be a non-empty string, got "
                              f"{shown(role)}", param=f"messages[{index}].role")
    content = message.get("content", "")
    if content is None:
        content = ""
    parts = message.get(PARTS)  # normalized already (rendered after routing read it)
    if isinstance(content, list):  # content parts, in order: text, or media placeholders
        texts = []
        for j, part in enumerate(content):
            where = f"messages[{index}].content[{j}]"
            if isinstance(part, str):  # a bare string is a text part
                if part:
                    texts.append(part)
                continue
            kind = part.get("type") if isinstance(part, Mapping) else None
            if kind is None and isinstance(part, Mapping):
                kind = next((k for k in _TEXT_PARTS if k in part), None)
            field = _TEXT_PARTS.get(kind) if isinstance(kind, str) else None
            if field is not None:
                assert isinstance(part, Mapping)
                if field not in part:  # a field vLLM's schema requires
                    raise ChatFormatError(f"{where}.{field} is required in a {kind!r} part, "
                                          f"got {shown(part)}", param=f"{where}.{field}")
                text = part[field]
                if text is None:
                    text = ""
                if not isinstance(text, str):
                    raise ChatFormatError(f"{where}.{field} must be a string, got "
                                          f"{shown(text)}", param=f"{where}.{field}")
                if text:  # vLLM leaves an empty text out (no empty line for it)
                    texts.append(text)
                continue
            if media_type(part) is not None:
                assert isinstance(part, Mapping)
                try:
                    texts.append(placeholder(part, where, hash_media))
                except MediaPartError as exc:
                    if not (lenient and part.get("uuid") is not None):
                        raise ChatFormatError(str(exc), param=exc.field) from None
                    # media named by its uuid alone (vLLM's cache of media it has seen)
                    texts.append(opaque_placeholder(part, hash_media))
            elif lenient and isinstance(part, Mapping):
                texts.append(opaque_placeholder(part, hash_media))
            else:
                raise ChatFormatError(
                    f"{where} must be a text, refusal, thinking, image_url, image_embeds, "
                    f"input_audio, audio_url or video_url part ({{'type': 'text', 'text': "
                    f"...}}), got type {shown(kind)}", param=where)
        parts = tuple(texts)
        content = "\n".join(texts)  # as vLLM gives a chat template a message of parts
    if not isinstance(content, str):
        raise ChatFormatError(f"messages[{index}].content must be a string or a list of "
                              f"parts, got {shown(content)}", param=f"messages[{index}].content")
    out: dict[str, Any] = {"role": role, "content": content}
    if isinstance(parts, tuple):
        out[PARTS] = parts
    calls = message.get("tool_calls")
    if calls is not None:
        out["tool_calls"] = _tool_calls(calls, f"messages[{index}].tool_calls")
    reasoning = message.get("reasoning")  # an assistant turn's thinking, given back
    if reasoning is not None and role == "assistant":
        if not isinstance(reasoning, str):
            raise ChatFormatError(f"messages[{index}].reasoning must be a string, got "
                                  f"{shown(reasoning)}", param=f"messages[{index}].reasoning")
        out["reasoning"] = reasoning
    call_id = message.get("tool_call_id")
    if call_id is not None:
        if not isinstance(call_id, str):
            raise ChatFormatError(f"messages[{index}].tool_call_id must be a string, got "
                                  f"{shown(call_id)}", param=f"messages[{index}].tool_call_id")
        out["tool_call_id"] = call_id
    name = message.get("name")  # a participant's name, which some templates render
    if name is not None:
        if not isinstance(name, str):
            raise ChatFormatError(f"messages[{index}].name must be a string, got {shown(name)}",
                                  param=f"messages[{index}].name")
        out["name"] = name
    return out


def _tool_calls(calls: Any, where: str) -> list[dict[str, Any]]:
    """An assistant turn's ``tool_calls``: a list of ``{id, type: function, function:
    {name, arguments}}``, the id, name and arguments strings. A call without its ``id``
    or its ``arguments`` is refused, as vLLM refuses it (OpenAI's schema requires both): a
    template that writes ``call.id`` would otherwise read it as null, and Jinja writes
    that ``None``; a call with no arguments says so with ``"{}"`` (or ``""``)."""
    if not isinstance(calls, list):
        raise ChatFormatError(f"{where} must be an array of tool calls, got {shown(calls)}",
                              param=where)
    out = []
    for j, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str) \
                or not isinstance(fn.get("arguments", ""), str):
            raise ChatFormatError(
                f"{where}[{j}] must be {{'type': 'function', 'function': {{'name': ..., "
                f"'arguments': '<JSON text>'}}}}, got {shown(call)}", param=f"{where}[{j}]")
        if "arguments" not in fn:
            raise ChatFormatError(f"{where}[{j}].function.arguments is required (the call's "
                                  f"arguments as JSON text, '{{}}' for none), got "
                                  f"{shown(fn)}", param=f"{where}[{j}].function.arguments")
        call_id = call.get("id")
        if not isinstance(call_id, str):
            raise ChatFormatError(f"{where}[{j}].id must be a string (the call's id, which "
                                  f"the tool message's tool_call_id names), got "
                                  f"{shown(call_id)}", param=f"{where}[{j}].id")
        out.append({"id": call_id, "type": "function",
                    "function": {"name": fn["name"], "arguments": fn["arguments"]}})
    return out
