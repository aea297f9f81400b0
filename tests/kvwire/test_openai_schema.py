"""Request fields read as vLLM's request models read them (pydantic, lax)."""

from __future__ import annotations

from typing import Any

import pytest

from kvwire.openai_schema import BadRequest, optional, parse_fields


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


def test_a_request_vllm_takes_is_taken() -> None:
    fields = parse_fields({"model": "m", "prompt": "x", "max_tokens": "3", "stream": "true",
                           "temperature": "0.5"}, chat=False)
    assert fields.stream is True


def test_a_body_with_a_byte_order_mark_is_read_as_vllm_reads_it() -> None:
    from kvwire.openai_schema import decode_json

    assert decode_json(b'\xef\xbb\xbf{"model": "m"}') == {"model": "m"}
