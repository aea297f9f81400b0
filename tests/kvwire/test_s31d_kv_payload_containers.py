"""A KV event payload is refused, its decoding stopped, when it holds more lists and maps
than its size allows: one of a byte (an empty map) costs ~70 bytes to build, so a hostile
or broken engine's 4 MiB message of them took ~290 MiB to decode. The engine's own
messages, dense in small events or in blocks with extra keys, decode as before."""

from __future__ import annotations

import msgpack
import pytest

from kvwire.kv_event_format import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    KVWireError,
    decode_payload,
    encode_payload,
)


def _empty_maps(n: int) -> bytes:
    """A batch of one BlockStored whose extra keys are ``n`` empty maps (a byte each)."""
    ev = ["BlockStored", [1], None, list(range(16)), 16, None, "GPU", None, [{}]]
    one = msgpack.packb([0.0, [ev]])
    return one.replace(b"\x91\x80", b"\xdd" + n.to_bytes(4, "big") + b"\x80" * n)


@pytest.mark.parametrize("n", [1 << 14, 1 << 18])
def test_a_payload_of_empty_maps_is_refused_naming_its_size(n: int) -> None:
    payload = _empty_maps(n)
    with pytest.raises(KVWireError, match=rf"payload of {len(payload)} bytes holds more "
                                          r"than \d+ lists and maps"):
        decode_payload(payload)


def test_few_empty_maps_are_one_malformed_event_as_before() -> None:
    batch = decode_payload(_empty_maps(100))  # extra keys must be lists or nulls
    assert batch.malformed == 1 and batch.events == ()


@pytest.mark.parametrize("encoding", ["array", "map"])
def test_the_engines_densest_messages_decode(encoding: str) -> None:
    stored = tuple(
        BlockStored(tuple(range(1 << 60, (1 << 60) + 8)), None, tuple(range(8 * 8)), 8,
                    None, "GPU", "a", (("a",),) * 8) for _ in range(500))
    small = (BlockRemoved((1 << 63,)), AllBlocksCleared()) * 5000
    for events in (stored, small, stored + small):
        batch = KVEventBatch(1.0, events, 0)
        assert decode_payload(encode_payload(batch, encoding)) == batch
