"""A tool call's ``function.arguments`` is a field vLLM's chat request model requires
(OpenAI's schema, ``Required[str]``): a call without it is a 400 there, naming it; it was
read as no arguments (``{}`` in the prompt)."""

from __future__ import annotations

from typing import Any

import pytest

from kvwire.chat_messages import ChatFormatError, normalize_messages
from kvwire.openai_schema import BadRequest, parse_fields


def _call(function: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"role": "user", "content": "weather?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function",
                 "function": {"name": "now", "arguments": "{}"}},
                {"id": "c2", "type": "function", "function": function}]},
            {"role": "tool", "tool_call_id": "c2", "content": "sunny"}]


@pytest.mark.parametrize("lenient", [False, True])
def test_a_tool_call_without_arguments_is_refused_naming_it(lenient: bool) -> None:
    messages = _call({"name": "get_weather"})
    where = "messages[1].tool_calls[1].function.arguments"
    with pytest.raises(ChatFormatError) as caught:
        normalize_messages(messages, hash_media=False, lenient=lenient)
    assert caught.value.param == where and where in str(caught.value)
    with pytest.raises(BadRequest) as answered:
        parse_fields({"messages": messages}, chat=True, lenient=lenient)
    assert answered.value.status == 400 and answered.value.param == where


def test_a_tool_call_with_empty_arguments_is_still_read() -> None:
    # vLLM's schema takes "" (a string), and reads it as no arguments
    (_, assistant, _) = normalize_messages(_call({"name": "get_weather", "arguments": ""}))
    assert assistant["tool_calls"][1]["function"] == {"name": "get_weather", "arguments": ""}
