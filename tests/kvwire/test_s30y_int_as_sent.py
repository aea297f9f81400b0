"""An integer field's value past 64 bits is named as the client wrote it: orjson reads such
a literal as a float, and its error said ``got 1.1805916207174113e+21`` for a seed of
2**70 sent."""

from __future__ import annotations

import httpx
import pytest

from engine.server import EngineServer, build_app
from kvwire.openai_schema import BadRequest, json_object, optional
from kvwire.tokenizer import load_tokenizer
from tests.support.engine_cores import make_core


def _refused(raw: bytes, key: str) -> str:
    with pytest.raises(BadRequest) as caught:
        optional(json_object(raw), key, int, None)
    assert caught.value.param == key
    return caught.value.message


@pytest.mark.parametrize("literal", [
    str(1 << 70), str(-(1 << 70)), str(-(1 << 63) - 1), str((1 << 64) + 1),
    "123456789012345678901234567890123456789",
])
def test_an_integer_past_64_bits_is_named_by_its_digits(literal: str) -> None:
    message = _refused(f'{{"prompt": "hi", "seed": {literal}}}'.encode(), "seed")
    assert f"got {literal}" in message and "e+" not in message


def test_the_field_itself_is_named_not_another_of_its_name() -> None:
    raw = (b'{"tools": [{"seed": 1000000000000000000000000000000}], "sampling": {"seed": 7'
           b'},\n  "seed" :\t1180591620717411303424}')
    assert f"got {1 << 70}" in _refused(raw, "seed")
    # two of its name that read as the same float: the float, never the other's digits
    alike = (b'{"tools": [{"seed": 1180591620717411303425}], '
             b'"seed": 1180591620717411303424}')
    assert "got 1.1805916207174113e+21" in _refused(alike, "seed")


def test_a_number_sent_as_a_float_stays_a_float_and_a_huge_integer_is_sized() -> None:
    assert "got 1.2e+21" in _refused(b'{"seed": 1.2e21}', "seed")
    assert "got 1.1805916207174113e+21" in _refused(b'{"seed": 1180591620717411303424.0}',
                                                    "seed")
    huge = _refused(b'{"max_tokens": 1' + b"0" * 300 + b"}", "max_tokens")
    assert "an integer of 301 digits" in huge and "1e+300" in huge


async def test_the_engine_names_a_seed_of_2_to_the_70_as_sent() -> None:
    server = EngineServer(make_core(vocab=(259, 4096)), load_tokenizer(None),
                          model_name="tiny", sleep_modeled_time=False)
    transport = httpx.ASGITransport(app=build_app(server))
    seed = 1 << 70
    async with httpx.AsyncClient(transport=transport, base_url="http://engine") as http:
        for path, body in [
            ("/v1/completions", b'{"prompt": "hi", "max_tokens": 1, "seed": %d}' % seed),
            ("/generate", b'{"text": "hi", "sampling_params": {"sampling_seed": %d}}'
             % seed),
        ]:
            r = await http.post(path, content=body,
                                headers={"content-type": "application/json"})
            assert r.status_code == 400, r.text
            assert f"got {seed}" in r.json()["error"]["message"], r.text
