"""Tiny random Llama / Qwen2 checkpoints built with ``transformers``, shared by tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

VOCAB = 256

ARCH_CONFIGS: dict[str, dict[str, Any]] = {
    # Llama 3 style: GQA 2, untied head, llama3 rope scaling; with head_dim 16, theta 1e4
    # and an original context of 32 the frequencies fall in all three bands (kept, blended,
    # divided by the factor)
    "llama": dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, vocab_size=VOCAB,
                  max_position_embeddings=512, rms_norm_eps=1e-5, tie_word_embeddings=False,
                  rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                "high_freq_factor": 4.0,
                                "original_max_position_embeddings": 32},
                  rope_theta=10000.0, eos_token_id=[1, 2]),
    # Qwen2 style: GQA 4, tied embeddings, q/k/v bias
    "qwen2": dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=1, vocab_size=VOCAB,
                  max_position_embeddings=512, rms_norm_eps=1e-6, tie_word_embeddings=True,
                  rope_theta=10000.0, eos_token_id=3),
}


def build_hf_model(arch: str, out_dir: Path, seed: int = 0) -> torch.nn.Module:
    """A random fp32 model, saved to ``out_dir`` as config.json + model.safetensors."""
    import transformers

    cls_name, cfg_name = {"llama": ("LlamaForCausalLM", "LlamaConfig"),
                          "qwen2": ("Qwen2ForCausalLM", "Qwen2Config")}[arch]
    config = getattr(transformers, cfg_name)(**ARCH_CONFIGS[arch])
    torch.manual_seed(seed)
    model = getattr(transformers, cls_name)(config).eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=gen) * 0.1
            param.copy_(1.0 + noise if "norm" in name else noise)
    model.save_pretrained(out_dir)
    return model
