"""What ``_BYTES_PER_CONTAINER``'s comment says of the engine's own messages: the bytes
they spend per list, at their densest (BlockStored events of a salted chain's one block,
token ids under 128), and that a payload of about 100 KB of them decodes at a block size
of 1, where they spend fewer than the limit's 8."""

from __future__ import annotations

import msgpack
import pytest

from kvwire.kv_event_format import KVEventBatch, decode_payload, encode_payload, stored_runs

_HASH = 1 << 63  # a u64 digest: 9 bytes on the wire


def _lists(payload: bytes) -> int:
    seen = 0

    def count(value: object) -> object:
        nonlocal seen
        seen += 1
        return value

    msgpack.unpackb(payload, list_hook=count, object_hook=count)
    return seen


@pytest.mark.parametrize(("block_size", "event_bytes"), [(16, 54), (1, 37)])
def test_a_salted_chains_one_block_spends_what_the_comment_says(block_size: int,
                                                                event_bytes: int) -> None:
    (event,) = stored_runs([_HASH], [True], [1] * block_size, None, block_size, None, "s")
    empty = encode_payload(KVEventBatch(1.0, (), None))
    one = encode_payload(KVEventBatch(1.0, (event,), None))
    assert (len(one) - len(empty), _lists(one) - _lists(empty)) == (event_bytes, 5)


def test_a_hundred_kb_of_the_densest_events_at_a_block_size_of_one_decodes() -> None:
    (event,) = stored_runs([_HASH], [True], [1], None, 1, None, "s")
    batch = KVEventBatch(1.0, (event,) * 2700, None)
    payload = encode_payload(batch)
    assert len(payload) > 99_000 and len(payload) / _lists(payload) < 8
    assert decode_payload(payload) == batch
