"""What the exact KV index keeps of a publisher's stream stays small whatever the stream
names: an adapter's name as long as a message allows is not kept, only its root key."""

from __future__ import annotations

import gc
import tracemalloc

import msgpack

from kvwire.kv_event_format import decode_payload
from policies.kv_index import KVIndex

BS = 4
TOKENS = list(range(2 * BS))
NAME_BYTES = 1 << 20


def _store_from_adapter(index: KVIndex, i: int) -> None:
    """Two blocks stored from an adapter whose name is ``NAME_BYTES`` long, decoded from
    the wire (the name a fresh string, dropped on return but for what the index keeps)."""
    name = "a" * NAME_BYTES + str(i)
    payload = msgpack.packb([0.0, [["BlockStored", [10 * i, 10 * i + 1], None, TOKENS, BS,
                                    None, "GPU", name]], 0], use_bin_type=True)
    (event,) = decode_payload(payload).events
    index.apply_event("r0", event)


def test_adapter_names_of_any_length_are_not_kept() -> None:
    index = KVIndex(BS)
    _store_from_adapter(index, 0)  # the index's maps made before measuring
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(1, 9):
            _store_from_adapter(index, i)
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    # eight names of 1 MiB each were kept whole (8 MiB) to match prompts by
    assert kept < NAME_BYTES // 4, f"{kept} bytes kept for 8 adapters"
    # each adapter's blocks are still found by its name, and not as the base model's
    name = "a" * NAME_BYTES + "5"
    assert index.match(TOKENS, ["r0"], model=name) == {"r0": 2}
    assert index.match(TOKENS, ["r0"]) == {"r0": 0}
    assert index.match(TOKENS, ["r0"], model="base-model") == {"r0": 0}
    index.check_integrity()
