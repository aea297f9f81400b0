"""A Responses input item's ids and a content part's text are strings, as OpenAI's schema
(and vLLM's request model, which refuses anything else) has them: a value of another type
is a 400 naming the field and the value, not written into the chat with ``str()`` (a
number read as an id, a nested array's ``repr`` a RecursionError and a 500) nor a part
left out unseen."""

from __future__ import annotations

from typing import Any

import pytest

from kvwire.openai_schema import BadRequest
from kvwire.responses_input import responses_chat
from tests.support.nesting import nested


def _call(**given: Any) -> dict[str, Any]:
    return {"type": "function_call", "name": "f", "arguments": "{}", **given}


def _output(**given: Any) -> dict[str, Any]:
    return {"type": "function_call_output", "output": "ok", **given}


def _message(part: dict[str, Any]) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "input_text", "text": "see"}, part]}


@pytest.mark.parametrize(("item", "param", "shown"), [
    (_call(call_id=nested(1000)), "input[0].call_id", "an array of 1"),
    (_call(call_id=7), "input[0].call_id", "7"),
    (_call(id={"a": 1}), "input[0].id", "an object {'a'}"),
    (_output(call_id=nested(1000)), "input[0].call_id", "an array of 1"),
    (_output(call_id=7.5), "input[0].call_id", "7.5"),
    (_message({"type": "input_image", "file_id": nested(1000)}),
     "input[0].content[1].file_id", "an array of 1"),
    (_message({"type": "input_image", "image_url": {"url": "https://x/a.png"}}),
     "input[0].content[1].image_url", "an object {'url'}"),  # the chat's shape
    (_message({"type": "input_text", "text": 5}), "input[0].content[1].text", "5"),
    (_message({"type": "refusal", "refusal": ["no"]}), "input[0].content[1].refusal",
     "an array of 1"),
])
def test_an_item_field_of_another_type_is_a_bad_request_naming_it(
        item: dict[str, Any], param: str, shown: str) -> None:
    with pytest.raises(BadRequest) as err:
        responses_chat({"input": [item]})
    assert err.value.param == param
    assert param in err.value.message and shown in err.value.message


def test_string_ids_and_texts_are_read_as_before() -> None:
    chat = responses_chat({"input": [
        _message({"type": "input_image", "file_id": "file-1"}),
        _call(call_id="c1"), _call(id="fc2"),
        _output(call_id="c1"), _output(call_id=None),
    ]})
    assert chat.turns == [
        {"role": "user", "content": "see\n[image file-1]"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}},
            {"id": "fc2", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
        {"role": "tool", "tool_call_id": "", "content": "ok"},
    ]
