"""The torch executor's model against a float64 reference written here from the formulas
(RMSNorm, rotary embedding with its scalings, grouped-query causal attention, gated MLP),
on checkpoints written here tensor by tensor: biases, tied heads, a head_dim other than
hidden / heads, rope scalings and theta, norm eps, half-precision weights; and a prompt
computed whole, in chunks and half from cached blocks gives the same logits."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from engine.executor import SeqWork
from engine.executors.torch_executor import TorchExecutor
from engine.model.loader import load_model

VOCAB = 64
BLOCK = 4

BASE: dict[str, Any] = {
    "vocab_size": VOCAB, "hidden_size": 32, "intermediate_size": 48,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "max_position_embeddings": 256, "hidden_act": "silu",
}

CONFIGS: dict[str, dict[str, Any]] = {
    # GQA 4:1, head_dim 24 (hidden / heads would be 8), biases on q/k/v/o and the MLP,
    # linear rope, a large eps that shows if it is misplaced
    "llama_bias_head_dim_linear": dict(
        architectures=["LlamaForCausalLM"], num_key_value_heads=1, head_dim=24,
        attention_bias=True, mlp_bias=True, rms_norm_eps=0.3, rope_theta=1000.0,
        rope_scaling={"type": "linear", "factor": 3.0}, tie_word_embeddings=False),
    # Llama 3 scaling with an original context of 16: all three frequency bands in use
    "llama3_tied": dict(
        architectures=["LlamaForCausalLM"], rms_norm_eps=1e-5, rope_theta=500.0,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 16},
        tie_word_embeddings=True),
    # Qwen2: q/k/v bias (no o bias), tied, rope_theta in the newer rope_parameters
    "qwen2_newer_layout": dict(
        architectures=["Qwen2ForCausalLM"], rms_norm_eps=0.1, tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 77.0}),
    "mistral_mha": dict(
        architectures=["MistralForCausalLM"], num_key_value_heads=4, rms_norm_eps=1e-6,
        rope_theta=10000.0, sliding_window=None),
}


def _shapes(cfg: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    h, inner = cfg["hidden_size"], cfg["intermediate_size"]
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d = cfg.get("head_dim") or h // heads
    qwen = cfg["architectures"][0] == "Qwen2ForCausalLM"
    attn_bias, mlp_bias = cfg.get("attention_bias", False), cfg.get("mlp_bias", False)
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (VOCAB, h),
                                          "model.norm.weight": (h,)}
    if not cfg.get("tie_word_embeddings", False):
        shapes["lm_head.weight"] = (VOCAB, h)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes |= {p + "input_layernorm.weight": (h,),
                   p + "post_attention_layernorm.weight": (h,)}
        for name, out, inp in (("q", heads * d, h), ("k", kv * d, h), ("v", kv * d, h),
                               ("o", h, heads * d)):
            shapes[f"{p}self_attn.{name}_proj.weight"] = (out, inp)
            if attn_bias or (qwen and name != "o"):
                shapes[f"{p}self_attn.{name}_proj.bias"] = (out,)
        for name, out, inp in (("gate", inner, h), ("up", inner, h), ("down", h, inner)):
            shapes[f"{p}mlp.{name}_proj.weight"] = (out, inp)
            if mlp_bias:
                shapes[f"{p}mlp.{name}_proj.bias"] = (out,)
    return shapes


def write_checkpoint(out: Path, cfg: dict[str, Any], dtype: torch.dtype = torch.float32,
                     seed: int = 0) -> dict[str, torch.Tensor]:
    """config.json + model.safetensors of random weights; returns the weights as saved."""
    out.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(seed)
    weights = {}
    for name, shape in _shapes(cfg).items():
        noise = torch.randn(shape, generator=gen) * 0.2
        weights[name] = (1.0 + noise if "norm" in name else noise).to(dtype)
    (out / "config.json").write_text(json.dumps({**cfg, "torch_dtype": str(dtype)[6:]}))
    save_file(weights, str(out / "model.safetensors"))
    return weights


def _inv_freq(cfg: dict[str, Any], d: int) -> list[float]:
    rope = {**(cfg.get("rope_parameters") or {}), **(cfg.get("rope_scaling") or {})}
    theta = rope.get("rope_theta", cfg.get("rope_theta", 10000.0))
    kind = rope.get("rope_type", rope.get("type", "default"))
    out = []
    for i in range(d // 2):
        f = theta ** (-2 * i / d)
        if kind == "linear":
            f /= rope["factor"]
        elif kind == "llama3":
            old, low, high = (rope["original_max_position_embeddings"],
                              rope["low_freq_factor"], rope["high_freq_factor"])
            wavelen = 2 * math.pi / f
            if wavelen > old / low:
                f /= rope["factor"]
            elif wavelen >= old / high:
                smooth = (old / wavelen - low) / (high - low)
                f = (1 - smooth) * f / rope["factor"] + smooth * f
        out.append(f)
    return out


def reference_logits(cfg: dict[str, Any], w: dict[str, torch.Tensor], ids: list[int]
                     ) -> torch.Tensor:
    """Every position's logits, in float64, straight from the formulas."""
    w = {k: v.double() for k, v in w.items()}
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d = cfg.get("head_dim") or cfg["hidden_size"] // heads
    eps = cfg.get("rms_norm_eps", 1e-6)
    n = len(ids)

    def norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return weight * x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)

    def linear(x: torch.Tensor, name: str) -> torch.Tensor:
        y = x @ w[name + ".weight"].T
        return y + w[name + ".bias"] if name + ".bias" in w else y

    angles = torch.tensor([[p * f for f in _inv_freq(cfg, d)] for p in range(n)],
                          dtype=torch.float64)  # [n, d/2]
    cos, sin = angles.cos(), angles.sin()

    def rotate(x: torch.Tensor) -> torch.Tensor:  # pairs (x[i], x[i + d/2])
        a, b = x[..., : d // 2], x[..., d // 2:]
        c, s = cos[:, None, :], sin[:, None, :]
        return torch.cat((a * c - b * s, b * c + a * s), dim=-1)

    x = w["model.embed_tokens.weight"][ids]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = norm(x, w[p + "input_layernorm.weight"])
        q = rotate(linear(h, p + "self_attn.q_proj").view(n, heads, d))
        k = rotate(linear(h, p + "self_attn.k_proj").view(n, kv, d))
        v = linear(h, p + "self_attn.v_proj").view(n, kv, d)
        out = torch.zeros(n, heads, d, dtype=torch.float64)
        future = torch.ones(n, n, dtype=torch.bool).triu(1)  # [t, s]: s > t is hidden
        for head in range(heads):
            g = head * kv // heads  # the KV head this query head shares
            scores = (q[:, head] @ k[:, g].T / math.sqrt(d)).masked_fill(future, -math.inf)
            out[:, head] = scores.softmax(-1) @ v[:, g]
        x = x + linear(out.reshape(n, heads * d), p + "self_attn.o_proj")
        h = norm(x, w[p + "post_attention_layernorm.weight"])
        gate = linear(h, p + "mlp.gate_proj")
        x = x + linear(gate * torch.sigmoid(gate) * linear(h, p + "mlp.up_proj"),
                       p + "mlp.down_proj")
    x = norm(x, w["model.norm.weight"])
    tied = cfg.get("tie_word_embeddings", False)
    return x @ w["model.embed_tokens.weight" if tied else "lm_head.weight"].T


def _config(name: str) -> dict[str, Any]:
    return {**BASE, **CONFIGS[name]}


def _blocks(first: int, n_tokens: int) -> list[int]:
    return list(range(first, first + -(-n_tokens // BLOCK)))


PROMPT = [3, 17, 42, 9, 60, 1, 33, 33, 12, 50, 7, 28, 45, 2, 19, 63, 30, 8, 21]


@pytest.mark.parametrize("name", list(CONFIGS))
def test_logits_match_the_formulas(name: str, tmp_path: Path) -> None:
    cfg = _config(name)
    weights = write_checkpoint(tmp_path, cfg)
    ex = TorchExecutor(load_model(tmp_path, backend="torch"), num_blocks=16, block_size=BLOCK)
    got = ex.last_logits([SeqWork("a", PROMPT, 0, _blocks(0, len(PROMPT)), True)],
                         all_positions=True)
    torch.testing.assert_close(got.double(), reference_logits(cfg, weights, PROMPT),
                               atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_chunked_and_prefix_hit_prefill_match_the_formulas(backend: str, tmp_path: Path
                                                           ) -> None:
    cfg = _config("llama_bias_head_dim_linear")
    weights = write_checkpoint(tmp_path, cfg)
    ref = reference_logits(cfg, weights, PROMPT)
    ex = TorchExecutor(load_model(tmp_path, backend=backend), num_blocks=24, block_size=BLOCK)
    n = len(PROMPT)
    # chunks of 5 that end mid-block; every chunk's rows are the reference's rows
    rows = []
    for lo in range(0, n, 5):
        rows.append(ex.last_logits([SeqWork("c", PROMPT[lo:lo + 5], lo, _blocks(0, n),
                                            lo + 5 >= n)], all_positions=True))
    torch.testing.assert_close(torch.cat(rows).double(), ref, atol=1e-4, rtol=1e-4)
    # the first 8 positions from blocks the chunked request left, the rest computed anew
    # in blocks of its own, batched with a decode step of another sequence
    hit = ex.last_logits([SeqWork("h", PROMPT[8:], 8, _blocks(0, 8) + _blocks(10, n - 8),
                                  True),
                          SeqWork("d", PROMPT[n - 1:], n - 1, _blocks(0, n), True)])
    torch.testing.assert_close(hit.double(), ref[[n - 1, n - 1]], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_checkpoints(dtype: torch.dtype, tmp_path: Path) -> None:
    cfg = _config("qwen2_newer_layout")
    weights = write_checkpoint(tmp_path, cfg, dtype=dtype)
    ref = reference_logits(cfg, weights, PROMPT)  # of the weights as stored
    blocks = _blocks(0, len(PROMPT))
    # on the CPU the checkpoint is computed in float32 unless a dtype is asked for
    model = load_model(tmp_path, backend="torch")
    assert next(model.parameters()).dtype == torch.float32
    got = TorchExecutor(model, num_blocks=8, block_size=BLOCK).last_logits(
        [SeqWork("a", PROMPT, 0, blocks, True)], all_positions=True)
    torch.testing.assert_close(got.double(), ref, atol=1e-4, rtol=1e-4)
    half = TorchExecutor(load_model(tmp_path, backend="torch", dtype=dtype), num_blocks=8,
                         block_size=BLOCK)
    assert half.kv_caches[0][0].dtype == dtype
    got = half.last_logits([SeqWork("a", PROMPT, 0, blocks, True)], all_positions=True)
    torch.testing.assert_close(got.double(), ref, atol=0.1, rtol=0.05)


@pytest.mark.parametrize("token", [VOCAB, -1])
def test_a_token_outside_the_models_vocabulary_is_named(token: int, tmp_path: Path) -> None:
    write_checkpoint(tmp_path, _config("mistral_mha"))
    ex = TorchExecutor(load_model(tmp_path, backend="torch"), num_blocks=8, block_size=BLOCK)
    with pytest.raises(ValueError, match=rf"request x: token id {token} is outside the "
                                         rf"model's vocabulary \[0, {VOCAB}\)"):
        ex.last_logits([SeqWork("x", [1, token, 2], 0, _blocks(0, 3), True)])
    ok = ex.last_logits([SeqWork("y", PROMPT, 0, _blocks(0, len(PROMPT)), True)])
    assert ok.shape == (1, VOCAB) and bool(torch.isfinite(ok).all())
