import pytest

from kvwire.openai_schema import BadRequest
from kvwire.responses_input import responses_chat


def test_an_input_text_part_without_its_text_is_refused_naming_it() -> None:
    # as a chat's text part without its text is (vLLM's schemas require the field)
    item = {"role": "user", "content": [{"type": "input_text", "text": "hi"},
                                        {"type": "input_text"}]}
    with pytest.raises(BadRequest) as refused:
        responses_chat({"input": [item]})
    assert refused.value.param.endswith("[1].text")


def test_an_input_text_part_whose_text_is_null_is_left_out() -> None:
    item = {"role": "user", "content": [{"type": "input_text", "text": "hi"},
                                        {"type": "input_text", "text": None}]}
    assert responses_chat({"input": [item]}).turns[-1]["content"] == "hi"
