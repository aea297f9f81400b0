"""The Triton store and paged-attention kernels (interpreted, fp32) against the torch
reference and a float64 explicit-softmax oracle, on random paged layouts."""

from __future__ import annotations

import math
import zlib

import pytest
import torch

from engine.kernels import build_metadata, reference, triton_ops
from engine.kernels.metadata import AttentionMetadata

HEAD_DIM = 16
BLOCK_SIZE = 4


def _layout(
    gen: torch.Generator, seqs: list[tuple[int, int]], num_blocks: int
) -> tuple[AttentionMetadata, list[list[int]]]:
    """``seqs``: (cached, new) token counts. Blocks are drawn at random without reuse."""
    perm = torch.randperm(num_blocks, generator=gen).tolist()
    layout, tables = [], []
    for cached, new in seqs:
        need = -(-(cached + new) // BLOCK_SIZE)
        blocks, perm = perm[:need], perm[need:]
        tables.append(blocks)
        layout.append((cached, new, blocks))
    return build_metadata(layout, BLOCK_SIZE), tables


def _random_cache(gen: torch.Generator, num_blocks: int, kv_heads: int) -> torch.Tensor:
    return torch.randn(num_blocks, BLOCK_SIZE, kv_heads, HEAD_DIM, generator=gen)


CASES = {
    # name: (query heads, kv heads, [(cached, new) per sequence])
    "prefill_odd_mha": (2, 2, [(0, 7), (0, 13)]),
    "prefix_hit_mid_block_gqa2": (4, 2, [(6, 5), (0, 3)]),
    "prefix_hit_on_boundary_gqa4": (4, 1, [(8, 9)]),
    "decode_mixed_gqa4": (8, 2, [(11, 1), (4, 1), (0, 1), (17, 1)]),
    "chunked_and_decode_gqa2": (4, 2, [(12, 6), (20, 1), (3, 2)]),
    "group_three": (6, 2, [(5, 4)]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_paged_attention_matches_reference(case: str) -> None:
    heads, kv_heads, seqs = CASES[case]
    gen = torch.Generator().manual_seed(zlib.crc32(case.encode()))
    num_blocks = 24
    meta, _ = _layout(gen, seqs, num_blocks)
    k_cache = _random_cache(gen, num_blocks, kv_heads)
    v_cache = _random_cache(gen, num_blocks, kv_heads)
    query = torch.randn(meta.query_start_host[-1], heads, HEAD_DIM, generator=gen)
    scale = 1 / math.sqrt(HEAD_DIM)
    got = triton_ops.paged_attention(query, k_cache, v_cache, meta, scale, block_m=16,
                                     block_n=16)
    oracle = reference.naive_attention(query, k_cache, v_cache, meta, scale)
    ref = reference.paged_attention(query, k_cache, v_cache, meta, scale)
    torch.testing.assert_close(ref, oracle, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(got, oracle, atol=2e-5, rtol=1e-5)


def test_small_key_tiles_cross_block_boundaries() -> None:
    """BLOCK_N larger than the cache block: one tile gathers several blocks."""
    gen = torch.Generator().manual_seed(3)
    meta, _ = _layout(gen, [(9, 14)], 16)
    k_cache, v_cache = _random_cache(gen, 16, 2), _random_cache(gen, 16, 2)
    query = torch.randn(14, 4, HEAD_DIM, generator=gen)
    got = triton_ops.paged_attention(query, k_cache, v_cache, meta, 0.3, block_m=32,
                                     block_n=32)
    torch.testing.assert_close(got, reference.naive_attention(query, k_cache, v_cache,
                                                              meta, 0.3),
                               atol=2e-5, rtol=1e-5)


def test_padding_rows_stay_zero() -> None:
    gen = torch.Generator().manual_seed(5)
    meta, _ = _layout(gen, [(3, 2)], 8)
    k_cache, v_cache = _random_cache(gen, 8, 1), _random_cache(gen, 8, 1)
    query = torch.randn(4, 2, HEAD_DIM, generator=gen)  # 2 real rows + 2 padding rows
    got = triton_ops.paged_attention(query, k_cache, v_cache, meta, 0.25, block_m=16,
                                     block_n=16)
    assert torch.count_nonzero(got[2:]) == 0
    torch.testing.assert_close(got[:2], reference.naive_attention(
        query[:2], k_cache, v_cache, meta, 0.25), atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("kv_heads", [1, 3])
def test_store_kv_matches_reference_and_skips_padding(kv_heads: int) -> None:
    gen = torch.Generator().manual_seed(kv_heads)
    num_blocks, tokens = 6, 9
    key = torch.randn(tokens, kv_heads, HEAD_DIM, generator=gen)
    value = torch.randn(tokens, kv_heads, HEAD_DIM, generator=gen)
    slots = torch.randperm(num_blocks * BLOCK_SIZE, generator=gen)[:tokens]
    slots[[2, 7]] = -1
    caches = [torch.full((num_blocks, BLOCK_SIZE, kv_heads, HEAD_DIM), 7.0) for _ in range(4)]
    triton_ops.store_kv(key, value, caches[0], caches[1], slots)
    reference.store_kv(key, value, caches[2], caches[3], slots)
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])
    flat = caches[0].view(-1, kv_heads, HEAD_DIM)
    for t in range(tokens):
        if slots[t] >= 0:
            assert torch.equal(flat[slots[t]], key[t])
    untouched = torch.ones(num_blocks * BLOCK_SIZE, dtype=torch.bool)
    untouched[slots[slots >= 0]] = False
    assert torch.all(flat[untouched] == 7.0)


def test_wrappers_reject_bad_inputs() -> None:
    cache = torch.zeros(4, BLOCK_SIZE, 2, HEAD_DIM)
    key = torch.zeros(3, 2, HEAD_DIM)
    with pytest.raises(ValueError, match="slot_mapping must be int64"):
        triton_ops.store_kv(key, key, cache, cache, torch.zeros(3, dtype=torch.int32))
    with pytest.raises(ValueError, match="do not fit"):
        triton_ops.store_kv(torch.zeros(3, 4, HEAD_DIM), key, cache, cache,
                            torch.zeros(3, dtype=torch.int64))
    meta = build_metadata([(0, 3, [0])], BLOCK_SIZE)
    with pytest.raises(ValueError, match="does not fit"):
        triton_ops.paged_attention(torch.zeros(3, 3, HEAD_DIM), cache, cache, meta, 1.0)


def test_fewer_query_rows_than_the_metadata_spans_are_refused() -> None:
    cache = torch.zeros(4, BLOCK_SIZE, 2, HEAD_DIM)
    meta = build_metadata([(0, 3, [0]), (0, 2, [1])], BLOCK_SIZE)
    query = torch.zeros(4, 2, HEAD_DIM)  # the sequences span 5 rows
    for attend in (triton_ops.paged_attention, reference.paged_attention):
        with pytest.raises(ValueError, match="4 rows but the metadata's sequences span 5"):
            attend(query, cache, cache, meta, 1.0)
