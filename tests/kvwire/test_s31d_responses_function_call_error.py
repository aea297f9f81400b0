"""A Responses ``function_call`` item whose name or arguments is no string is refused
naming that field and its value."""

from __future__ import annotations

import pytest

from kvwire.openai_schema import BadRequest
from kvwire.responses_input import responses_chat


@pytest.mark.parametrize(("call", "field", "named"), [
    ({"name": "lookup"}, "arguments", "None"),
    ({"name": "lookup", "arguments": {"q": 1}}, "arguments", "an object {'q'}"),
    ({"name": 7, "arguments": "{}"}, "name", "7"),
])
def test_a_function_call_with_a_bad_field_is_refused_naming_it(
        call: dict[str, object], field: str, named: str) -> None:
    item = {"type": "function_call", "call_id": "c1", **call}
    with pytest.raises(BadRequest) as refused:
        responses_chat({"input": ["hi", item]})
    assert refused.value.param == f"input[1].{field}"
    assert refused.value.message.startswith(f"input[1].{field} must be a string")
    assert refused.value.message.endswith(f"got {named}")


def test_a_well_formed_function_call_is_an_assistant_tool_call() -> None:
    item = {"type": "function_call", "call_id": "c1", "name": "lookup", "arguments": "{}"}
    turns = responses_chat({"input": ["hi", item]}).turns
    assert turns[-1]["tool_calls"][0]["function"] == {"name": "lookup", "arguments": "{}"}
