"""A replica whose running requests are mostly decoding while others wait has a full
batch, though a request or two of them are still in prefill: a busy fleet whose prompts
share a cached prefix shows one in prefill at almost every scrape, and when none was
allowed its slot count was never learned, nor its slot wait counted."""

from __future__ import annotations

from policies.slots import DecodeSlots


def test_a_full_batch_is_learned_with_a_request_or_two_in_prefill() -> None:
    slots = DecodeSlots(confirm=3)
    for scrape in range(1, 4):
        slots.saw("r0", 8, waiting=3, prefilling=2, scrape=scrape)
    assert slots.limit("r0") == 8


def test_half_the_batch_in_prefill_is_a_wait_for_prefill() -> None:
    slots = DecodeSlots(confirm=3)
    for scrape in range(1, 6):
        slots.saw("r0", 8, waiting=3, prefilling=4, scrape=scrape)
        slots.saw("r1", 3, waiting=2, prefilling=2, scrape=scrape)
    assert slots.limit("r0") is None and slots.limit("r1") is None
