"""The engine's stored-block events name each block's extra hash keys as vLLM does: the
adapter on every block, and the cache salt after it on a salted chain's first block."""

from __future__ import annotations

from kvwire.kv_event_format import KVEventBatch, decode_payload, encode_payload, stored_runs

TOKENS = tuple(range(48))


def test_an_adapters_blocks_name_it_in_their_extra_keys_before_the_salt() -> None:
    (run,) = stored_runs([1, 2, 3], [True] * 3, TOKENS, None, 16, "sql-lora", "tenant-a")
    assert run.extra_keys == (("sql-lora", "tenant-a"), ("sql-lora",), ("sql-lora",))
    assert run.token_keyed() == 0  # the salt keys the whole chain
    (run,) = stored_runs([1, 2, 3], [True] * 3, TOKENS, None, 16, "sql-lora")
    assert run.extra_keys == (("sql-lora",),) * 3
    assert run.token_keyed() == 3
    # a later run of the chain: the adapter alone, no salt
    first, second = stored_runs([1, 2, 3], [True, False, True], TOKENS, None, 16,
                                "sql-lora", "tenant-a")
    assert first.extra_keys == (("sql-lora", "tenant-a"),)
    assert second.extra_keys == (("sql-lora",),) and second.parent_block_hash == 2
    (back,) = decode_payload(encode_payload(KVEventBatch(0.0, (second,)))).events
    assert back == second


def test_blocks_without_adapter_or_salt_carry_no_extra_keys() -> None:
    (run,) = stored_runs([1, 2], [True, True], TOKENS[:32], None, 16)
    assert run.extra_keys is None
    (run,) = stored_runs([1, 2], [True, True], TOKENS[:32], None, 16, None, "tenant-a")
    assert run.extra_keys == (("tenant-a",), None)
