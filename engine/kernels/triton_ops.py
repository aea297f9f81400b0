"""Triton kernels: the paged KV store and one causal paged attention for every step shape.

The attention kernel serves prefill, prefill after a prefix hit, chunked prefill and decode
alike: each program owns ``BLOCK_Q`` query tokens of one sequence times the ``GROUP`` query
heads that share one KV head (rows ``r = token * GROUP_PAD + head_in_group``), so a KV tile
is loaded once for the whole group. K/V tiles of ``BLOCK_N`` positions are gathered through
the block table position by position, so ``BLOCK_N`` is independent of the cache block size.

Grid: ``(num_seqs, cdiv(max_query_len, BLOCK_Q), num_kv_heads)``; programs past their
sequence's query length exit at once. Offsets into the caches and the token axis are int64.

Import only with a CUDA device or with ``TRITON_INTERPRET=1`` set before the first
``import triton``.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from engine.kernels.metadata import AttentionMetadata


@triton.jit
def _store_kv_kernel(
    key_ptr, value_ptr, key_cache_ptr, value_cache_ptr, slot_ptr,
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_kcb, stride_kcs, stride_kch, stride_vcb, stride_vcs, stride_vch,
    NUM_KV_HEADS: tl.constexpr, HEADS_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr, HEAD_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + token).to(tl.int64)
    if slot < 0:  # padding row
        return
    block = slot // BLOCK_SIZE
    offset = slot % BLOCK_SIZE
    h = tl.arange(0, HEADS_PAD)
    d = tl.arange(0, HEAD_PAD)
    mask = (h < NUM_KV_HEADS)[:, None] & (d < HEAD_DIM)[None, :]
    k = tl.load(key_ptr + token * stride_kt + h[:, None] * stride_kh + d[None, :], mask=mask)
    v = tl.load(value_ptr + token * stride_vt + h[:, None] * stride_vh + d[None, :], mask=mask)
    k_dst = block * stride_kcb + offset * stride_kcs + h[:, None] * stride_kch + d[None, :]
    v_dst = block * stride_vcb + offset * stride_vcs + h[:, None] * stride_vch + d[None, :]
    tl.store(key_cache_ptr + k_dst, k.to(key_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(value_cache_ptr + v_dst, v.to(value_cache_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _attend_tile(
    acc, m_i, l_i, q, q_pos, start_n, kv_end, seq_table_ptr, kv_head,
    key_cache_ptr, value_cache_ptr,
    stride_kcb, stride_kcs, stride_kch, stride_vcb, stride_vcs, stride_vch,
    d, d_valid, scale_log2,
    BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr,
):
    kv_pos = start_n + tl.arange(0, BLOCK_N)
    if MASKED:
        kv_valid = kv_pos < kv_end
        block = tl.load(seq_table_ptr + kv_pos // BLOCK_SIZE, mask=kv_valid, other=0)
    else:
        kv_valid = kv_pos >= 0
        block = tl.load(seq_table_ptr + kv_pos // BLOCK_SIZE)
    row = block.to(tl.int64)
    within = (kv_pos % BLOCK_SIZE).to(tl.int64)
    k_off = row * stride_kcb + within * stride_kcs + kv_head * stride_kch
    v_off = row * stride_vcb + within * stride_vcs + kv_head * stride_vch
    k = tl.load(key_cache_ptr + k_off[None, :] + d[:, None],
                mask=kv_valid[None, :] & d_valid[:, None], other=0.0)  # [HEAD_PAD, BLOCK_N]
    v = tl.load(value_cache_ptr + v_off[:, None] + d[None, :],
                mask=kv_valid[:, None] & d_valid[None, :], other=0.0)  # [BLOCK_N, HEAD_PAD]
    s = tl.dot(q, k) * scale_log2  # [BLOCK_M, BLOCK_N], log2 domain
    if MASKED:
        visible = (kv_pos[None, :] <= q_pos[:, None]) & kv_valid[None, :]
        s = tl.where(visible, s, float("-inf"))
    # Every row sees position 0 in the first tile, so m_new is finite from then on.
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return acc, m_new, l_i


@triton.jit
def _paged_attention_kernel(
    q_ptr, key_cache_ptr, value_cache_ptr, out_ptr,
    block_tables_ptr, query_start_ptr, seq_lens_ptr, scale_log2,
    stride_qt, stride_qh, stride_ot, stride_oh,
    stride_kcb, stride_kcs, stride_kch, stride_vcb, stride_vcs, stride_vch, stride_bt,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr, HEAD_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr,
):
    seq = tl.program_id(0)
    q_block = tl.program_id(1)
    kv_head = tl.program_id(2).to(tl.int64)
    q_lo = tl.load(query_start_ptr + seq)
    q_len = tl.load(query_start_ptr + seq + 1) - q_lo
    if q_block * BLOCK_Q >= q_len:
        return
    ctx_len = tl.load(seq_lens_ptr + seq)
    cached = ctx_len - q_len  # positions [0, cached) were in the cache before this step

    BLOCK_M: tl.constexpr = BLOCK_Q * GROUP_PAD
    rows = tl.arange(0, BLOCK_M)
    tok = q_block * BLOCK_Q + rows // GROUP_PAD  # query index within the sequence
    head_in_group = rows % GROUP_PAD
    row_valid = (tok < q_len) & (head_in_group < GROUP)
    head = kv_head * GROUP + head_in_group
    d = tl.arange(0, HEAD_PAD)
    d_valid = d < HEAD_DIM
    row_t = (q_lo + tok).to(tl.int64)
    io_mask = row_valid[:, None] & d_valid[None, :]
    q = tl.load(q_ptr + (row_t * stride_qt + head * stride_qh)[:, None] + d[None, :],
                mask=io_mask, other=0.0)
    q_pos = cached + tok  # absolute position of each row

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_PAD], dtype=tl.float32)
    seq_table_ptr = block_tables_ptr + seq.to(tl.int64) * stride_bt
    # [0, full_end): visible to every row of this program, no mask needed
    # [full_end, kv_end): the causal diagonal and the context's ragged end
    first_pos = cached + q_block * BLOCK_Q
    full_end = ((first_pos + 1) // BLOCK_N) * BLOCK_N
    kv_end = tl.minimum(ctx_len, first_pos + BLOCK_Q)
    for start_n in range(0, full_end, BLOCK_N):
        acc, m_i, l_i = _attend_tile(
            acc, m_i, l_i, q, q_pos, start_n, kv_end, seq_table_ptr, kv_head,
            key_cache_ptr, value_cache_ptr,
            stride_kcb, stride_kcs, stride_kch, stride_vcb, stride_vcs, stride_vch,
            d, d_valid, scale_log2, BLOCK_SIZE, BLOCK_N, False)
    for start_n in range(full_end, kv_end, BLOCK_N):
        acc, m_i, l_i = _attend_tile(
            acc, m_i, l_i, q, q_pos, start_n, kv_end, seq_table_ptr, kv_head,
            key_cache_ptr, value_cache_ptr,
            stride_kcb, stride_kcs, stride_kch, stride_vcb, stride_vcs, stride_vch,
            d, d_valid, scale_log2, BLOCK_SIZE, BLOCK_N, True)
    out = acc / l_i[:, None]
    tl.store(out_ptr + (row_t * stride_ot + head * stride_oh)[:, None] + d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=io_mask)


def _check_cache(key_cache: torch.Tensor, value_cache: torch.Tensor) -> None:
    if key_cache.dim() != 4 or key_cache.shape != value_cache.shape:
        raise ValueError(f"caches must be [NB, BS, Hkv, D] and alike, got "
                         f"{tuple(key_cache.shape)} and {tuple(value_cache.shape)}")
    if key_cache.stride(-1) != 1 or value_cache.stride(-1) != 1:
        raise ValueError("cache head_dim must be contiguous")
    if key_cache.dtype != value_cache.dtype:
        raise ValueError(f"cache dtypes differ: {key_cache.dtype} vs {value_cache.dtype}")


def store_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Same contract as ``engine.kernels.reference.store_kv``."""
    _check_cache(key_cache, value_cache)
    tokens, heads, dim = key.shape
    if value.shape != key.shape or tuple(key_cache.shape[2:]) != (heads, dim):
        raise ValueError(f"key {tuple(key.shape)} / value {tuple(value.shape)} do not fit "
                         f"cache {tuple(key_cache.shape)}")
    if key.stride(-1) != 1 or value.stride(-1) != 1:
        raise ValueError("key/value head_dim must be contiguous")
    if slot_mapping.shape != (tokens,) or slot_mapping.dtype != torch.int64:
        raise ValueError(f"slot_mapping must be int64 [{tokens}], got "
                         f"{slot_mapping.dtype} {tuple(slot_mapping.shape)}")
    if tokens == 0:
        return
    _store_kv_kernel[(tokens,)](
        key, value, key_cache, value_cache, slot_mapping,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        *key_cache.stride()[:3], *value_cache.stride()[:3],
        NUM_KV_HEADS=heads, HEADS_PAD=triton.next_power_of_2(heads),
        HEAD_DIM=dim, HEAD_PAD=triton.next_power_of_2(dim), BLOCK_SIZE=key_cache.shape[1],
    )


def _check_rows(tokens: int, meta: AttentionMetadata) -> None:
    """The kernel reads query rows up to the last sequence's end: fewer rows would be read
    past the tensor (garbage, or an illegal address on a GPU)."""
    if tokens < meta.query_start_host[-1]:
        raise ValueError(f"query has {tokens} rows but the metadata's sequences span "
                         f"{meta.query_start_host[-1]}")


def paged_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    *,
    block_m: int | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
) -> torch.Tensor:
    """Same contract as ``engine.kernels.reference.paged_attention``. ``block_m`` is the
    number of rows (tokens x padded group) per program; defaults suit a GPU."""
    _check_cache(key_cache, value_cache)
    tokens, num_heads, dim = query.shape
    num_kv_heads = key_cache.shape[2]
    if key_cache.shape[3] != dim or num_heads % num_kv_heads:
        raise ValueError(f"query {tuple(query.shape)} does not fit cache "
                         f"{tuple(key_cache.shape)}")
    if query.stride(-1) != 1:
        raise ValueError("query head_dim must be contiguous")
    _check_rows(tokens, meta)
    for name, t, dtype in (("block_tables", meta.block_tables, torch.int32),
                           ("query_start_loc", meta.query_start_loc, torch.int32),
                           ("seq_lens", meta.seq_lens, torch.int32)):
        if t.dtype != dtype or t.device != query.device:
            raise ValueError(f"{name} must be {dtype} on {query.device}, got {t.dtype} "
                             f"on {t.device}")
    if meta.block_tables.stride(-1) != 1:
        raise ValueError("block_tables rows must be contiguous")
    group = num_heads // num_kv_heads
    group_pad = triton.next_power_of_2(group)
    decode = meta.max_query_len == 1
    if block_m is None:
        block_m = 16 if decode else 128
    block_q = max(1, block_m // group_pad)
    if block_n is None:
        block_n = 64
    head_pad = max(16, triton.next_power_of_2(dim))
    # rows past the last sequence (padding) are never visited by a program
    padded = tokens > meta.query_start_host[-1]
    out = torch.zeros_like(query) if padded else torch.empty_like(query)
    grid = (meta.num_seqs, triton.cdiv(meta.max_query_len, block_q), num_kv_heads)
    if num_warps is None:
        num_warps = 4 if decode or block_m * head_pad <= 64 * 64 else 8
    _paged_attention_kernel[grid](
        query, key_cache, value_cache, out,
        meta.block_tables, meta.query_start_loc, meta.seq_lens, scale * math.log2(math.e),
        query.stride(0), query.stride(1), out.stride(0), out.stride(1),
        *key_cache.stride()[:3], *value_cache.stride()[:3], meta.block_tables.stride(0),
        GROUP=group, GROUP_PAD=group_pad, HEAD_DIM=dim, HEAD_PAD=head_pad,
        BLOCK_SIZE=key_cache.shape[1], BLOCK_Q=block_q, BLOCK_N=block_n, num_warps=num_warps,
    )
    return out
