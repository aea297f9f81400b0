"""An error naming an integer past 64 bits names it as sent (orjson reads it as a float)
also when the body was decoded in one worker thread and is checked in another, or on the
event loop: as ``/v1/responses`` reads a large body (``_read`` in a thread) and parses the
chat it stands for in another."""

from __future__ import annotations

import asyncio

import pytest

from kvwire.openai_schema import BadRequest, checked_as_sent, decode_json, optional

LITERAL = "123456789012345678901234567890"
RAW = b'{"seed": ' + LITERAL.encode() + b"}"


async def test_a_check_apart_from_the_decoding_names_the_integer_as_sent() -> None:
    body = await asyncio.to_thread(decode_json, RAW)
    assert isinstance(body["seed"], float)

    def check() -> object:
        return optional(body, "seed", int, None)

    with pytest.raises(BadRequest, match=f"got {LITERAL}$"):
        await asyncio.to_thread(checked_as_sent, RAW, check)
    with pytest.raises(BadRequest, match=f"got {LITERAL}$"):
        checked_as_sent(RAW, check)
    # decoded and checked in one call: as before
    with pytest.raises(BadRequest, match=f"got {LITERAL}$"):
        await asyncio.to_thread(lambda: optional(decode_json(RAW), "seed", int, None))
