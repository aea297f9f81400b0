"""A request body that is not UTF-8 is refused naming the first byte that is not, and
where: orjson's own message ("surrogates not allowed", at the body's first byte) named
neither the fault nor its place."""

from __future__ import annotations

import pytest

from kvwire.openai_schema import BadRequest, decode_json


@pytest.mark.parametrize(("raw", "named"), [
    (b'{"model": "m", "prompt": "caf\xe9"}', "byte 0xe9 at offset 29"),  # Latin-1 text
    ('{"prompt": "x"}'.encode("utf-16"), "byte 0xff at offset 0"),
])
def test_a_body_that_is_not_utf8_is_refused_naming_where(raw: bytes, named: str) -> None:
    with pytest.raises(BadRequest) as refused:
        decode_json(raw)
    assert refused.value.code == "invalid_json"
    assert "not UTF-8" in refused.value.message and named in refused.value.message
    assert "surrogates" not in refused.value.message


def test_utf8_that_is_not_json_is_still_named_by_the_json_fault() -> None:
    with pytest.raises(BadRequest) as refused:
        decode_json('{"prompt": "café",}'.encode())
    assert "UTF-8" not in refused.value.message and "line 1" in refused.value.message
