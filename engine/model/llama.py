"""Llama-family decoder (Llama 2/3, Mistral, Qwen2) over a paged KV cache.

Parameter names follow Hugging Face checkpoints (``model.layers.N.self_attn.q_proj.weight``
...), so a checkpoint's state dict loads as is. Tokens of every sequence in a step are
packed on one axis; where each one's K/V goes and what it attends to is described by
``engine.kernels.AttentionMetadata``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine import kernels
from engine.model.config import ModelConfig
from engine.model.rope import apply_rotary, cos_sin, inverse_frequencies

KVCache = tuple[torch.Tensor, torch.Tensor]  # key, value: [num_blocks, block_size, Hkv, D]


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, backend: str) -> None:
        super().__init__()
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        self.scale = config.head_dim ** -0.5
        self.backend = backend
        q_size, kv_size = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
        self.q_proj = nn.Linear(config.hidden_size, q_size, bias=config.qkv_bias)
        self.k_proj = nn.Linear(config.hidden_size, kv_size, bias=config.qkv_bias)
        self.v_proj = nn.Linear(config.hidden_size, kv_size, bias=config.qkv_bias)
        self.o_proj = nn.Linear(q_size, config.hidden_size, bias=config.o_bias)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                cache: KVCache, meta: kernels.AttentionMetadata) -> torch.Tensor:
        tokens = x.shape[0]
        q = self.q_proj(x).view(tokens, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(tokens, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(tokens, self.num_kv_heads, self.head_dim)
        q = apply_rotary(q, cos, sin).contiguous()
        k = apply_rotary(k, cos, sin).contiguous()
        kernels.store_kv(k, v.contiguous(), cache[0], cache[1], meta.slot_mapping,
                         self.backend)
        out = kernels.paged_attention(q, cache[0], cache[1], meta, self.scale, self.backend)
        return self.o_proj(out.reshape(tokens, self.num_heads * self.head_dim))


class MLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        hidden, inner, bias = config.hidden_size, config.intermediate_size, config.mlp_bias
        self.gate_proj = nn.Linear(hidden, inner, bias=bias)
        self.up_proj = nn.Linear(hidden, inner, bias=bias)
        self.down_proj = nn.Linear(inner, hidden, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, backend: str) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, backend)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                cache: KVCache, meta: kernels.AttentionMetadata) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, cache, meta)
        return x + self.mlp(self.post_attention_layernorm(x))


class DecoderStack(nn.Module):
    def __init__(self, config: ModelConfig, backend: str) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, backend)
                                    for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class CausalLM(nn.Module):
    """``forward`` returns final hidden states ``[T, hidden]``; ``logits`` projects the
    rows that need a next token."""

    inv_freq: torch.Tensor

    def __init__(self, config: ModelConfig, backend: str = "auto") -> None:
        super().__init__()
        if backend not in kernels.BACKENDS:
            raise ValueError(f"unknown kernel backend {backend!r}; expected one of "
                             f"{kernels.BACKENDS}")
        self.config = config
        self.model = DecoderStack(config, backend)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.register_buffer("inv_freq", inverse_frequencies(config.rope, config.head_dim),
                             persistent=False)
        self.tie_weights()

    def tie_weights(self) -> None:
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                caches: list[KVCache], meta: kernels.AttentionMetadata) -> torch.Tensor:
        if len(caches) != len(self.model.layers):
            raise ValueError(f"{len(caches)} caches for {len(self.model.layers)} layers")
        x = self.model.embed_tokens(input_ids)
        cos, sin = cos_sin(self.inv_freq, positions, x.dtype)
        for layer, cache in zip(self.model.layers, caches, strict=True):
            x = layer(x, cos, sin, cache, meta)
        return self.model.norm(x)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()
