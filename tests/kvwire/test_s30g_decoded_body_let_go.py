"""A body decoded on the event loop is not held by its request's task past the loop's
turn: its checks run there, right after the decoding, and name an integer past 64 bits as
it was sent; before, the task kept the body's bytes until the request ended (a stream's
whole life), outside the held bytes counted."""

from __future__ import annotations

import asyncio
import sys

import pytest

from kvwire.openai_schema import BadRequest, decode_json, optional

LITERAL = "123456789012345678901234567890"


async def test_a_body_decoded_on_the_loop_is_let_go_after_its_checks() -> None:
    raw = b'{"prompt": "hi", "seed": ' + LITERAL.encode() + b"}"
    before = sys.getrefcount(raw)
    body = decode_json(raw)
    with pytest.raises(BadRequest, match=f"got {LITERAL}$"):  # checked in the same turn
        optional(body, "seed", int, None)
    await asyncio.sleep(0)  # the request goes on (its stream)
    assert sys.getrefcount(raw) == before  # the bug: one more, the task's context
