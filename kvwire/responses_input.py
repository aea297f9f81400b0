"""OpenAI's Responses API input as the chat it stands for, identical in the gateway (which
routes a Responses request as that chat) and in the engine (which runs it as one).

``instructions`` is a system message; ``input`` is a string (a user message) or items:
messages (``developer`` read as ``system``; text parts joined, an image standing by its
address), ``function_call`` items (an assistant message's tool call), ``reasoning`` items
(an assistant message's ``reasoning``, as a chat gives its thinking back) and
``function_call_output`` items (a tool message). As vLLM builds the chat, the items of
one assistant turn are one assistant message: a reasoning item joins the assistant
message before it that has no reasoning yet, a function call the assistant message before
it, an assistant message the one before it that has no content yet. A reasoning item's
``encrypted_content`` (which only its provider reads) is refused, as vLLM refuses it.
Items of other kinds (built-in tools' calls) are left out. Function ``tools`` take the
chat's shape (``{"type": "function", "function": {...}}``); built-in tools are left out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import orjson

from kvwire.chat_messages import ChatFormatError, check_tools
from kvwire.media_parts import shown
from kvwire.openai_schema import BadRequest, optional

_TEXT_PARTS = frozenset(("input_text", "output_text", "text", "refusal"))
_ROLES = {"developer": "system", "system": "system", "user": "user",
          "assistant": "assistant"}


class ResponsesChat(NamedTuple):
    """A Responses request's chat: ``instructions`` (its system message, if any), then
    ``turns`` (its input's messages), with ``tools`` in the chat's shape."""

    instructions: list[dict[str, Any]]
    turns: list[dict[str, Any]]
    tools: list[Any] | None


def responses_chat(body: Mapping[str, Any]) -> ResponsesChat:
    """The chat of a Responses request ``body``; BadRequest naming the first field that is
    wrong. ``input`` may be left out only by a request that continues a stored response
    (``previous_response_id``)."""
    instructions = optional(body, "instructions", str, None)
    optional(body, "previous_response_id", str, None)
    turns: list[dict[str, Any]] = []
    raw = body.get("input")
    if isinstance(raw, str):
        turns.append({"role": "user", "content": raw})
    elif isinstance(raw, list):
        for i, item in enumerate(raw):
            message = _item_message(item, f"input[{i}]")
            if message is not None and not _joined(turns, message):
                turns.append(message)
    elif raw is not None or body.get("previous_response_id") is None:
        raise BadRequest(f"'input' must be a string or an array of items, got {shown(raw)}",
                         param="input")
    try:
        tools = check_tools(_chat_tools(body.get("tools")))
    except ChatFormatError as exc:
        raise BadRequest(str(exc), param=exc.param or "tools") from exc
    system = [{"role": "system", "content": instructions}] if instructions else []
    return ResponsesChat(system, turns, tools)


def _item_message(item: Any, where: str) -> dict[str, Any] | None:
    """The chat message an ``input`` item stands for; None for an item of another
    kind."""
    if isinstance(item, str):
        return {"role": "user", "content": item}
    if not isinstance(item, Mapping):
        raise BadRequest(f"{where} must be an object or a string, got {shown(item)}",
                         param=where)
    kind = _kind(item, "message", where)
    if kind == "message":
        given = item.get("role")
        role = _ROLES.get(given) if isinstance(given, str) else None
        if role is None:
            raise BadRequest(f"{where}.role must be one of {sorted(_ROLES)}, got "
                             f"{shown(item.get('role'))}", param=f"{where}.role")
        return {"role": role, "content": _content(item.get("content"), f"{where}.content")}
    if kind == "function_call":
        name, arguments = item.get("name"), item.get("arguments")
        for key, value in (("name", name), ("arguments", arguments)):
            if not isinstance(value, str):
                raise BadRequest(f"{where}.{key} must be a string (a function_call's "
                                 f"{key}), got {shown(value)}", param=f"{where}.{key}")
        call_id = _text(item, "call_id", where) or _text(item, "id", where)
        call = {"id": call_id, "type": "function",
                "function": {"name": name, "arguments": arguments}}
        return {"role": "assistant", "content": "", "tool_calls": [call]}
    if kind == "reasoning":
        return _reasoning(item, where)
    if kind == "function_call_output":
        output = item.get("output")
        try:
            text = output if isinstance(output, str) else orjson.dumps(output).decode()
        except orjson.JSONEncodeError as exc:  # nested past the 254 levels it writes (a
            # body may nest 1024)
            raise BadRequest(f"{where}.output cannot be written as the tool message's "
                             f"text: {exc}", param=f"{where}.output") from None
        return {"role": "tool", "tool_call_id": _text(item, "call_id", where),
                "content": text}
    return None


def _reasoning(item: Mapping[str, Any], where: str) -> dict[str, Any] | None:
    """The assistant message a ``reasoning`` item stands for: its ``reasoning``, the
    texts of its ``content`` (the reasoning itself), else of its ``summary``, joined by
    newlines; None for an item with no text (nothing to carry). BadRequest naming its
    ``encrypted_content`` (the engine cannot read it) or a part that is no text."""
    if item.get("encrypted_content") is not None:
        raise BadRequest(f"{where}.encrypted_content is not supported: a reasoning item's "
                         f"encrypted content can be read only by its provider; give its "
                         f"content or summary instead", param=f"{where}.encrypted_content")
    texts: list[str] = []
    for key in ("content", "summary"):
        parts = item.get(key)
        if parts is None:
            continue
        if not isinstance(parts, list):
            raise BadRequest(f"{where}.{key} must be an array of text parts, got "
                             f"{shown(parts)}", param=f"{where}.{key}")
        for j, part in enumerate(parts):
            text = part.get("text") if isinstance(part, Mapping) else None
            if not isinstance(text, str):
                raise BadRequest(f"{where}.{key}[{j}] must be a text part ({{'type': ..., "
                                 f"'text': ...}}), got {shown(part)}",
                                 param=f"{where}.{key}[{j}]")
            texts.append(text)
        if any(texts):  # the reasoning's own text, over its summary
            break
    text = "\n".join(t for t in texts if t)
    return {"role": "assistant", "content": "", "reasoning": text} if text else None


def _joined(turns: list[dict[str, Any]], message: dict[str, Any]) -> bool:
    """Whether ``message`` (an assistant message of one input item) was joined to the
    last of ``turns``, as vLLM joins the items of one assistant turn: reasoning to an
    assistant message without reasoning, a tool call to an assistant message, content to
    an assistant message without content."""
    last = turns[-1] if turns else None
    if message["role"] != "assistant" or last is None or last["role"] != "assistant":
        return False
    if "reasoning" in message:
        if "reasoning" in last:
            return False
        last["reasoning"] = message["reasoning"]
    elif "tool_calls" in message:
        # in place: a list rebuilt per call made an input of n calls cost n squared
        last.setdefault("tool_calls", []).extend(message["tool_calls"])
    elif not last["content"]:
        last["content"] = message["content"]
    else:
        return False
    return True


def _content(content: Any, where: str) -> str | list[dict[str, Any]]:
    """A message's content in the chat's terms: a string, or its text parts joined (other
    parts are left out); with an ``input_image`` by address (a URL, a ``data:`` URL), the
    chat's parts, each image an ``image_url`` part as vLLM gives it, which the gateway and
    the engine read as media (a placeholder of its hash), never as text: a ``data:`` URL
    is megabytes of base64. An image by ``file_id`` alone stands by its id."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise BadRequest(f"{where} must be a string or an array of parts, got "
                         f"{shown(content)}", param=where)
    parts = _parts(content, where)
    if any(part["type"] == "image_url" for part in parts):
        return parts
    return "\n".join(part["text"] for part in parts)


def _parts(content: list[Any], where: str) -> list[dict[str, Any]]:
    """``content`` as the chat's parts: text parts as text, images by address as
    ``image_url`` parts, in their order (other parts left out)."""
    parts: list[dict[str, Any]] = []
    for j, part in enumerate(content):
        if not isinstance(part, Mapping):
            raise BadRequest(f"{where} parts must be objects, got {shown(part)}", param=where)
        kind = _kind(part, None, f"{where}[{j}]")
        if kind in _TEXT_PARTS:
            key = "refusal" if "text" not in part and "refusal" in part else "text"
            if key not in part:  # OpenAI's schema requires it, as the chat's does
                raise BadRequest(f"{where}[{j}] of type {kind!r} has no {key!r}",
                                 param=f"{where}[{j}].{key}")
            text = _text(part, key, f"{where}[{j}]")
            if part[key] is not None:  # a part whose text is null is left out
                parts.append({"type": "text", "text": text})
        elif kind == "input_image":
            url = _text(part, "image_url", f"{where}[{j}]")
            if url:
                image: dict[str, Any] = {"url": url}
                if isinstance(part.get("detail"), str):
                    image["detail"] = part["detail"]
                parts.append({"type": "image_url", "image_url": image})
            else:
                file_id = _text(part, "file_id", f"{where}[{j}]")
                parts.append({"type": "text", "text": f"[image {file_id}]"})
    return parts


def _text(item: Mapping[str, Any], key: str, where: str) -> str:
    """``item[key]``, a string as OpenAI's schema has it ("" when absent or null);
    BadRequest naming it when it is of another type (written with ``str()``, a number
    would pass for an id and a deeply nested array overflow the stack)."""
    value = item.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise BadRequest(f"{where}.{key} must be a string, got {shown(value)}",
                         param=f"{where}.{key}")
    return value


def _kind(item: Mapping[str, Any], default: str | None, where: str) -> str | None:
    """An item's or a part's ``type`` (``default`` when absent); BadRequest naming it when
    it is no string (an array or an object is no kind: left out, it would drop the item
    unseen, and looked up, fail as unhashable)."""
    kind = item.get("type", default)
    if kind is not None and not isinstance(kind, str):
        raise BadRequest(f"{where}.type must be a string, got {shown(kind)}",
                         param=f"{where}.type")
    return kind


def _chat_tools(tools: Any) -> Any:
    """Function ``tools`` in the chat's shape (``{"type": "function", "function":
    {...}}``); a Responses function tool is flat (``name``, ``parameters`` beside its
    type). Built-in tools (web search, file search...) are left out."""
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
