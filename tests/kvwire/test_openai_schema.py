"""Request fields read as vLLM's request models read them (pydantic, lax)."""

from __future__ import annotations

from typing import Any

import pytest

from kvwire.chat_messages import normalize_messages
from kvwire.openai_schema import BadRequest, decode_json, optional, parse_fields


@pytest.mark.parametrize(("value", "types", "read"), [
    (3.0, int, 3), ("3", int, 3), ("+3", int, 3), (" 12 ", int, 12),
    ("0.5", float, 0.5), ("2", (int, float), 2),
    ("true", bool, True), ("False", bool, False), ("1", bool, True), (0, bool, False),
    ("t", bool, True), ("N", bool, False),
])
def test_lax_values_are_read(value: Any, types: Any, read: Any) -> None:
    got = optional({"k": value}, "k", types, None)
    assert got == read and type(got) is type(read)


@pytest.mark.parametrize(("value", "types"), [
    (3.5, int), ("three", int), ("3.0", int), (True, int), ("nan", float), ("inf", float),
    ("maybe", bool), (2, bool), ([1], int),
])
def test_values_no_reading_makes_fit_are_refused(value: Any, types: Any) -> None:
    with pytest.raises(BadRequest) as bad:
        optional({"k": value}, "k", types, None)
    assert bad.value.param == "k" and bad.value.status == 400


@pytest.mark.parametrize("value", ["--3", "+-3", "\u00b2", "\u0661\u0662", "9" * 5000])
def test_a_number_no_int_reading_takes_is_a_400_naming_it(value: str) -> None:
    # signs doubled, digits that are not ASCII, more digits than Python converts: each
    # was passed to int(), whose ValueError answered 500
    with pytest.raises(BadRequest) as bad:
        parse_fields({"prompt": "x", "max_tokens": value}, chat=False)
    assert bad.value.param == "max_tokens" and value[:20] in bad.value.message


@pytest.mark.parametrize("echo", [True, "true", 1, "yes"])
def test_an_echoed_prompt_may_ask_for_no_token_however_echo_is_written(echo: Any) -> None:
    # vLLM and the engine read echo "true" as true; max_tokens 0 was then refused here
    fields = parse_fields({"prompt": "x", "echo": echo, "max_tokens": 0}, chat=False)
    assert fields.max_tokens == 0


def test_a_request_vllm_takes_is_taken() -> None:
    fields = parse_fields({"model": "m", "prompt": "x", "max_tokens": "3", "stream": "true",
                           "temperature": "0.5"}, chat=False)
    assert fields.stream is True


def test_a_body_with_a_byte_order_mark_is_read_as_vllm_reads_it() -> None:
    from kvwire.openai_schema import decode_json

    assert decode_json(b'\xef\xbb\xbf{"model": "m"}') == {"model": "m"}


def _deep(levels: int = 1015) -> bytes:
    return b"[" * levels + b"]" * levels  # within the JSON parser's 1,024 levels


@pytest.mark.parametrize(("where", "param"), [
    (b'"max_tokens": %s', "max_tokens"),
    (b'"stream": %s', "stream"),
    (b'"messages": [%s]', "messages[0]"),
    (b'"messages": [{"role": "user", "content": [{"type": %s}]}]', "messages[0].content[0]"),
])
def test_a_deeply_nested_value_is_a_400_naming_its_field(where: bytes, param: str) -> None:
    # the error's repr() of a value nested 1,000 levels deep raised RecursionError: 500
    body = decode_json(b'{"messages": [{"role": "user", "content": "x"}], '
                       + where % _deep() + b"}")
    with pytest.raises(BadRequest) as bad:
        parse_fields(body, chat=True)
    assert bad.value.param == param and "array of 1" in bad.value.message
    if param != "messages[0].content[0]":  # the gateway forwards a part it cannot read
        with pytest.raises(BadRequest) as bad:
            parse_fields(body, chat=True, lenient=True)
        assert bad.value.param == param and "array of 1" in bad.value.message


def test_a_deeply_nested_part_the_gateway_forwards_stands_by_a_digest() -> None:
    # the gateway reads a part of a type it does not know as a whole; nested past what
    # orjson writes, it was hashed through repr(), which raised RecursionError: 500
    def chat(value: bytes) -> list[Any]:
        return decode_json(b'[{"role": "user", "content": [{"type": "input_image", "x": '
                           + value + b'}, "and?"]}]')

    deep = normalize_messages(chat(_deep()), lenient=True)[0]["content"]
    assert deep.startswith("<|part:") and deep.endswith("|>\nand?")
    assert normalize_messages(chat(_deep()), lenient=True)[0]["content"] == deep
    assert normalize_messages(chat(_deep(1014)), lenient=True)[0]["content"] != deep


@pytest.mark.parametrize(("body", "param", "named"), [
    ({"model": 5}, "model", "got 5"),
    ({"cache_salt": ["s"]}, "cache_salt", "got an array of 1"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}, "f"]}, "tools[1]",
     "got 'f'"),
    ({"messages": {"role": "user"}}, "messages", "got an object {'role'}"),
    ({"messages": [{"role": 7, "content": "x"}]}, "messages[0].role", "got 7"),
    ({"messages": [{"role": "user", "content": 7.5}]}, "messages[0].content", "got 7.5"),
    ({"messages": [{"role": "tool", "content": "x", "tool_call_id": 9}]},
     "messages[0].tool_call_id", "got 9"),
    ({"messages": [{"role": "assistant", "content": None, "tool_calls": "call"}]},
     "messages[0].tool_calls", "got 'call'"),
    ({"messages": [{"role": "assistant", "content": None, "tool_calls": [{"id": 1}]}]},
     "messages[0].tool_calls[0]", "got an object {'id'}"),
    ({"prompt": [[1, 2], [3, -4]]}, "prompt", "prompt[1][1] = -4"),
    ({"prompt": "x" * 10_000, "max_tokens": "x" * 10_000}, "max_tokens", "'xxx"),
])
def test_a_refused_field_is_named_with_its_value(body: dict[str, Any], param: str,
                                                 named: str) -> None:
    chat = "prompt" not in body
    with pytest.raises(BadRequest) as bad:
        parse_fields({"messages": [{"role": "user", "content": "x"}], **body}
                     if chat else body, chat=chat)
    assert bad.value.param == param and named in bad.value.message
    assert len(bad.value.message) < 400


FIND = {"type": "function", "function": {"name": "find", "description": "Finds a clause.",
                                         "parameters": {"type": "object"}}}


@pytest.mark.parametrize(("tool", "param"), [
    ({"type": "web_search"}, "tools[1].type"),
    ({"type": "function"}, "tools[1].function"),
    ({"type": "function", "function": {"description": "no name"}}, "tools[1].function.name"),
    ({"type": "function", "function": {"name": 5}}, "tools[1].function.name"),
    ({"function": {"name": "f", "description": ["x"]}}, "tools[1].function.description"),
    ({"function": {"name": "f", "parameters": "{}"}}, "tools[1].function.parameters"),
])
def test_a_tool_vllms_request_model_refuses_is_a_400_naming_it(tool: Any, param: str) -> None:
    # any object was taken, and a tool with no name rendered into the model's prompt
    with pytest.raises(BadRequest) as bad:
        parse_fields({"messages": [{"role": "user", "content": "x"}], "tools": [FIND, tool]},
                     chat=True)
    assert bad.value.param == param


def test_the_tools_vllm_takes_are_taken() -> None:
    tools = [FIND, {"function": {"name": "now"}},  # type left out: a function
             {"type": "function", "function": {"name": "f", "description": None,
                                               "parameters": None, "strict": True}},
             {"type": "custom", "custom": {"name": "grammar_tool"}}]
    fields = parse_fields({"messages": [{"role": "user", "content": "x"}], "tools": tools},
                          chat=True)
    assert fields.tools == tools
