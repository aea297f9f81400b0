"""The exact KV index keeps matching LoRA adapters past the first ``MAX_ADAPTERS`` names
it heard of: a fleet that loads adapters at runtime names more of them over its life,
and each later one's cached blocks were never found again."""

from __future__ import annotations

from kvwire.kv_event_format import BlockStored
from policies.kv_index import MAX_ADAPTERS, KVIndex

BS = 4
TOKENS = list(range(3 * BS))


def _stored(index: KVIndex, replica: str, first_hash: int, adapter: str) -> None:
    index.apply_event(replica, BlockStored((first_hash, first_hash + 1), None,
                                           tuple(TOKENS[: 2 * BS]), BS, lora_name=adapter))


def test_adapters_named_after_the_first_thousands_are_still_matched() -> None:
    index = KVIndex(BS)
    for i in range(MAX_ADAPTERS):  # adapters loaded, used and unloaded long ago
        _stored(index, "old", 10 * i, f"tenant-{i}")
    _stored(index, "r", 7, "tenant-new")
    index.check_integrity()
    # a request naming it finds its blocks: as an adapter the fleet lists, and as a name
    # the gateway does not know (its replica's model list cut short)
    assert index.match(TOKENS, ["r"], model="tenant-new", adapter=True) == {"r": 2}
    assert index.match(TOKENS, ["r"], model="tenant-new") == {"r": 2}
    # the base model's blocks are no hit for it, nor its blocks for the base model
    _stored(index, "base", 99, "")
    assert index.match(TOKENS, ["base"], model="tenant-new") == {"base": 0}
    assert index.match(TOKENS, ["r"], model="base-model") == {"r": 0}
    # an adapter stored again lately is kept over those not heard of for longest
    _stored(index, "old", 5, "tenant-1")
    for i in range(MAX_ADAPTERS - 2):
        _stored(index, "old", 10 * i, f"tenant-more-{i}")
    assert index.match(TOKENS, ["old"], model="tenant-1")["old"] == 2
    assert index.match(TOKENS, ["old"], model="tenant-2")["old"] == 0  # let go: base's
    index.check_integrity()
