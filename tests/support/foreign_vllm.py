"""What vLLM itself sends, built byte for byte as its current releases send it, for tests of
the gateway in front of replicas it did not write.

KV events: vLLM's publisher encodes its structs with msgspec as maps (no ``array_like``):
the batch ``{"ts", "events", "data_parallel_rank"}``, each event tagged by its ``"type"``,
fields left at their defaults omitted, and fields this project does not read
(``extra_keys``, ``group_idx``, ``kv_cache_spec_kind``) present. Its KV offloading
connector publishes the blocks it copies to CPU memory on the same stream, under the GPU
blocks' own hashes: ``medium`` "CPU", no token ids, no parent and block size 0.
"""

from __future__ import annotations

from typing import Any

import msgpack


def kv_message(seq: int, events: list[dict[str, Any]], rank: int = 0) -> list[bytes]:
    """One published message: ``[topic, seq (u64 BE), payload]`` with vLLM's empty topic."""
    payload = msgpack.packb({"ts": 1767225600.25, "events": events,
                             "data_parallel_rank": rank}, use_bin_type=True)
    return [b"", seq.to_bytes(8, "big"), payload]


def block_stored(hashes: list[int | bytes], parent: int | bytes | None,
                 token_ids: list[int], block_size: int = 16) -> dict[str, Any]:
    """A GPU block pool's ``BlockStored`` of full blocks, as a full-attention model's."""
    return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
            "token_ids": token_ids, "block_size": block_size, "lora_id": None,
            "medium": "GPU", "lora_name": None, "extra_keys": [None] * len(hashes),
            "group_idx": 0, "kv_cache_spec_kind": "full_attention"}


def block_removed(hashes: list[int | bytes], medium: str = "GPU") -> dict[str, Any]:
    return {"type": "BlockRemoved", "block_hashes": hashes, "medium": medium,
            "group_idx": 0}


def offloaded(hashes: list[int | bytes], medium: str = "CPU") -> dict[str, Any]:
    """The offloading connector's ``BlockStored``: blocks copied to another tier."""
    return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": None,
            "token_ids": [], "block_size": 0, "lora_id": None, "medium": medium,
            "lora_name": None}
