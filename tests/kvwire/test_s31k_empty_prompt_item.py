"""A completion's array of prompts with an empty one: the error names which item
(``prompt[1]``), in its message and its ``param``; which requests are taken is unchanged."""

from __future__ import annotations

from typing import Any

import pytest

from kvwire.openai_schema import BadRequest, parse_fields


def _refused(prompt: Any, lenient: bool) -> dict[str, Any]:
    with pytest.raises(BadRequest) as caught:
        parse_fields({"model": "m", "prompt": prompt}, chat=False, lenient=lenient)
    error: dict[str, Any] = caught.value.body()["error"]
    return error


@pytest.mark.parametrize("lenient", [False, True])  # the engine's check, the gateway's
@pytest.mark.parametrize(("prompt", "index"), [(["a", ""], 1), (["", "a"], 0),
                                               (["a", "b", "c", ""], 3)])
def test_the_empty_prompt_of_an_array_is_named(prompt: list[str], index: int,
                                               lenient: bool) -> None:
    error = _refused(prompt, lenient)
    assert error["message"] == f"prompt[{index}] must not be empty"
    assert error["param"] == f"prompt[{index}]"
    assert error["type"] == "invalid_request_error"


def test_an_empty_prompt_string_and_good_arrays_are_as_before() -> None:
    error = _refused("", False)
    assert (error["message"], error["param"]) == ("'prompt' must not be empty", "prompt")
    fields = parse_fields({"model": "m", "prompt": ["a", "b"]}, chat=False)
    assert (fields.prompt_text, fields.num_prompts) == ("a", 2)
