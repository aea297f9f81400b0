"""An integer field holds a signed 64-bit integer, as vLLM's request models (pydantic) take
one: a float beyond it is ``int_parsing_size`` there, and a JSON integer of many digits
reaches us as such a float (orjson reads one past 64 bits so)."""

from __future__ import annotations

from typing import Any

import pytest

from kvwire.openai_schema import BadRequest, json_object, optional, parse_fields

_BODIES = [
    (b'{"prompt": "hi", "max_tokens": 1e300}', "max_tokens", "1e+300"),
    (b'{"prompt": "hi", "max_tokens": 1' + b"0" * 300 + b"}", "max_tokens", "1e+300"),
    (b'{"prompt": "hi", "max_tokens": 9223372036854775808}', "max_tokens",
     "9223372036854775808"),
    (b'{"prompt": "hi", "max_tokens": "1' + b"0" * 300 + b'"}', "max_tokens", "'1000"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 1e19}',
     "max_completion_tokens", "1e+19"),
]


@pytest.mark.parametrize(("raw", "key", "named"), _BODIES)
def test_an_integer_field_beyond_64_bits_is_a_400_naming_it(raw: bytes, key: str,
                                                              named: str) -> None:
    body = json_object(raw)
    with pytest.raises(BadRequest) as caught:
        parse_fields(body, chat="messages" in body, lenient=True)
    assert caught.value.status == 400
    assert caught.value.param == key
    assert f"'{key}'" in caught.value.message and named in caught.value.message
    assert "64-bit" in caught.value.message


@pytest.mark.parametrize("value", [
    -9.223372036854775808e18, 9.223372036854775807e18,  # both are 2**63 in a float
    -(1 << 63) - 1, 1 << 63, "-9223372036854775809",
])
def test_the_lax_int_reader_refuses_values_past_int64(value: Any) -> None:
    with pytest.raises(BadRequest, match="64-bit"):
        optional({"n": value}, "n", int, None)


@pytest.mark.parametrize(("value", "read"), [
    ((1 << 63) - 1, (1 << 63) - 1), (-(1 << 63), -(1 << 63)),
    ("-9223372036854775808", -(1 << 63)), (4.0e18, 4 * 10**18),
])
def test_the_int64_edges_are_read(value: Any, read: int) -> None:
    got = optional({"n": value}, "n", int, None)
    assert got == read and type(got) is int


def test_a_float_field_still_takes_a_large_number() -> None:
    assert optional({"t": 1e300}, "t", (int, float), 1.0) == 1e300
    assert optional({"t": 1 << 70}, "t", (int, float), 1.0) == 1 << 70
