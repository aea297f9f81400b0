"""KV event payloads in both of vLLM's forms: each decodes to what was encoded."""

import msgpack
import pytest

from kvwire.kv_event_format import (
    ENCODINGS,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    decode_payload,
    encode_payload,
)

BATCH = KVEventBatch(12.5, (BlockStored((1, 2**64 - 1), 7, tuple(range(32)), 16, None, "GPU"),
                            BlockRemoved((3,)), AllBlocksCleared()), 0)


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_each_form_decodes_to_the_batch_encoded(encoding):
    assert decode_payload(encode_payload(BATCH, encoding)) == BATCH


def test_the_map_form_tags_each_event_by_its_type_and_names_its_fields():
    ts, events, rank = msgpack.unpackb(encode_payload(BATCH, "map"))
    assert (ts, rank) == (12.5, 0)
    stored, removed, cleared = events
    assert stored == {"type": "BlockStored", "block_hashes": [1, 2**64 - 1],
                      "parent_block_hash": 7, "token_ids": list(range(32)), "block_size": 16,
                      "lora_id": None, "medium": "GPU", "lora_name": None}
    assert removed == {"type": "BlockRemoved", "block_hashes": [3], "medium": "GPU"}
    assert cleared == {"type": "AllBlocksCleared"}
    # the classic form: the same fields, in order, after the tag
    classic = msgpack.unpackb(encode_payload(BATCH))[1][0]
    assert classic == ["BlockStored", *list(stored.values())[1:]]


def test_an_unknown_encoding_is_refused():
    with pytest.raises(ValueError, match="'cbor'"):
        encode_payload(BATCH, "cbor")
