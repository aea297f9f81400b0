"""Torch implementations of the KV store and paged attention.

They are the oracle the Triton kernels are tested against and the path the model takes on
CPU. Same arguments and layouts as ``engine.kernels.triton_ops``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.kernels.metadata import AttentionMetadata


def store_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write ``key``/``value`` ``[T, Hkv, D]`` into caches ``[NB, BS, Hkv, D]`` at
    ``slot_mapping`` ``[T]``; rows whose slot is -1 are skipped."""
    num_blocks, block_size, heads, dim = key_cache.shape
    valid = slot_mapping >= 0
    slots = slot_mapping[valid]
    key_cache.view(num_blocks * block_size, heads, dim)[slots] = key[valid].to(key_cache.dtype)
    value_cache.view(num_blocks * block_size, heads, dim)[slots] = value[valid].to(
        value_cache.dtype)


def gather_kv(cache: torch.Tensor, block_ids: torch.Tensor, length: int) -> torch.Tensor:
    """Positions ``[0, length)`` of one sequence as a contiguous ``[length, Hkv, D]``."""
    block_size = cache.shape[1]
    num_blocks = -(-length // block_size)
    blocks = cache[block_ids[:num_blocks].long()]
    return blocks.reshape(num_blocks * block_size, *cache.shape[2:])[:length]


def paged_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
) -> torch.Tensor:
    """Causal attention of ``query`` ``[T, H, D]`` over each sequence's cached context.

    Returns ``[T, H, D]``; rows outside every sequence's query range stay zero."""
    if query.shape[0] < meta.query_start_host[-1]:
        raise ValueError(f"query has {query.shape[0]} rows but the metadata's sequences "
                         f"span {meta.query_start_host[-1]}")
    out = torch.zeros_like(query)
    num_heads = query.shape[1]
    num_kv_heads = key_cache.shape[2]
    group = num_heads // num_kv_heads
    for i in range(meta.num_seqs):
        q_lo, q_hi = meta.query_start_host[i], meta.query_start_host[i + 1]
        ctx = meta.seq_lens_host[i]
        q_len = q_hi - q_lo
        # query row j sits at absolute position (ctx - q_len + j) and sees [0, that]
        k = gather_kv(key_cache, meta.block_tables[i], ctx)
        v = gather_kv(value_cache, meta.block_tables[i], ctx)
        q = query[q_lo:q_hi].transpose(0, 1)  # [H, q_len, D]
        k = k.transpose(0, 1).repeat_interleave(group, dim=0).to(q.dtype)  # [H, ctx, D]
        v = v.transpose(0, 1).repeat_interleave(group, dim=0).to(q.dtype)
        if q_len == ctx:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
        else:
            q_pos = torch.arange(ctx - q_len, ctx, device=q.device)
            mask = torch.arange(ctx, device=q.device)[None, :] <= q_pos[:, None]
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
        out[q_lo:q_hi] = o.transpose(0, 1)
    return out


def naive_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
) -> torch.Tensor:
    """Explicit-softmax version in float64: the oracle for both other paths."""
    out = torch.zeros(query.shape, dtype=torch.float64, device=query.device)
    group = query.shape[1] // key_cache.shape[2]
    for i in range(meta.num_seqs):
        q_lo, q_hi = meta.query_start_host[i], meta.query_start_host[i + 1]
        ctx = meta.seq_lens_host[i]
        k = gather_kv(key_cache, meta.block_tables[i], ctx).double()
        v = gather_kv(value_cache, meta.block_tables[i], ctx).double()
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
        q = query[q_lo:q_hi].double()
        scores = torch.einsum("qhd,khd->hqk", q, k) * scale
        q_pos = torch.arange(ctx - (q_hi - q_lo), ctx, device=q.device)
        visible = torch.arange(ctx, device=q.device)[None, :] <= q_pos[:, None]
        scores = scores.masked_fill(~visible, float("-inf"))
        out[q_lo:q_hi] = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)
    return out.to(query.dtype)
