"""A ``custom`` tool without its ``custom`` object is refused naming that field, not its
``type`` (which it has right)."""

from __future__ import annotations

import pytest

from kvwire.openai_schema import BadRequest, parse_fields

CHAT = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(("tool", "named"), [
    ({"type": "custom"}, "None"),
    ({"type": "custom", "custom": "grammar"}, "'grammar'"),
    ({"type": "custom", "custom": [1]}, "an array of 1"),
])
def test_a_custom_tool_without_its_object_is_refused_naming_it(tool: dict[str, object],
                                                               named: str) -> None:
    ok = {"type": "function", "function": {"name": "f"}}
    with pytest.raises(BadRequest) as refused:
        parse_fields({"messages": CHAT, "tools": [ok, tool]}, chat=True)
    assert refused.value.param == "tools[1].custom"
    assert refused.value.message.startswith("tools[1].custom must be an object")
    assert refused.value.message.endswith(f"got {named}")


def test_a_custom_tool_with_its_object_is_taken() -> None:
    tools = [{"type": "custom", "custom": {"name": "sql"}}]
    assert parse_fields({"messages": CHAT, "tools": tools}, chat=True).tools == tools
