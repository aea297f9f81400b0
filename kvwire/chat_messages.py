"""OpenAI chat messages and tools as a request carries them, checked and normalized.

The gateway checks them when it parses a request, the engine when it validates one, and
the tokenizer renders the normalized form; all three read this module.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


class ChatFormatError(ValueError):
    """A chat message is malformed; the message names which one and why."""


def check_tools(tools: Any) -> list[Any] | None:
    """The request's ``tools`` (None when absent); ``ChatFormatError`` unless a list of
    objects."""
    if tools is None:
        return None
    if not isinstance(tools, list) or not all(isinstance(t, Mapping) for t in tools):
        raise ChatFormatError("'tools' must be an array of objects")
    return tools


def normalize_messages(messages: Sequence[Any]) -> list[dict[str, str]]:
    """Check OpenAI chat messages; returns them as plain ``{role, content}`` dicts."""
    normalized = [_normalize_message(m, i) for i, m in enumerate(messages)]
    if not normalized:
        raise ChatFormatError("messages must contain at least one message")
    return normalized


def _normalize_message(message: Any, index: int) -> dict[str, str]:
    if not isinstance(message, Mapping):
        raise ChatFormatError(f"messages[{index}] must be an object, got {message!r:.60}")
    role = message.get("role")
    if not isinstance(role, str) or not role:
        raise ChatFormatError(f"messages[{index}].role must be a non-empty string")
    content = message.get("content", "")
    if content is None:
        content = ""
    if isinstance(content, list):  # content parts: keep the text ones, in order
        texts = []
        for j, part in enumerate(content):
            if not isinstance(part, Mapping) or part.get("type") != "text":
                raise ChatFormatError(
                    f"messages[{index}].content[{j}] must be a text part "
                    f"({{'type': 'text', 'text': ...}})")
            texts.append(str(part.get("text", "")))
        content = "".join(texts)
    if not isinstance(content, str):
        raise ChatFormatError(f"messages[{index}].content must be a string or a list of parts")
    return {"role": role, "content": content}
