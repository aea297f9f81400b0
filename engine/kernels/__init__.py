"""Paged KV cache kernels: Triton on CUDA, torch elsewhere.

``backend`` is ``"auto"`` (Triton for CUDA tensors, torch otherwise), ``"triton"`` (also on
CPU, which needs ``TRITON_INTERPRET=1`` set before triton is first imported) or ``"torch"``.
"""

from __future__ import annotations

from typing import Literal

import torch

from engine.kernels import reference
from engine.kernels.metadata import AttentionMetadata, build_metadata

Backend = Literal["auto", "triton", "torch"]
BACKENDS: tuple[str, ...] = ("auto", "triton", "torch")

__all__ = ["BACKENDS", "AttentionMetadata", "Backend", "build_metadata", "paged_attention",
           "store_kv"]


def _use_triton(backend: str, tensor: torch.Tensor) -> bool:
    if backend not in BACKENDS:
        raise ValueError(f"unknown kernel backend {backend!r}; expected one of {BACKENDS}")
    return backend == "triton" or (backend == "auto" and tensor.is_cuda)


def store_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    backend: str = "auto",
) -> None:
    if _use_triton(backend, key):
        from engine.kernels import triton_ops

        triton_ops.store_kv(key, value, key_cache, value_cache, slot_mapping)
    else:
        reference.store_kv(key, value, key_cache, value_cache, slot_mapping)


def paged_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    backend: str = "auto",
) -> torch.Tensor:
    if _use_triton(backend, query):
        from engine.kernels import triton_ops

        if query.is_cuda:
            return triton_ops.paged_attention(query, key_cache, value_cache, meta, scale)
        # interpreter: small tiles keep it quick
        return triton_ops.paged_attention(query, key_cache, value_cache, meta, scale,
                                          block_m=16, block_n=16)
    return reference.paged_attention(query, key_cache, value_cache, meta, scale)
