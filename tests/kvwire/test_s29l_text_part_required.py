"""A text part's text is a field vLLM's chat request model requires (OpenAI's schema,
``Required[str]``): a part without it is a 400 there, naming it; it was read as an empty
text, the part dropped unseen."""

from __future__ import annotations

from typing import Any

import pytest

from kvwire.chat_messages import ChatFormatError, normalize_messages
from kvwire.openai_schema import BadRequest, parse_fields


def _chat(*parts: Any) -> list[dict[str, Any]]:
    return [{"role": "system", "content": "be brief"}, {"role": "user", "content": list(parts)}]


@pytest.mark.parametrize(("part", "field"), [
    ({"type": "text"}, "text"), ({"type": "refusal"}, "refusal"),
    ({"type": "thinking"}, "thinking"), ({"type": "input_text"}, "text"),
])
@pytest.mark.parametrize("lenient", [False, True])
def test_a_text_part_without_its_text_is_refused_naming_it(part: dict[str, Any], field: str,
                                                           lenient: bool) -> None:
    messages = _chat({"type": "text", "text": "hello"}, part)
    with pytest.raises(ChatFormatError) as caught:
        normalize_messages(messages, hash_media=False, lenient=lenient)
    assert caught.value.param == f"messages[1].content[1].{field}"
    assert f"messages[1].content[1].{field}" in str(caught.value)
    with pytest.raises(BadRequest) as answered:
        parse_fields({"messages": messages}, chat=True, lenient=lenient)
    assert answered.value.status == 400
    assert answered.value.param == f"messages[1].content[1].{field}"


def test_a_text_part_with_its_text_is_still_read() -> None:
    (_, user) = normalize_messages(_chat({"type": "text", "text": "a"}, {"text": "b"}))
    assert user["content"] == "a\nb"
