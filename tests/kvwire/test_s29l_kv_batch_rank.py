"""A payload is written as vLLM's ``KVEventBatch`` is (msgspec, ``array_like`` and
``omit_defaults``): a batch of no data parallel rank is ``[ts, events]``, the rank (None
by default) left out; one of a rank is ``[ts, events, rank]``. It was always three items,
``None`` written for a rank; the decoder reads both."""

from __future__ import annotations

import msgpack
import pytest

from kvwire.kv_event_format import (
    ENCODINGS,
    AllBlocksCleared,
    BlockRemoved,
    KVEventBatch,
    decode_payload,
    encode_payload,
)

EVENTS = (BlockRemoved((3, 5)), AllBlocksCleared())


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_a_batch_of_no_rank_is_written_without_one(encoding: str) -> None:
    batch = KVEventBatch(12.5, EVENTS)
    payload = encode_payload(batch, encoding)
    ts, events = msgpack.unpackb(payload)  # two items, as msgspec omits the default rank
    assert ts == 12.5 and len(events) == 2
    assert decode_payload(payload) == batch


def test_the_bytes_are_vllms() -> None:
    # msgspec writes an array_like struct as a msgpack array of its fields, in order
    expected = msgpack.packb([12.5, [["BlockRemoved", [3, 5], "GPU"], ["AllBlocksCleared"]]])
    assert encode_payload(KVEventBatch(12.5, EVENTS)) == expected


@pytest.mark.parametrize("rank", [0, 3])
def test_a_batch_of_a_rank_carries_it(rank: int) -> None:
    payload = encode_payload(KVEventBatch(1.0, EVENTS, rank))
    assert msgpack.unpackb(payload)[2] == rank
    assert decode_payload(payload).data_parallel_rank == rank


def test_a_three_item_payload_of_a_null_rank_is_still_read() -> None:
    raw = msgpack.packb([2.0, [["AllBlocksCleared"]], None])
    assert decode_payload(raw) == KVEventBatch(2.0, (AllBlocksCleared(),))
