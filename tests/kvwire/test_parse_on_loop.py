"""``parses_on_loop``: a body is decoded on the event loop when it is small in bytes and in
items (its commas), whichever way its commas are counted."""

import random

import pytest

from kvwire.request_edge import PARSE_ON_THREAD_BYTES, PARSE_ON_THREAD_COMMAS, parses_on_loop


@pytest.mark.parametrize("size", [10, 4096, 4097, 30_000, PARSE_ON_THREAD_BYTES])
def test_the_comma_bound_is_the_same_for_small_and_large_bodies(size: int) -> None:
    rng = random.Random(size)
    bound = PARSE_ON_THREAD_COMMAS
    for commas in (0, bound, bound + 1, 2 * bound):
        commas = min(commas, size)
        body = bytearray(b"{\"p\": \"" + b"x" * max(0, size - 8) + b"\"}")[:size]
        for at in rng.sample(range(size), commas):
            body[at] = ord(",")
        raw = bytes(body)
        assert parses_on_loop(raw) == (raw.count(b",") <= PARSE_ON_THREAD_COMMAS), \
            (size, commas)


def test_a_body_past_the_byte_bound_is_parsed_on_a_thread() -> None:
    assert not parses_on_loop(b" " * (PARSE_ON_THREAD_BYTES + 1))
    assert parses_on_loop(b" " * PARSE_ON_THREAD_BYTES)
